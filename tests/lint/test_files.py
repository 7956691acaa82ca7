"""Reading and writing files: fixes are atomic and keep encoding, BOM, line endings and
permissions; every kind of bad input gets a one-line error naming the file, exit code 2, the
other files still processed and nothing modified."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replaylint.lint.context import FileContext
from replaylint.lint.fixes.drafts import FixDraft, Replace
from replaylint.lint.run import files as source_io
from replaylint.lint.run import one_file as runner
from replaylint.lint.run.cache import CACHE_DIRECTORY

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

BUGGY = b"import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
FIXED = b"import torch\ng_cache = torch.zeros(4, 16, dtype=torch.float32)\n"
CLEAN = b"import torch\nd_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"


def fixed(source: bytes) -> bytes:
    return source.replace(b"torch.bfloat16", b"torch.float32")


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: file bytes, or where a link points, or "<dir>"."""
    entries: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if key.startswith(CACHE_DIRECTORY):
            continue  # the result cache is expected; tests/lint/test_result_cache.py covers it
        if path.is_symlink():
            entries[key] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            entries[key] = "<dir>"
        elif path.is_file():
            entries[key] = path.read_bytes()
        else:
            entries[key] = "<special>"
    return entries


def fix_file(cli: RunCli, path: Path, source: bytes) -> subprocess.CompletedProcess[str]:
    path.write_bytes(source)
    done = cli("--fix", "--select", "RL001", path.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "Found 1 error (1 fixed, 0 remaining).\n"
    return done


# what a fix keeps --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(BUGGY.replace(b"\n", b"\r\n"), id="crlf"),
        pytest.param(
            b"import torch\r\n# x\ng_cache = torch.zeros(4, dtype=torch.bfloat16)\r", id="mixed"
        ),
        pytest.param(b"\xef\xbb\xbf" + BUGGY, id="bom"),
        pytest.param(
            b"# -*- coding: latin-1 -*-\nimport torch\n# d\xe9croissance \xb5\n"
            b"g_cache = torch.zeros(4, dtype=torch.bfloat16)  # \xe9\n",
            id="latin-1-cookie",
        ),
        pytest.param(
            b"\xef\xbb\xbf# coding: utf-8\n" + BUGGY + "# é\n".encode(), id="bom-and-cookie"
        ),
        pytest.param(b"# vim: set fileencoding=cp1252 :\n# \x80\n" + BUGGY, id="cp1252-cookie"),
        pytest.param(BUGGY.rstrip(b"\n"), id="no-final-newline"),
        pytest.param(
            b"import torch\nif True:\n\tg_cache = torch.zeros(4,\tdtype=torch.bfloat16)\n",
            id="tabs",
        ),
        pytest.param("# \u2603 \U0001d524\n".encode() + BUGGY, id="non-ascii"),
    ],
)
def test_fix_changes_only_the_dtype_bytes(cli: RunCli, project: Path, source: bytes) -> None:
    path = project / "a.py"
    fix_file(cli, path, source)
    assert path.read_bytes() == fixed(source)


def test_inserted_import_uses_the_files_line_ending(cli: RunCli, project: Path) -> None:
    source = b"from torch import bfloat16, zeros\r\ng_cache = zeros(4, dtype=bfloat16)\r\n"
    path = project / "a.py"
    fix_file(cli, path, source)
    assert path.read_bytes() == (
        b"import torch\r\nfrom torch import bfloat16, zeros\r\n"
        b"g_cache = zeros(4, dtype=torch.float32)\r\n"
    )


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o751, 0o777])
def test_fix_keeps_permissions(cli: RunCli, project: Path, mode: int) -> None:
    path = project / "a.py"
    path.write_bytes(BUGGY)
    path.chmod(mode)
    fix_file(cli, path, BUGGY)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_fix_replaces_the_file_atomically_and_leaves_no_temporary_file(
    cli: RunCli, project: Path
) -> None:
    path = project / "a.py"
    path.write_bytes(BUGGY)
    (project / "other.txt").write_text("unrelated\n")
    inode = path.stat().st_ino
    fix_file(cli, path, BUGGY)
    # A new inode: the content arrived by rename from a temporary file, not by rewriting in place.
    assert path.stat().st_ino != inode
    assert snapshot(project) == {"a.py": FIXED, "other.txt": b"unrelated\n"}


def test_fix_writes_through_a_symlink_and_keeps_the_link(cli: RunCli, project: Path) -> None:
    real = project / "real.py"
    real.write_bytes(BUGGY)
    (project / "link.py").symlink_to("real.py")
    done = cli("--fix", "--select", "RL001", "link.py")
    assert done.returncode == 0
    assert snapshot(project) == {"link.py": "-> real.py", "real.py": FIXED}


def test_walked_symlink_to_a_file_outside_the_tree_is_not_fixed(
    cli: RunCli, project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.py"
    outside.write_bytes(BUGGY)
    tree = project / "tree"
    tree.mkdir()
    (tree / "link.py").symlink_to(outside)
    done = cli("--fix", "--select", "RL001", "tree")
    assert done.returncode == 1  # still reported, not written
    assert "link.py: not fixed: it is a symlink to a file outside tree" in done.stderr
    assert outside.read_bytes() == BUGGY
    # Named explicitly, it is the user's choice: fixed through the link.
    explicit = cli("--fix", "--select", "RL001", "tree/link.py")
    assert explicit.returncode == 0
    assert outside.read_bytes() == FIXED
    assert (tree / "link.py").is_symlink()


def test_empty_file(cli: RunCli, project: Path) -> None:
    path = project / "empty.py"
    path.write_bytes(b"")
    for args in (["empty.py"], ["--fix", "empty.py"], ["--diff", "empty.py"]):
        done = cli(*args)
        assert done.returncode == 0, args
    assert path.read_bytes() == b""


# bad input ---------------------------------------------------------------------------------------


# The pre-filter never parses a file that cannot hold a finding (test_prefilter.py): bad files
# mention a gate cache so that replaylint has to read them.
RELEVANT_LINE = b"\ng_cache = None\n"

BAD_FILES: list[Any] = [
    pytest.param(b"x = (\n", "bad.py:1:5: syntax error: ", id="syntax-error"),
    pytest.param(b'print "python 2"\n', "bad.py:1:1: syntax error: ", id="python-2"),
    pytest.param(b"def f(:\n    pass\n", "bad.py:1:7: syntax error: ", id="syntax-error-col"),
    pytest.param(b"\x7fELF\x02\x01\x01\x00\x00\x00", "bad.py: is a binary file", id="binary"),
    pytest.param(
        b"x = '\xff\xfe'\n",
        "bad.py: is not valid utf-8 text (line 1, byte 5); is it really Python source?",
        id="not-utf8-first-line",
    ),
    pytest.param(
        b"import torch\n\n# caf\xe9\n",
        "bad.py: is not valid utf-8 text (line 3, byte 19)",
        id="not-utf8-third-line",
    ),
    pytest.param(
        b"# -*- coding: klingon -*-\nx = 1\n",
        "bad.py: has an invalid encoding declaration: unknown encoding: klingon",
        id="unknown-encoding",
    ),
    pytest.param(
        b"<html><body>not python</body></html>\n", "bad.py:1:1: syntax error: ", id="html"
    ),
]


@pytest.mark.parametrize(("content", "message"), BAD_FILES)
@pytest.mark.parametrize("fix", [False, True], ids=["check", "fix"])
def test_bad_file_is_reported_and_the_others_still_run(
    cli: RunCli, project: Path, content: bytes, message: str, fix: bool
) -> None:
    (project / "bad.py").write_bytes(content + RELEVANT_LINE)
    (project / "good.py").write_bytes(BUGGY)
    before = snapshot(project)
    done = cli(*(["--fix"] if fix else []), "--select", "RL001", ".")
    assert done.returncode == 2
    [error] = done.stderr.splitlines()  # one line
    assert error.startswith(f"error: {message}"), error
    if fix:
        assert snapshot(project) == {**before, "good.py": FIXED}
        assert done.stdout == "Found 1 error (1 fixed, 0 remaining).\n"
    else:
        assert snapshot(project) == before
        assert done.stdout.startswith("good.py:2:36: RL001")


def test_syntax_error_message_is_pythons(cli: RunCli, project: Path) -> None:
    (project / "bad.py").write_bytes(b"g_cache = 1\nif g_cache:\npass\n")
    done = cli("bad.py")
    assert done.stderr == (
        "error: bad.py:3:1: syntax error: expected an indented block after 'if' statement on "
        "line 2\n"
    )


def test_directory_named_like_a_python_file_is_walked(cli: RunCli, project: Path) -> None:
    folder = project / "pkg.py"
    folder.mkdir()
    (folder / "inner.py").write_bytes(BUGGY)
    for paths in (["."], ["pkg.py"]):
        done = cli("--output-format", "concise", "--select", "RL001", *paths)
        assert done.returncode == 1, paths
        assert done.stdout.startswith(f"pkg.py{os.sep}inner.py:2:36: RL001"), paths
        assert done.stderr == "", paths


def test_read_only_file_is_not_fixed(cli: RunCli, project: Path) -> None:
    # Checked by permission bits too, so that this holds when the tests run as root.
    path = project / "a.py"
    path.write_bytes(BUGGY)
    path.chmod(0o444)
    (project / "b.py").write_bytes(BUGGY)
    done = cli("--fix", "--select", "RL001", ".")
    assert done.returncode == 2
    assert done.stderr == (
        "error: a.py: is read-only; the fix was not written (make it writable to fix it)\n"
    )
    assert path.read_bytes() == BUGGY
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert (project / "b.py").read_bytes() == FIXED
    # The unfixed finding is still reported.
    assert done.stdout.startswith("a.py:2:36: RL001")
    assert done.stdout.endswith("Found 2 errors (1 fixed, 1 remaining).\n")
    assert sorted(p.name for p in project.iterdir() if p.name != CACHE_DIRECTORY) == [
        "a.py",
        "b.py",
    ]


@pytest.mark.skipif(
    sys.platform == "win32" or os.geteuid() == 0,
    reason="chmod 000 does not stop root from reading (see the in-process test below)",
)
def test_unreadable_file_subprocess(run: RunCli, project: Path) -> None:
    path = project / "secret.py"
    path.write_bytes(BUGGY)
    path.chmod(0)
    (project / "good.py").write_bytes(BUGGY)
    try:
        done = run("--select", "RL001", ".")
    finally:
        path.chmod(0o644)
    assert done.returncode == 2
    assert "error: secret.py: cannot be read: Permission denied" in done.stderr
    assert "good.py:2:36: RL001" in done.stdout


def test_unreadable_file(cli: RunCli, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "secret.py").write_bytes(BUGGY)
    (project / "good.py").write_bytes(BUGGY)
    read_bytes = Path.read_bytes

    def denied(self: Path) -> bytes:
        if self.name == "secret.py":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    done = cli("--fix", "--select", "RL001", ".")
    assert done.returncode == 2
    assert done.stderr == "error: secret.py: cannot be read: Permission denied\n"
    assert (project / "good.py").read_bytes() == FIXED
    monkeypatch.undo()
    assert (project / "secret.py").read_bytes() == BUGGY


def test_file_deleted_between_discovery_and_reading(
    cli: RunCli, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "gone.py").write_bytes(BUGGY)
    (project / "good.py").write_bytes(BUGGY)
    from replaylint.lint.run import projects

    discover = projects.discover

    def discover_then_delete(*args: Any, **kwargs: Any) -> Any:
        found = discover(*args, **kwargs)
        (project / "gone.py").unlink(missing_ok=True)
        return found

    monkeypatch.setattr(projects, "discover", discover_then_delete)
    done = cli("--select", "RL001", ".")
    assert done.returncode == 2
    assert done.stderr == (
        "error: gone.py: does not exist (was it deleted while replaylint ran?)\n"
    )
    assert "good.py:2:36: RL001" in done.stdout


def test_file_changed_between_reading_and_writing_is_not_overwritten(
    cli: RunCli, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = project / "a.py"
    path.write_bytes(BUGGY)
    newer = BUGGY + b"# edited meanwhile\n"
    lint_text = runner.lint_text

    def lint_then_edit(*args: Any, **kwargs: Any) -> Any:
        result = lint_text(*args, **kwargs)
        path.write_bytes(newer)  # someone saves the file while we compute the fix
        return result

    monkeypatch.setattr(runner, "lint_text", lint_then_edit)
    done = cli("--fix", "--select", "RL001", "a.py")
    assert done.returncode == 2
    assert done.stderr == (
        "error: a.py: changed on disk while replaylint was fixing it; not overwritten\n"
    )
    assert snapshot(project) == {"a.py": newer}


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_write_failure_leaves_the_original_intact(
    cli: RunCli, project: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = project / "a.py"
    path.write_bytes(BUGGY)
    (project / "b.py").write_bytes(BUGGY)
    real = getattr(os, failing)

    def no_space(*args: Any) -> Any:
        if failing == "replace" and not str(args[1]).endswith("a.py"):
            return real(*args)
        if failing == "fsync" and not any(p.name.startswith(".a.py.") for p in project.iterdir()):
            return real(*args)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(source_io.os, failing, no_space)
    done = cli("--fix", "--select", "RL001", ".")
    monkeypatch.undo()
    assert done.returncode == 2
    assert done.stderr == (
        "error: a.py: could not be written (No space left on device); the original is unchanged\n"
    )
    assert snapshot(project) == {"a.py": BUGGY, "b.py": FIXED}  # and no temporary file


def test_no_temporary_file_possible(
    cli: RunCli, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "a.py").write_bytes(BUGGY)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(source_io.tempfile, "mkstemp", refuse)
    done = cli("--fix", "--select", "RL001", "a.py")
    assert done.returncode == 2
    assert done.stderr == (
        "error: a.py: cannot be fixed: no temporary file in its folder (Permission denied); "
        "left unchanged\n"
    )
    assert snapshot(project) == {"a.py": BUGGY}


def test_fix_that_would_break_the_file_is_dropped_and_reported(
    cli: RunCli, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = FileContext.add_finding

    def broken_fix(self: FileContext, code: str, node: Any, message: str, fix: Any) -> None:
        if isinstance(fix, FixDraft):  # a buggy rule: its fix replaces the node with "("
            fix = FixDraft(fix.message, (Replace(node, "("),), fix.applicability)
        original(self, code, node, message, fix)

    monkeypatch.setattr(FileContext, "add_finding", broken_fix)
    path = project / "a.py"
    path.write_bytes(BUGGY)
    done = cli("--fix", "--select", "RL001", "a.py")
    assert done.returncode == 1  # the finding remains
    assert done.stderr == (
        "warning: a.py:2:36: the fix for RL001 would make the file unparsable, so it was not "
        "applied (please report this as a replaylint bug)\n"
    )
    assert done.stdout.endswith("Found 1 error (0 fixed, 1 remaining).\n")
    assert snapshot(project) == {"a.py": BUGGY}
    diff = cli("--diff", "--select", "RL001", "a.py")
    assert (diff.returncode, diff.stdout) == (0, "")
    assert "would make the file unparsable" in diff.stderr


def test_symlink_loop_and_dangling_symlink(cli: RunCli, project: Path) -> None:
    (project / "loop_a.py").symlink_to("loop_b.py")
    (project / "loop_b.py").symlink_to("loop_a.py")
    (project / "dangling.py").symlink_to("nowhere.py")
    (project / "good.py").write_bytes(BUGGY)
    done = cli("--fix", "--select", "RL001", ".")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: dangling.py: is a symbolic link to a file that does not exist",
        f"error: loop_a.py: cannot be read: {os.strerror(errno.ELOOP)}",
        f"error: loop_b.py: cannot be read: {os.strerror(errno.ELOOP)}",
    ]
    assert (project / "good.py").read_bytes() == FIXED


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_named_pipe_is_not_read(project: Path) -> None:
    # Opening a FIFO for reading blocks until a writer comes: a subprocess with a timeout, so a
    # regression fails instead of hanging the suite.
    os.mkfifo(project / "pipe.py")
    (project / "good.py").write_bytes(BUGGY)
    done = subprocess.run(
        [sys.executable, "-m", "replaylint", "--select", "RL001", "."],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert (
        "error: pipe.py: is not a regular file (a named pipe, socket or device); not read"
        in done.stderr
    )
    assert "good.py:2:36: RL001" in done.stdout


def test_clean_and_dirty_files_together(cli: RunCli, project: Path) -> None:
    (project / "clean.py").write_bytes(CLEAN)
    (project / "dirty.py").write_bytes(BUGGY)
    done = cli("--fix", "--select", "RL001", ".")
    assert done.returncode == 0
    assert snapshot(project) == {"clean.py": CLEAN, "dirty.py": FIXED}
