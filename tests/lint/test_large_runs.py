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
from replaylint.lint.run import analysis, scanning

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
    monkeypatch.setattr(scanning, "_SEARCH_MIN_FILES", 10**9)
    monkeypatch.setattr(scanning, "_PARALLEL_MIN_SCANS", 10**9)
    monkeypatch.setattr(analysis, "_PARALLEL_MIN_BYTES", 10**12)


def test_every_path_reports_the_same(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as simple:
        _simple_paths(simple)
        expected = _run("--no-cache", "--jobs", "1")
    assert sum(name.startswith("buggy_") for name, *_ in expected) == 12
    assert any(name == "pool.py" and "step.py:5" in message for name, *_, message in expected)
    assert _run("--no-cache", "--jobs", "1") == expected  # grep, one process
    assert _run("--no-cache", "--jobs", "2") == expected  # grep, worker processes
    with monkeypatch.context() as analysis_in_workers:
        analysis_in_workers.setattr(analysis, "_PARALLEL_MIN_BYTES", 0)
        assert _run("--no-cache", "--jobs", "2") == expected  # and analysis in workers too
    with monkeypatch.context() as no_grep:
        no_grep.setattr(needle_search.shutil, "which", lambda name: None)
        no_grep.setattr(scanning, "_SEARCH_MIN_FILES", 10**9)
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


WRAPPER = textwrap.dedent(
    """
    from kernels import ops


    def decode(inputs, g_cache):
        return ops.kda_replayssm_decode(**inputs, g_cache=g_cache)
    """
).lstrip()
WRAPPED_STEP = textwrap.dedent(
    """
    from pkg.wrap import decode


    def step(pool, inputs):
        return decode(inputs, pool.decay_ring)
    """
).lstrip()


def _spy_on_early_analysis(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """(files started early, whether their reports were kept) for each early start."""
    seen: list[tuple[int, bool]] = []
    start, reports = analysis.EarlyAnalysis.start.__func__, analysis.EarlyAnalysis.reports

    def spied_start(cls: type[analysis.EarlyAnalysis], *args: object) -> object:
        started = start(cls, *args)
        if started is not None:
            seen.append((len(started._paths), False))
        return started

    def spied_reports(self: analysis.EarlyAnalysis, valid: bool) -> object:
        seen[-1] = (seen[-1][0], valid)
        return reports(self, valid)

    monkeypatch.setattr(analysis.EarlyAnalysis, "start", classmethod(spied_start))
    monkeypatch.setattr(analysis.EarlyAnalysis, "reports", spied_reports)
    monkeypatch.setattr(analysis, "_PARALLEL_MIN_BYTES", 0)
    return seen


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_early_analysis_reports_what_a_late_one_does(
    project: Path, monkeypatch: pytest.MonkeyPatch, wrapped: bool
) -> None:
    """A cold check starts analysing the files the first read let through while the wrapper
    stage runs: it keeps those reports when the stage teaches nothing, and analyses again with
    the names it teaches (here `decay_ring`, passed to a wrapper of the kernel) otherwise."""
    (project / "pkg" / "step.py").unlink()
    if wrapped:
        (project / "pkg" / "__init__.py").write_text("")
        (project / "pkg" / "wrap.py").write_text(WRAPPER)
        (project / "pkg" / "step.py").write_text(WRAPPED_STEP)
    with monkeypatch.context() as simple:
        _simple_paths(simple)
        expected = _run("--no-cache", "--jobs", "1")
    assert any(name == "pool.py" for name, *_ in expected) is wrapped
    with monkeypatch.context() as spying:
        seen = _spy_on_early_analysis(spying)
        assert _run("--no-cache", "--jobs", "2") == expected
    assert len(seen) == 1
    assert seen[0][0] >= 12  # every buggy_* file
    assert seen[0][1] is not wrapped
