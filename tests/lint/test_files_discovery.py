"""Which files a run lints: ``*.py`` and ``*.pyi`` under the given paths, default excludes,
``.gitignore`` inside a git repository, explicit paths, symlinked folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"


def linted(cli: RunCli, *args: str) -> list[str]:
    """Files with an RL001 finding (every test file here holds exactly one), relative, sorted."""
    done = cli(*args, "--output-format", "json", "--select", "RL001")
    assert done.returncode in (0, 1), done.stderr
    names = {
        Path(f["filename"]).relative_to(Path.cwd()).as_posix()
        for f in json.loads(done.stdout)
        if f["code"] == "RL001"
    }
    return sorted(names)


def plant(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(BUGGY)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_python_and_stub_files_only(cli: RunCli, project: Path) -> None:
    plant(project, "a.py", "b.pyi", "pkg/c.py", "notes.txt", "d.pyx", "e.py.bak", "README")
    assert linted(cli) == ["a.py", "b.pyi", "pkg/c.py"]


@pytest.mark.parametrize(
    "folder",
    [".venv", "venv", ".git", "node_modules", "__pypackages__", ".tox", "site-packages", "dist"],
)
def test_default_excludes(cli: RunCli, project: Path, folder: str) -> None:
    plant(project, "a.py", f"{folder}/lib/x.py", f"pkg/{folder}/y.py")
    assert linted(cli, ".") == ["a.py"]
    assert linted(cli, f"{folder}/lib/x.py") == [f"{folder}/lib/x.py"]  # named explicitly


def test_a_named_folder_is_linted_even_below_an_excluded_name(cli: RunCli, project: Path) -> None:
    # A project living under ~/venv/ (no configuration: patterns apply below the named folder).
    plant(project, "venv/myproject/a.py", "venv/myproject/.venv/b.py")
    assert linted(cli, "venv/myproject") == ["venv/myproject/a.py"]
    assert linted(cli, "venv") == ["venv/myproject/a.py"]  # named: linted, like a file
    assert linted(cli, ".") == []  # found by walking: excluded
    assert linted(cli, "--force-exclude", "venv/myproject") == []


def test_each_file_once(cli: RunCli, project: Path) -> None:
    plant(project, "a.py", "pkg/b.py")
    done = cli(".", "a.py", "./a.py", "pkg", "pkg/b.py", "--output-format", "json")
    assert len(json.loads(done.stdout)) == 2


def test_symlinked_folders_are_not_followed(cli: RunCli, project: Path) -> None:
    plant(project, "pkg/a.py")
    (project / "pkg" / "loop").symlink_to("..", target_is_directory=True)
    (project / "alias").symlink_to("pkg", target_is_directory=True)
    assert linted(cli, ".") == ["pkg/a.py"]


def test_output_is_sorted_by_path(cli: RunCli, project: Path) -> None:
    plant(project, "z.py", "a/b.py", "a.py", "m/n/o.py")
    done = cli(".", "--output-format", "concise", "--select", "RL001")
    heads = [line.split(":")[0] for line in done.stdout.splitlines() if ": RL001" in line]
    assert heads == sorted(heads)
    assert len(heads) == 4


# .gitignore --------------------------------------------------------------------------------------

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_gitignore_is_honoured_inside_a_git_repository(cli: RunCli, project: Path) -> None:
    git(project, "init", "-q")
    (project / ".gitignore").write_text("generated.py\nbuild_out/\n*.gen.py\n")
    (project / "pkg").mkdir()
    (project / "pkg" / ".gitignore").write_text("local.py\n")
    plant(
        project,
        "a.py",
        "generated.py",
        "build_out/x.py",
        "pkg/b.py",
        "pkg/c.gen.py",
        "pkg/local.py",
        "tracked.py",
    )
    (project / ".gitignore").write_text((project / ".gitignore").read_text() + "tracked.py\n")
    git(project, "add", "-f", "tracked.py")  # tracked files are linted even when ignored
    assert linted(cli, ".") == ["a.py", "pkg/b.py", "tracked.py"]
    assert linted(cli, "pkg") == ["pkg/b.py"]
    # Named explicitly, an ignored file is linted (pre-commit passes files explicitly).
    assert linted(cli, "generated.py") == ["generated.py"]


@needs_git
def test_gitignore_from_a_subfolder_run(
    cli: RunCli, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git(project, "init", "-q")
    (project / ".gitignore").write_text("skip_me.py\n")
    plant(project, "pkg/a.py", "pkg/skip_me.py")
    monkeypatch.chdir(project / "pkg")
    assert linted(cli) == ["a.py"]


def test_gitignore_outside_a_git_repository_is_not_used(cli: RunCli, project: Path) -> None:
    # Only git decides what is ignored; without a repository, .gitignore is just a file.
    if shutil.which("git") is not None:
        inside = subprocess.run(
            ["git", "rev-parse", "--is-inside-work-tree"],
            cwd=project,
            capture_output=True,
            check=False,
        )
        if inside.returncode == 0:
            pytest.skip("the temporary folder is inside a git work tree")
    (project / ".gitignore").write_text("ignored.py\n")
    plant(project, "a.py", "ignored.py")
    assert linted(cli) == ["a.py", "ignored.py"]


@needs_git
def test_files_in_an_ignored_folder_and_an_explicit_folder(cli: RunCli, project: Path) -> None:
    git(project, "init", "-q")
    (project / ".gitignore").write_text("vendor/\n")
    plant(project, "a.py", "vendor/v.py")
    assert linted(cli, ".") == ["a.py"]
    assert linted(cli, "vendor/v.py") == ["vendor/v.py"]


def test_paths_may_be_absolute(cli: RunCli, project: Path) -> None:
    plant(project, "pkg/a.py")
    assert linted(cli, str(project / "pkg")) == ["pkg/a.py"]
    assert linted(cli, os.fspath(project / "pkg" / "a.py")) == ["pkg/a.py"]
