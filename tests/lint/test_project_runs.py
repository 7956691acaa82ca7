"""Runs over part of a project see what a run over all of it sees.

* A gate-cache name taught by a decode call in a file that is not named (pre-commit passes only
  the staged files) still counts, and the finding says which file taught it.
* Each file follows its nearest configuration, so the order of the named paths does not matter.
* A real ``pre-commit run`` with only some files staged reports what a full run reports for them.
* A tree restored with its mtimes (``cp -p``) is not answered from a stale cache.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_learning import POOL, STEP  # a pool and the decode call that teaches its name

REPO_ROOT = Path(__file__).resolve().parents[2]

BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"


def _replaylint(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "replaylint", "check", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _findings(cwd: Path, *args: str) -> list[tuple[str, int, str, str]]:
    done = _replaylint(cwd, "--output-format", "json", *args)
    assert done.returncode in {0, 1}, done.stderr
    return [
        (os.path.relpath(f["filename"], cwd), f["location"]["row"], f["code"], f["message"])
        for f in json.loads(done.stdout)
    ]


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[tool.replaylint]\n", encoding="utf-8")
    (project / "src" / "pool.py").write_text(POOL, encoding="utf-8")
    (project / "src" / "step.py").write_text(STEP, encoding="utf-8")
    return project


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "no-cache"])
def test_a_name_taught_by_an_unnamed_file_still_counts(tmp_path: Path, cache: bool) -> None:
    project = _project(tmp_path)
    flags = () if cache else ("--no-cache",)
    full = [f for f in _findings(project, *flags, ".") if f[0].endswith("pool.py")]
    assert full, "the full run finds the decay ring"
    assert all("src/step.py:4" in message for *_, message in full)
    alone = _findings(project, *flags, "src/pool.py")
    assert alone == full
    again = _findings(project, *flags, "src/pool.py")  # warm, when cached
    assert again == full


def test_each_file_follows_its_nearest_configuration(tmp_path: Path) -> None:
    for name, ignore in (("a", "[]"), ("b", '["RL001"]')):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "pyproject.toml").write_text(
            f"[tool.replaylint]\nignore = {ignore}\n", encoding="utf-8"
        )
        (folder / "ring.py").write_text(BUGGY, encoding="utf-8")
    forward = _findings(tmp_path, "--no-cache", "a", "b")
    backward = _findings(tmp_path, "--no-cache", "b", "a")
    assert forward == backward
    assert [(filename, code) for filename, _, code, _ in forward] == [("a/ring.py", "RL001")]


def test_config_on_the_command_line_applies_to_every_path(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ring.py").write_text(BUGGY, encoding="utf-8")
    (tmp_path / "b" / "pyproject.toml").write_text(
        '[tool.replaylint]\nignore = ["RL001"]\n', encoding="utf-8"
    )
    config = tmp_path / "strict.toml"
    config.write_text("select = ['RL']\n", encoding="utf-8")
    found = _findings(tmp_path, "--no-cache", "--config", str(config), "b", "a")
    assert [(filename, code) for filename, _, code, _ in found] == [
        ("a/ring.py", "RL001"),
        ("b/ring.py", "RL001"),
    ]


def test_a_tree_restored_with_its_mtimes_is_not_answered_from_a_stale_cache(
    tmp_path: Path,
) -> None:
    project = tmp_path / "work"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.replaylint]\n", encoding="utf-8")
    ring = project / "ring.py"
    ring.write_text(BUGGY, encoding="utf-8")
    assert [code for _, _, code, _ in _findings(project, ".")] == ["RL001"]  # fills the cache
    # The same size and mtime, other content: what `cp -p` / `rsync -a` / `tar x` can restore.
    stamp = ring.stat()
    time.sleep(0.01)
    ring.write_text(BUGGY.replace("bfloat16", "float32 "), encoding="utf-8")
    os.utime(ring, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert ring.stat().st_size == stamp.st_size
    assert ring.stat().st_mtime_ns == stamp.st_mtime_ns
    assert _findings(project, ".") == []


def _git(cwd: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME="replaylint tests",
        GIT_AUTHOR_EMAIL="tests@example.com",
        GIT_COMMITTER_NAME="replaylint tests",
        GIT_COMMITTER_EMAIL="tests@example.com",
    )
    subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True, timeout=60)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.skipif(
    importlib.util.find_spec("pre_commit") is None, reason="pre-commit is not installed"
)
def test_pre_commit_with_only_some_files_staged_reports_what_a_full_run_does(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path)
    hook = {
        "repos": [
            {
                "repo": "local",
                "hooks": [
                    {
                        "id": "replaylint",
                        "name": "replaylint",
                        "entry": f"{sys.executable} -m replaylint check --force-exclude "
                        "--output-format concise",
                        "language": "system",
                        "types_or": ["python", "pyi"],
                        "require_serial": True,
                    }
                ],
            }
        ]
    }
    (project / ".pre-commit-config.yaml").write_text(json.dumps(hook), encoding="utf-8")
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "pool and step", "--no-verify")
    # Touch only the pool: the decode call that teaches its gate-cache name is not staged.
    (project / "src" / "pool.py").write_text(POOL + "\n# resized\n", encoding="utf-8")
    _git(project, "add", "src/pool.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(PYTHONPATH=str(REPO_ROOT), PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))
    done = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    full = _replaylint(project, "--no-cache", "--output-format", "concise", ".")
    expected = [line for line in full.stdout.splitlines() if line.startswith("src/pool.py")]
    assert expected
    reported = [line for line in done.stdout.splitlines() if line.startswith("src/pool.py")]
    assert reported == expected
