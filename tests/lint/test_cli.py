"""The ``replaylint`` command as users run it: real subprocesses, both the console script and
``python -m replaylint``. Exit codes, the default path, stdin, ``--fix`` and ``--diff`` end to
end. Option details are tested in-process in test_cli_options.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from replaylint import __version__

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]
RunCliBytes = Callable[..., "subprocess.CompletedProcess[bytes]"]

BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
FIXED = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.float32)\n"
CLEAN = "import torch\nd_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
# Where RL001 points in BUGGY: the dtype expression `torch.bfloat16`.
HEADLINE = "a.py:2:36: RL001 [*] gate cache `g_cache` is allocated as torch.bfloat16"


@pytest.fixture
def buggy(project: Path) -> Path:
    path = project / "a.py"
    path.write_text(BUGGY)
    return path


@pytest.mark.parametrize("program", ["module", "script"])
def test_findings_exit_1_and_both_entry_points_agree(
    run: RunCli, buggy: Path, program: str
) -> None:
    done = run("--select", "RL001", "a.py", program=program)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith(HEADLINE)
    assert "Found 1 error.\n[*] 1 fixable with the `--fix` option.\n" in done.stdout
    assert done.stderr == ""


@pytest.mark.parametrize("program", ["module", "script"])
def test_version(run: RunCli, program: str) -> None:
    done = run("--version", program=program)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"replaylint {__version__}\n", "")


def test_default_path_is_the_working_directory(run: RunCli, project: Path) -> None:
    (project / "pkg").mkdir()
    (project / "pkg" / "a.py").write_text(BUGGY)
    done = run("--select", "RL001", "--output-format", "concise")
    assert done.returncode == 1
    assert done.stdout.startswith(f"pkg{os.sep}{HEADLINE}")


def test_usage_error_exits_2(run: RunCli, buggy: Path) -> None:
    done = run("--no-such-option", "a.py")
    assert done.returncode == 2
    assert "unrecognized arguments: --no-such-option" in done.stderr
    assert done.stdout == ""


def test_fix_then_recheck(run: RunCli, buggy: Path) -> None:
    done = run("--fix", "--select", "RL001", "a.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Found 1 error (1 fixed, 0 remaining).\n"
    assert buggy.read_text() == FIXED
    again = run("--select", "RL001", "a.py")
    assert (again.returncode, again.stdout) == (0, "All checks passed!\n")


def test_diff_prints_the_patch_and_writes_nothing(run: RunCli, buggy: Path) -> None:
    before = buggy.read_bytes()
    os.utime(buggy, ns=(1_000_000_000, 1_000_000_000))  # a distinct, known mtime
    stamp = buggy.stat().st_mtime_ns
    done = run("--diff", "--select", "RL001", "a.py")
    assert done.returncode == 1  # there is something to fix
    assert done.stdout == (
        "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n import torch\n"
        "-g_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
        "+g_cache = torch.zeros(4, 16, dtype=torch.float32)\n"
    )
    assert done.stderr == "Would fix 1 error in 1 file.\n"
    assert buggy.read_bytes() == before
    assert buggy.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in buggy.parent.iterdir() if p.name != ".replaylint_cache") == [
        "a.py"
    ]


def test_bad_file_exits_2_and_the_others_are_still_reported(run: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    (project / "broken.py").write_text("g_cache = (\n")
    done = run("--select", "RL001", ".")
    assert done.returncode == 2
    assert done.stdout.startswith(HEADLINE)
    [error] = done.stderr.splitlines()
    assert error.startswith("error: broken.py:1:11: syntax error: ")


# stdin -------------------------------------------------------------------------------------------


def test_stdin_fix_prints_the_fixed_source(run: RunCli) -> None:
    done = run("-", "--fix", "--stdin-filename", "a.py", "--select", "RL001", stdin=BUGGY.encode())
    assert done.returncode == 0
    assert done.stdout == FIXED
    assert done.stderr == "Found 1 error (1 fixed, 0 remaining).\n"


def test_stdin_fix_keeps_encoding_bom_and_line_endings(run_bytes: RunCliBytes) -> None:
    latin1 = b"# -*- coding: latin-1 -*-\r\nimport torch\r\n# caf\xe9\r\n" + (
        b"g_cache = torch.zeros(4, dtype=torch.bfloat16)\r\n"
    )
    bom = b"\xef\xbb\xbf" + BUGGY.encode()
    for source in (latin1, bom):
        done = run_bytes("-", "--fix", "--select", "RL001", stdin=source)
        assert done.returncode == 0, done.stderr
        assert done.stdout == source.replace(b"bfloat16", b"float32")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (b"g_cache = (\n", "error: a.py:1:11: syntax error: "),
        (b"x = '\xff\xfe'\n", "error: a.py: is not valid utf-8 text (line 1, byte 5)"),
    ],
    ids=["syntax-error", "not-utf8"],
)
def test_stdin_fix_with_bad_input_echoes_it_unchanged(
    run_bytes: RunCliBytes, source: bytes, message: str
) -> None:
    # An editor replaces its buffer with stdout: it must get the input back, not nothing.
    done = run_bytes("-", "--fix", "--stdin-filename", "a.py", stdin=source)
    assert done.returncode == 2
    assert done.stdout == source
    assert done.stderr.decode().startswith(message)


def test_examples_show_findings_and_fix_clean(run: RunCli, project: Path) -> None:
    # What the README promises: `replaylint examples/` exits 1 and shows the findings, and
    # `replaylint --fix` on a copy leaves nothing to report.
    examples = Path(__file__).resolve().parents[2] / "examples"
    shutil.copytree(examples, project / "examples")
    checked = run("examples")
    assert checked.returncode == 1, checked.stderr
    assert "RL001" in checked.stdout
    fixed = run("--fix", "examples")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    again = run("examples")
    assert (again.returncode, again.stdout, again.stderr) == (0, "All checks passed!\n", "")
