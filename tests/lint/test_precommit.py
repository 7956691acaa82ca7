"""The pre-commit hooks, run by the real ``pre-commit try-repo`` on a temporary git repository.

pre-commit builds a virtualenv and pip-installs this repository into it, so the test needs the
package index (for libcst); it is skipped only when pre-commit or git is missing or pip cannot
reach an index. The hook repository is a fresh git repository holding this checkout's files as
they are now — tracked and untracked, minus what .gitignore ignores — so that uncommitted work is
tested too (``try-repo`` on the checkout itself would leave out untracked files).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
FIXED = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.float32)\n"
CLEAN = "import torch\nd_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"

# pip's words for "no network / no index": only these make the test skip instead of fail.
_OFFLINE = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Could not fetch URL",
    "ConnectionError",
)

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("pre_commit") is None, reason="pre-commit is not installed"
    ),
]


def _environment(home: Path) -> dict[str, str]:
    # Inside a git hook GIT_DIR / GIT_INDEX_FILE point at the outer repository: drop them all.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        PRE_COMMIT_HOME=str(home),
        PRE_COMMIT_COLOR="never",
        GIT_AUTHOR_NAME="replaylint tests",
        GIT_AUTHOR_EMAIL="tests@example.com",
        GIT_COMMITTER_NAME="replaylint tests",
        GIT_COMMITTER_EMAIL="tests@example.com",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    return env


def _git(cwd: Path, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, check=True, timeout=60
    )
    return done.stdout.decode()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PRE_COMMIT_HOME: keeps pre-commit's cache and log out of the user's ~/.cache."""
    return tmp_path_factory.mktemp("pre-commit-home")


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory, home: Path) -> Path:
    if not (REPO_ROOT / ".git").exists():
        pytest.skip(f"{REPO_ROOT} is not a git checkout")
    env = _environment(home)
    listed = subprocess.run(
        # safe.directory: a CI checkout may belong to another user than the one running tests.
        [
            "git",
            "-c",
            "safe.directory=*",
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        check=True,
    ).stdout.decode()
    repo = tmp_path_factory.mktemp("hook-repo")
    for name in filter(None, listed.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():  # skips files deleted from the working tree
            target = repo / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    _git(repo, "init", "-q", env=env)
    _git(repo, "add", "-A", env=env)
    _git(repo, "commit", "-q", "--no-verify", "-m", "replaylint as checked out", env=env)
    return repo


def try_repo(hook_repo: Path, project: Path, home: Path) -> tuple[int, dict[str, str]]:
    """Run every hook of the repository (check, then fix) in one ``try-repo``: it builds the hook
    environment in a fresh temporary store each time, so one run per state keeps this fast.

    Returns the exit code and each hook's section of the output, by hook id.
    """
    done = subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "--verbose"],
        cwd=project,
        env=_environment(home),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = done.stdout + done.stderr
    if "An unexpected error has occurred" in output:
        log = home / "pre-commit.log"
        details = log.read_text() if log.exists() else ""
        if any(marker in details + output for marker in _OFFLINE):
            pytest.skip(f"pip could not reach a package index to install the hook:\n{details}")
        pytest.fail(f"pre-commit failed to run the hooks:\n{output}\n{details}")
    sections: dict[str, str] = {}
    lines = output.splitlines(keepends=True)
    for number, line in enumerate(lines):
        if line.startswith("- hook id: "):
            # A section starts at the status line above its "- hook id:" line.
            hook = line.removeprefix("- hook id: ").strip()
            end = next(
                (
                    i - 1
                    for i in range(number + 1, len(lines))
                    if lines[i].startswith("- hook id: ")
                ),
                len(lines),
            )
            sections[hook] = "".join(lines[number - 1 : end])
    assert set(sections) == {"replaylint", "replaylint-fix"}, output
    return done.returncode, sections


@pytest.fixture(scope="module")
def first_run(
    hook_repo: Path, tmp_path_factory: pytest.TempPathFactory, home: Path
) -> tuple[Path, dict[str, str]]:
    """Both hooks run once on a repository with a staged gate-cache bug."""
    repo = tmp_path_factory.mktemp("user")
    env = _environment(home)
    _git(repo, "init", "-q", env=env)
    (repo / "pool.py").write_text(BUGGY)
    (repo / "clean.py").write_text(CLEAN)
    (repo / "notes.txt").write_text("g_cache = torch.zeros(4, dtype=torch.bfloat16)\n")
    _git(repo, "add", ".", env=env)
    code, sections = try_repo(hook_repo, repo, home)
    assert code == 1, sections
    return repo, sections


def test_check_hook_fails_and_names_the_finding(first_run: tuple[Path, dict[str, str]]) -> None:
    _, sections = first_run
    check = sections["replaylint"]
    assert check.startswith("replaylint (gate caches must be float32)")
    assert "Failed" in check.splitlines()[0]
    assert "- exit code: 1" in check
    assert "pool.py:2:36: RL001 [*] gate cache `g_cache` is allocated as torch.bfloat16" in check
    assert "Found 1 error." in check
    assert "clean.py" not in check
    assert "notes.txt" not in check


def test_fix_hook_fixes_the_file(first_run: tuple[Path, dict[str, str]]) -> None:
    repo, sections = first_run
    fix = sections["replaylint-fix"]
    assert fix.startswith("replaylint --fix (gate caches must be float32)")
    # pre-commit fails a hook that modified files, so that the user reviews and re-stages them.
    assert "Failed" in fix.splitlines()[0]
    assert "- files were modified by this hook" in fix
    assert "Found 1 error (1 fixed, 0 remaining)." in fix
    assert (repo / "pool.py").read_text() == FIXED
    assert (repo / "clean.py").read_text() == CLEAN


def test_both_hooks_pass_once_the_fix_is_staged(
    first_run: tuple[Path, dict[str, str]], hook_repo: Path, home: Path
) -> None:
    repo, _ = first_run
    _git(repo, "add", "pool.py", env=_environment(home))
    code, sections = try_repo(hook_repo, repo, home)
    assert code == 0, sections
    for hook, section in sections.items():
        assert "Passed" in section.splitlines()[0], (hook, section)
    assert (repo / "pool.py").read_text() == FIXED
