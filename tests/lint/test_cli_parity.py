"""The options a ruff user expects, each run as a real ``python -m replaylint`` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
FIXED = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.float32)\n"
CLEAN = "import torch\nd_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
UNFIXABLE = """\
import torch

def run(shape, device):
    gates = torch.zeros(shape, dtype=torch.bfloat16, device=device)
    kda_replayssm_decode(mixed_qkv, a, b, A_log, dt_bias, 0.125, h0, gates, k, gates, out)
"""
BROKEN = "import torch\ndef (g_cache:\n"
MODULE = [sys.executable, "-m", "replaylint"]
HEADLINE = "a.py:2:36: RL001 [*] gate cache `g_cache` is allocated as torch.bfloat16"


@pytest.fixture
def buggy(project: Path) -> Path:
    path = project / "a.py"
    path.write_text(BUGGY)
    return path


def test_output_file_takes_the_report_and_the_summary(run: RunCli, buggy: Path) -> None:
    done = run("-o", "reports/out.txt", "--select", "RL001", "a.py")
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")
    written = (buggy.parent / "reports" / "out.txt").read_text()
    assert written.startswith(HEADLINE)
    assert written.endswith("Found 1 error.\n[*] 1 fixable with the `--fix` option.\n")
    long = run("--output-file", "out.json", "--output-format", "json", "a.py")
    assert long.stdout == ""
    assert json.loads((buggy.parent / "out.json").read_text())[0]["code"] == "RL001"


def test_output_file_that_cannot_be_written(run: RunCli, buggy: Path) -> None:
    (buggy.parent / "taken").write_text("a file, not a folder")
    done = run("-o", "taken/out.txt", "a.py")
    assert done.returncode == 2
    assert "cannot write the report to taken/out.txt" in done.stderr


def test_quiet_prints_findings_without_the_summary(run: RunCli, buggy: Path) -> None:
    done = run("-q", "--output-format", "concise", "--select", "RL001", "a.py")
    assert (done.returncode, done.stderr) == (1, "")
    [line] = done.stdout.splitlines()
    assert line.startswith(HEADLINE)
    (buggy.parent / "b.py").write_text(CLEAN)
    clean = run("--quiet", "b.py")
    assert (clean.returncode, clean.stdout) == (0, "")


def test_verbose_says_what_the_run_did(run: RunCli, buggy: Path) -> None:
    (buggy.parent / "pyproject.toml").write_text('[tool.replaylint]\nselect = ["RL001"]\n')
    done = run("-v", "--no-cache", "a.py")
    assert done.returncode == 1
    assert f"configuration {buggy.parent / 'pyproject.toml'}" in done.stderr
    assert "1 file linted in" in done.stderr
    assert "result cache off" in done.stderr
    assert done.stdout.startswith(HEADLINE)
    both = run("-q", "-v", "a.py")
    assert both.returncode == 2  # argparse: not allowed with each other


def test_show_settings(run: RunCli, project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.replaylint]\nignore = ["RL003"]\nextend-exclude = ["gen"]\n'
    )
    done = run("--show-settings", "--extend-exclude", "vendored,third", "--ignore", "RL004")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert f"configuration file: {project / 'pyproject.toml'}" in lines
    enabled = next(line for line in lines if line.startswith("enabled rules: "))
    assert "RL001" in enabled
    assert "RL003" not in enabled
    assert "RL004" not in enabled
    assert "extend-exclude: ('gen', 'vendored', 'third')" in lines
    assert f"root: {project}" in lines


def test_show_files_honours_excludes(run: RunCli, project: Path) -> None:
    for name in ("a.py", "gen/b.py", "keep/c.pyi", "keep/notes.txt"):
        (project / name).parent.mkdir(exist_ok=True)
        (project / name).write_text(BUGGY)
    done = run("--show-files", "--extend-exclude", "gen")
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["a.py", "keep/c.pyi"]


def test_extend_exclude_on_the_command_line(run: RunCli, project: Path) -> None:
    for name in ("a.py", "gen/b.py"):
        (project / name).parent.mkdir(exist_ok=True)
        (project / name).write_text(BUGGY)
    done = run("--output-format", "json", "--extend-exclude", "gen", ".")
    assert [Path(f["filename"]).name for f in json.loads(done.stdout)] == ["a.py"]


def test_per_file_ignores_on_the_command_line(run: RunCli, project: Path) -> None:
    (project / "tests").mkdir()
    (project / "tests" / "t.py").write_text(BUGGY)
    (project / "a.py").write_text(BUGGY)
    (project / "pyproject.toml").write_text(
        '[tool.replaylint]\nper-file-ignores = { "a.py" = ["RL001"] }\n'
    )
    done = run("--output-format", "json", "--per-file-ignores", "tests/*:RL001", ".")
    # The command line replaces the configured table, as ruff's option does.
    assert [Path(f["filename"]).name for f in json.loads(done.stdout)] == ["a.py"]
    bad = run("--per-file-ignores", "tests/*", ".")
    assert bad.returncode == 2
    assert "expected PATTERN:CODES" in bad.stderr
    unknown = run("--per-file-ignores", "tests/*:XX9", ".")
    assert unknown.returncode == 2
    assert "unknown rule selector `XX9`" in unknown.stderr


def test_color(run: RunCli, buggy: Path) -> None:
    plain = run("--select", "RL001", "a.py")
    assert "\x1b[" not in plain.stdout  # a pipe is not a terminal
    coloured = run("--color", "always", "--select", "RL001", "a.py")
    assert "\x1b[1m\x1b[31mRL001\x1b[0m" in coloured.stdout
    stripped = coloured.stdout
    for code in ("\x1b[1m", "\x1b[31m", "\x1b[36m", "\x1b[34m", "\x1b[0m"):
        stripped = stripped.replace(code, "")
    assert stripped == plain.stdout
    never = run("--color", "never", "--output-format", "concise", "a.py")
    assert "\x1b[" not in never.stdout
    machine = run("--color", "always", "--output-format", "json", "a.py")
    assert "\x1b[" not in machine.stdout


def test_colour_on_a_terminal_unless_no_color(project: Path, buggy: Path) -> None:
    import pty

    def on_a_terminal(env: dict[str, str]) -> str:
        leader, follower = pty.openpty()
        with subprocess.Popen(
            [*MODULE, "--select", "RL001", "a.py"],
            cwd=project,
            stdout=follower,
            stderr=subprocess.DEVNULL,
            env=env,
        ) as process:
            os.close(follower)
            chunks = []
            while True:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the terminal closed
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            process.wait(timeout=120)
        os.close(leader)
        return b"".join(chunks).decode()

    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["PYTHONPATH"] = root
    assert "\x1b[31m" in on_a_terminal(env)
    assert "\x1b[" not in on_a_terminal({**env, "NO_COLOR": "1"})


def test_fix_only_fixes_and_reports_nothing_else(run: RunCli, buggy: Path) -> None:
    (buggy.parent / "b.py").write_text("import torch\ng_cache = torch.zeros(4, dtype=dtype)\n")
    done = run("--fix-only", "--select", "RL001", ".")
    assert (done.returncode, done.stdout) == (0, "Fixed 1 error.\n")
    assert buggy.read_text() == FIXED
    # RL007 has no fix: its finding stays, and --fix-only neither reports it nor fails on it.
    (buggy.parent / "b.py").write_text(UNFIXABLE)
    assert run("--select", "RL007", "b.py").returncode == 1
    again = run("--fix-only", "--select", "RL007", "b.py")
    assert (again.returncode, again.stdout, again.stderr) == (0, "No errors fixed.\n", "")
    as_json = run("--fix-only", "--select", "RL007", "--output-format", "json", "b.py")
    assert (as_json.returncode, json.loads(as_json.stdout)) == (0, [])
    refused = run("--fix-only", "--diff", ".")
    assert refused.returncode == 2
    assert "choose one" in refused.stderr


def test_isolated_ignores_the_configuration(run: RunCli, buggy: Path) -> None:
    (buggy.parent / "pyproject.toml").write_text('[tool.replaylint]\nignore = ["RL001"]\n')
    assert run("a.py").returncode == 0
    isolated = run("--isolated", "a.py")
    assert isolated.returncode == 1
    assert isolated.stdout.startswith(HEADLINE)
    both = run("--isolated", "--config", "pyproject.toml", "a.py")
    assert both.returncode == 2
    assert "drop --config or --isolated" in both.stderr


def test_full_is_the_text_format(run: RunCli, buggy: Path) -> None:
    assert run("--output-format", "full", "a.py").stdout == run("a.py").stdout


def test_abbreviated_options_are_rejected(run: RunCli, buggy: Path) -> None:
    for abbreviated in ("--out", "--stat", "--unsafe"):
        done = run(abbreviated, "a.py")
        assert done.returncode == 2, abbreviated
        assert "unrecognized arguments" in done.stderr or "invalid choice" in done.stderr


def test_statistics_refuses_a_format_it_cannot_print(run: RunCli, buggy: Path) -> None:
    done = run("--statistics", "--output-format", "sarif", "a.py")
    assert done.returncode == 2
    assert "--statistics prints text or json, not `sarif`" in done.stderr
    as_json = run("--statistics", "--output-format", "json", "--select", "RL001", "a.py")
    assert json.loads(as_json.stdout)[0]["count"] == 1


# files that cannot be linted, in every format ----------------------------------------------------


@pytest.fixture
def broken(buggy: Path) -> Path:
    path = buggy.parent / "broken.py"
    path.write_text(BROKEN)
    return path


def test_json_error_entries(run: RunCli, broken: Path) -> None:
    done = run("--output-format", "json", "--select", "RL001", "a.py", "broken.py", "missing.py")
    assert done.returncode == 2
    entries = json.loads(done.stdout)
    errors = [e for e in entries if e["code"] is None]
    assert [Path(e["filename"]).name for e in errors] == ["broken.py", "missing.py"]
    assert errors[0]["location"] == {"row": 2, "column": 5}
    assert errors[0]["message"].startswith("syntax error")
    assert errors[1]["message"] == "no such file or directory"
    assert all(e["fix"] is None and e["url"] is None for e in errors)
    assert [e["code"] for e in entries if e["code"]] == ["RL001"]


def test_github_error_lines(run: RunCli, broken: Path) -> None:
    done = run("--output-format", "github", "broken.py")
    assert done.returncode == 2
    [line] = done.stdout.splitlines()
    assert line.startswith("::error file=broken.py,line=2,col=5,title=replaylint could not lint")
    assert "::syntax error" in line


def test_sarif_tool_execution_notifications(run: RunCli, broken: Path) -> None:
    done = run("--output-format", "sarif", "--select", "RL001", "a.py", "broken.py")
    assert done.returncode == 2
    [sarif_run] = json.loads(done.stdout)["runs"]
    [invocation] = sarif_run["invocations"]
    assert invocation["executionSuccessful"] is False
    [note] = invocation["toolExecutionNotifications"]
    assert note["level"] == "error"
    assert note["message"]["text"].startswith("syntax error")
    location = note["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "broken.py"
    assert location["region"] == {"startLine": 2, "startColumn": 5}
    assert [r["ruleId"] for r in sarif_run["results"]] == ["RL001"]
    clean = json.loads(run("--output-format", "sarif", "a.py").stdout)
    assert clean["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_unreadable_stdin_in_json(
    run_bytes: Callable[..., subprocess.CompletedProcess[bytes]],
) -> None:
    done = run_bytes("--output-format", "json", "-", stdin=b"\xff\xfe\x00bad")
    assert done.returncode == 2
    [entry] = json.loads(done.stdout)
    assert entry["code"] is None
    assert entry["filename"] == "-"


def test_server_without_the_lsp_extra_says_what_to_install(run: RunCli, project: Path) -> None:
    blocker = project / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nsys.modules['pygls'] = None\nsys.modules['lsprotocol'] = None\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [*MODULE, "server"],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(root)])},
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "pip install 'replaylint[lsp]'" in done.stderr


def _read_until(stream: int, marker: bytes, seen: bytearray, timeout: float) -> None:
    import select
    import time

    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout} s; got {bytes(seen)!r}"
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            chunk = os.read(stream, 4096)
            assert chunk, f"the process ended; got {bytes(seen)!r}"
            seen.extend(chunk)


def test_watch_lints_again_when_a_file_changes(project: Path, buggy: Path) -> None:
    root = str(Path(__file__).resolve().parents[2])
    with subprocess.Popen(
        [*MODULE, "--watch", "--output-format", "concise", "--select", "RL001", "."],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root},
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        try:
            stderr = bytearray()
            _read_until(process.stderr.fileno(), b"Watching for file changes", stderr, 60)
            stdout = bytearray()
            _read_until(process.stdout.fileno(), b"Found 1 error.", stdout, 10)
            buggy.write_text(FIXED + "\n")  # a different size: seen whatever the clock's grain
            _read_until(process.stdout.fileno(), b"All checks passed!", stdout, 60)
            (project / "b.py").write_text(BUGGY)  # a new file is seen too
            _read_until(process.stdout.fileno(), b"b.py:2:36: RL001", stdout, 60)
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_watch_refuses_stdin(run: RunCli, project: Path) -> None:
    done = run("--watch", "-", stdin=BUGGY.encode())
    assert done.returncode == 2
    assert "--watch needs files to watch" in done.stderr
