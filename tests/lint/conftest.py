"""Shared fixtures for the command-line tests: a temporary project folder and two ways to run
``replaylint`` in it — in-process through :func:`replaylint.cli.main` (fast; most option tests)
and as a real subprocess (exit codes, stdin, ``python -m replaylint``, the console script).

Both return :class:`subprocess.CompletedProcess`, so a test reads ``returncode``, ``stdout`` and
``stderr`` the same way whichever it uses.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from replaylint.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]
RunCliBytes = Callable[..., "subprocess.CompletedProcess[bytes]"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder that is the working directory for the test (and for in-process runs)."""
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> RunCli:
    """``cli("--fix", "a.py", stdin=b"...")``: run :func:`main` in-process, capture its output."""

    def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        capsys.readouterr()  # drop anything printed before the run
        code = main(list(args))
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)

    return run


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    # The checkout first, so that a subprocess runs this tree even without an editable install.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def replaylint_command(program: str = "module") -> list[str]:
    """``python -m replaylint`` or the installed ``replaylint`` console script."""
    if program == "module":
        return [sys.executable, "-m", "replaylint"]
    script = Path(sys.executable).parent / "replaylint"
    if not script.exists():
        pytest.skip(f"the `replaylint` console script is not installed beside {sys.executable}")
    return [str(script)]


@pytest.fixture
def run_bytes(project: Path) -> RunCliBytes:
    """``run_bytes("a.py", stdin=b"...", program="script")``: a real subprocess; raw bytes out."""

    def run(
        *args: str, stdin: bytes | None = None, program: str = "module", cwd: Path | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*replaylint_command(program), *args],
            input=stdin if stdin is not None else b"",
            capture_output=True,
            cwd=cwd or project,
            env=_environment(),
            timeout=120,
            check=False,
        )

    return run


@pytest.fixture
def run(run_bytes: RunCliBytes) -> RunCli:
    """Like :func:`run_bytes`, with stdout and stderr decoded as UTF-8."""

    def run_text(*args: str, **options: object) -> subprocess.CompletedProcess[str]:
        done = run_bytes(*args, **options)
        return subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
        )

    return run_text


@pytest.fixture
def analysed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the files the engine really analyses during a test."""
    from replaylint.lint.run import one_file as runner

    seen: list[str] = []
    original = runner.lint_text

    def spy(linter, text, filename, mode, *, unsafe=False):  # type: ignore[no-untyped-def]
        seen.append(Path(filename).name)
        return original(linter, text, filename, mode, unsafe=unsafe)

    monkeypatch.setattr(runner, "lint_text", spy)
    return seen
