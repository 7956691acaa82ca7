"""Runs over a project whose gate-cache dtype comes from another module: the command line resolves
it, and the result cache follows the modules each file's results were computed from."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

POOL = """\
import torch

from .policy import GATE_RING_DTYPE


class StatePool:
    def __init__(self, slots: int) -> None:
        self.g_cache = torch.zeros(slots, 4, 16, 8, dtype=GATE_RING_DTYPE)
"""
FLOAT32_POLICY = "import torch\n\nGATE_RING_DTYPE = torch.float32\n"
BF16_POLICY = "import torch\n\nGATE_RING_DTYPE = torch.bfloat16\n"


def _write(path: Path, text: str) -> None:
    """Write ``text`` with a modification time no earlier write had (the cache compares them)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    stamp = max(path.stat().st_mtime_ns, before + 1_000_000_000)
    os.utime(path, ns=(stamp, stamp))


@pytest.fixture
def package(project: Path) -> Path:
    folder = project / "serving"
    folder.mkdir()
    _write(folder / "__init__.py", "")
    _write(folder / "policy.py", FLOAT32_POLICY)
    _write(folder / "pool.py", POOL)
    _write(folder / "other.py", "VERSION = 1\n")
    return folder


def test_a_policy_change_re_lints_its_importer_and_back(
    cli: RunCli, package: Path, analysed: list[str]
) -> None:
    first = cli("--jobs", "1", "--output-format", "concise", ".")
    assert first.returncode == 0, first.stdout
    assert analysed == ["pool.py"]

    analysed.clear()
    _write(package / "policy.py", BF16_POLICY)
    second = cli("--jobs", "1", "--output-format", "concise", ".")
    assert second.returncode == 1
    assert analysed == ["pool.py"]
    assert "serving/pool.py:8:" in second.stdout
    assert "RL001" in second.stdout
    assert "from `GATE_RING_DTYPE` at serving/policy.py:3" in second.stdout

    analysed.clear()
    _write(package / "policy.py", FLOAT32_POLICY)
    third = cli("--jobs", "1", "--output-format", "concise", ".")
    assert third.returncode == 0, third.stdout
    assert analysed == ["pool.py"]


def test_an_unchanged_project_is_answered_from_the_cache(
    cli: RunCli, package: Path, analysed: list[str]
) -> None:
    _write(package / "policy.py", BF16_POLICY)
    assert cli("--jobs", "1", ".").returncode == 1
    analysed.clear()
    again = cli("--jobs", "1", "--output-format", "concise", ".")
    assert analysed == []
    assert again.returncode == 1
    assert "from `GATE_RING_DTYPE` at serving/policy.py:3" in again.stdout


def test_a_module_the_results_did_not_read_does_not_re_lint(
    cli: RunCli, package: Path, analysed: list[str]
) -> None:
    assert cli("--jobs", "1", ".").returncode == 0
    analysed.clear()
    _write(package / "other.py", "VERSION = 2\n")
    assert cli("--jobs", "1", ".").returncode == 0
    assert analysed == []


def test_naming_only_the_importer_still_reads_the_policy(cli: RunCli, package: Path) -> None:
    # pre-commit passes the staged files; the policy module is the rest of the project
    (package.parent / "pyproject.toml").write_text("[tool.replaylint]\n", encoding="utf-8")
    _write(package / "policy.py", BF16_POLICY)
    result = cli("--jobs", "1", "--output-format", "concise", "serving/pool.py")
    assert result.returncode == 1
    assert "RL001" in result.stdout


def test_the_fix_changes_only_the_importer(cli: RunCli, package: Path) -> None:
    _write(package / "policy.py", BF16_POLICY)
    assert cli("--jobs", "1", "--fix", ".").returncode == 0
    assert (package / "policy.py").read_text(encoding="utf-8") == BF16_POLICY
    fixed = (package / "pool.py").read_text(encoding="utf-8")
    assert "dtype=torch.float32)" in fixed
    assert fixed.replace("dtype=torch.float32)", "dtype=GATE_RING_DTYPE)") == POOL


def test_a_stored_summary_of_another_shape_is_not_trusted(
    cli: RunCli, project: Path, package: Path, analysed: list[str]
) -> None:
    assert cli("--jobs", "1", ".").returncode == 0
    [store] = (project / ".replaylint_cache").glob("results-*.json")
    data = json.loads(store.read_text(encoding="utf-8"))
    assert data["summaries"], "the policy module's summary is kept"
    data["summaries"] = {key: 42 for key in data["summaries"]}
    store.write_text(json.dumps(data), encoding="utf-8")
    _write(package / "pool.py", POOL + "\n")  # analysed again, with the stored summaries
    analysed.clear()
    assert cli("--jobs", "1", ".").returncode == 0
    assert analysed == ["pool.py"]
