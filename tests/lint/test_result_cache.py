"""The result cache: hits, misses on content / configuration / version change, concurrent runs,
corrupt stores, and deterministic output whatever the number of worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from replaylint.lint.run import cache as result_cache
from replaylint.lint.run.cache import CACHE_DIRECTORY

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]
BUGGY = "import torch\ng_cache = torch.zeros(4, dtype=torch.bfloat16)\n"
CLEAN = "import torch\ng_cache = torch.zeros(4, dtype=torch.float32)\n"


def _store(project: Path) -> Path:
    [store] = (project / CACHE_DIRECTORY).glob("results-*.json")
    return store


def _entries(project: Path) -> dict[str, list[object]]:
    data = json.loads(_store(project).read_text())
    entries: dict[str, list[object]] = data["files"]
    return entries


def test_second_run_is_answered_from_the_cache(
    cli: RunCli, project: Path, analysed: list[str]
) -> None:
    (project / "a.py").write_text(BUGGY)
    (project / "b.py").write_text(CLEAN)
    first = cli("--jobs", "1", ".")
    assert analysed == ["a.py", "b.py"]
    assert (project / CACHE_DIRECTORY / ".gitignore").read_text().endswith("*\n")
    analysed.clear()
    second = cli("--jobs", "1", ".")
    assert analysed == []  # both answered from the cache
    assert (second.returncode, second.stdout) == (first.returncode, first.stdout)
    assert "RL001" in second.stdout


def test_content_change_is_a_miss(cli: RunCli, project: Path, analysed: list[str]) -> None:
    (project / "a.py").write_text(BUGGY)
    (project / "b.py").write_text(CLEAN)
    cli("--jobs", "1", ".")
    analysed.clear()
    (project / "a.py").write_text(CLEAN + "# edited\n")
    done = cli("--jobs", "1", ".")
    assert analysed == ["a.py"]
    assert done.returncode == 0


def test_same_content_new_mtime_is_a_hit(cli: RunCli, project: Path, analysed: list[str]) -> None:
    (project / "a.py").write_text(BUGGY)
    cli("--jobs", "1", ".")
    analysed.clear()
    os.utime(project / "a.py", ns=(1, 1))
    done = cli("--jobs", "1", ".")
    assert analysed == []  # the digest matched
    assert done.returncode == 1


def test_configuration_change_is_a_miss(cli: RunCli, project: Path, analysed: list[str]) -> None:
    (project / "a.py").write_text(BUGGY)
    cli("--jobs", "1", ".")
    analysed.clear()
    (project / "pyproject.toml").write_text('[tool.replaylint]\nignore = ["RL001"]\n')
    done = cli("--jobs", "1", ".")
    assert analysed == ["a.py"]
    assert done.returncode == 0  # the cached RL001 finding was not reused
    assert len(list((project / CACHE_DIRECTORY).glob("results-*.json"))) == 2


def test_version_change_is_a_miss(
    cli: RunCli, project: Path, analysed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "a.py").write_text(BUGGY)
    cli("--jobs", "1", ".")
    analysed.clear()
    monkeypatch.setattr(result_cache, "__version__", "999.0")
    cli("--jobs", "1", ".")
    assert analysed == ["a.py"]


def test_corrupt_store_and_entries_are_ignored(
    cli: RunCli, project: Path, analysed: list[str]
) -> None:
    (project / "a.py").write_text(BUGGY)
    (project / "b.py").write_text(BUGGY)
    cli("--jobs", "1", ".")
    entries = _entries(project)
    key = next(k for k in entries if k.endswith("a.py"))
    entries[key] = ["garbage"]
    _store(project).write_text(json.dumps({"format": 1, "files": entries}))
    analysed.clear()
    done = cli("--jobs", "1", ".")
    assert analysed == ["a.py"]  # the bad entry is a miss; b.py's entry is still used
    assert done.stdout.count("RL001 [*]") == 2
    _store(project).write_bytes(b"\x00not json")
    analysed.clear()
    done = cli("--jobs", "1", ".")
    assert sorted(analysed) == ["a.py", "b.py"]
    assert done.stdout.count("RL001 [*]") == 2


def test_no_cache_neither_reads_nor_writes(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    cli("--no-cache", ".")
    assert not (project / CACHE_DIRECTORY).exists()


def test_fix_uses_and_refreshes_the_cache(cli: RunCli, project: Path, analysed: list[str]) -> None:
    (project / "a.py").write_text(BUGGY)
    cli("--jobs", "1", ".")
    analysed.clear()
    fixed = cli("--jobs", "1", "--fix", ".")
    assert fixed.returncode == 0
    assert analysed == ["a.py"]  # a cached finding with a fix: the file is fixed
    analysed.clear()
    again = cli("--jobs", "1", ".")
    assert again.returncode == 0
    assert analysed == []  # the fixed content was remembered


def test_concurrent_runs_leave_a_valid_store(project: Path) -> None:
    for number in range(40):
        (project / f"m{number}.py").write_text(BUGGY if number % 2 else CLEAN)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    command = [sys.executable, "-m", "replaylint", "--jobs", "1", "--output-format", "json", "."]
    runs = [
        subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE) for _ in range(4)
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert all(run.returncode == 1 for run in runs)
    assert len({output for output in outputs}) == 1  # every run saw the same findings
    assert len(json.loads(outputs[0])) == 20
    [path] = (project / CACHE_DIRECTORY).glob("results-*.json")
    assert len(json.loads(path.read_text())["files"]) == 40
    assert not list((project / CACHE_DIRECTORY).glob(".tmp-*"))  # no torn temporaries left
    again = subprocess.run(command, cwd=project, env=env, capture_output=True, check=False)
    assert again.stdout == outputs[0]


def test_output_is_identical_whatever_the_number_of_jobs(project: Path) -> None:
    for number in range(30):
        (project / f"m{number:02}.py").write_text(BUGGY if number % 3 else CLEAN)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    outputs = {
        jobs: subprocess.run(
            [sys.executable, "-m", "replaylint", "--no-cache", "--jobs", jobs, "."],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for jobs in ("1", "2", "4")
    }
    assert outputs["1"] == outputs["2"] == outputs["4"]
    assert outputs["1"].count("RL001 [*]") == 20
