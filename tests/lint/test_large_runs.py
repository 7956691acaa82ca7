"""Runs over many files take other paths than small ones: grep finds the files worth reading,
worker processes read and classify them, and names learned from one file make others relevant.
Every path must report exactly what the simple one (one process, no grep) reports."""

from __future__ import annotations

import io
import json
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from replaylint.cli import main
from replaylint.lint.gatecache import grep as needle_search
from replaylint.lint.run import batch

POOL = textwrap.dedent(
    """
    import torch

    class DecayPool:
        def __init__(self, shape, dtype):
            self.decay_ring = torch.zeros(shape, dtype=dtype)
    """
).lstrip()
STEP = textwrap.dedent(
    """
    from kernels import ops


    def step(pool, inputs):
        return ops.kda_replayssm_decode(**inputs, g_cache=pool.decay_ring)
    """
).lstrip()
BUGGY = "import torch\ng_cache = torch.zeros(4, dtype=torch.bfloat16)\n"
MENTION = "# kv_cache and 'g_cache' are named here but nothing is allocated\nx = 1\n"
PLAIN = "import torch\nkv_cache = torch.zeros(4, dtype=torch.bfloat16)\n"


def _project(root: Path) -> None:
    """About a hundred files: mentions, plain files, real findings and a learned gate ring."""
    for number in range(40):
        (root / f"mention_{number:02}.py").write_text(MENTION)
        (root / f"plain_{number:02}.py").write_text(PLAIN)
    for number in range(12):
        (root / f"buggy_{number:02}.py").write_text(BUGGY)
    (root / "pkg").mkdir()
    (root / "pkg" / "pool.py").write_text(POOL)  # relevant only once step.py teaches decay_ring
    (root / "pkg" / "step.py").write_text(STEP)


def _run(*arguments: str) -> list[tuple[str, int, int, str]]:
    out = io.StringIO()
    with redirect_stdout(out):
        main(["--output-format", "json", "--exit-zero", *arguments, "."])
    return [
        (Path(f["filename"]).name, f["location"]["row"], f["location"]["column"], f["message"])
        for f in json.loads(out.getvalue())
    ]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _simple_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "_SEARCH_MIN_FILES", 10**9)
    monkeypatch.setattr(batch, "_PARALLEL_MIN_SCANS", 10**9)
    monkeypatch.setattr(batch, "_PARALLEL_MIN_BYTES", 10**12)


def test_every_path_reports_the_same(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as simple:
        _simple_paths(simple)
        expected = _run("--no-cache", "--jobs", "1")
    assert sum(name.startswith("buggy_") for name, *_ in expected) == 12
    assert any(name == "pool.py" and "step.py:5" in message for name, *_, message in expected)
    assert _run("--no-cache", "--jobs", "1") == expected  # grep, one process
    assert _run("--no-cache", "--jobs", "2") == expected  # grep, worker processes
    with monkeypatch.context() as analysis_in_workers:
        analysis_in_workers.setattr(batch, "_PARALLEL_MIN_BYTES", 0)
        assert _run("--no-cache", "--jobs", "2") == expected  # and analysis in workers too
    with monkeypatch.context() as no_grep:
        no_grep.setattr(needle_search.shutil, "which", lambda name: None)
        no_grep.setattr(batch, "_SEARCH_MIN_FILES", 10**9)
        assert _run("--no-cache", "--jobs", "2") == expected  # Python search, workers


def test_cache_follows_what_is_learned(project: Path) -> None:
    first = _run("--jobs", "2")
    assert _run("--jobs", "2") == first  # answered from the cache
    assert any(name == "pool.py" for name, *_ in first)
    # step.py stops teaching decay_ring: pool.py's cached finding must not survive.
    (project / "pkg" / "step.py").write_text(STEP.replace("g_cache=", "d_cache="))
    second = _run("--jobs", "2")
    assert not any(name == "pool.py" for name, *_ in second)
    assert second == [entry for entry in first if entry[0] != "pool.py"]
    # And teaching it again brings the finding back, from a warm cache.
    (project / "pkg" / "step.py").write_text(STEP)
    assert _run("--jobs", "2") == first
