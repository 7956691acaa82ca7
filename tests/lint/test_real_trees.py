"""replaylint on sglang's real ReplaySSM code (downloaded from PyPI; skipped without network).

The full run over sglang and fla-core, with timings, is ``benchmarks/real_trees.py`` (recorded
in docs/real_trees.md); this test keeps its two claims checked: the files that implement
ReplaySSM give no finding, and sglang's state pool with its gate ring broken gives exactly the
expected finding at the expected line.

It downloads a 40 MB wheel and lints ~45,000 lines (about a minute on two cores), so it runs only
when asked: ``REPLAYLINT_REAL_TREES=1 pytest tests/lint/test_real_trees.py``. Set
``REPLAYLINT_REAL_TREES_CACHE`` to a folder to reuse the download.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
from benchmark_support import load_benchmark

from replaylint.lint.engine import Linter
from replaylint.lint.run.modules import RunModules

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("REPLAYLINT_REAL_TREES"),
        reason="downloads sglang and takes a minute: set REPLAYLINT_REAL_TREES=1 to run it",
    ),
]


@pytest.fixture(scope="module")
def real_trees() -> types.ModuleType:
    return load_benchmark("real_trees.py")


@pytest.fixture(scope="module")
def sglang(real_trees: types.ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("REPLAYLINT_REAL_TREES_CACHE")
    folder = Path(cache) if cache else tmp_path_factory.mktemp("real-trees")
    fetched = real_trees.fetch("sglang", folder)
    if fetched is None:
        pytest.skip("could not download the sglang wheel (no network?)")
    source: Path = fetched[0]
    if not (source / real_trees.POOL).exists():
        pytest.skip(f"this sglang wheel has no {real_trees.POOL}")
    return source


def test_replayssm_code_gives_no_finding(sglang: Path) -> None:
    files = sorted(
        path
        for path in sglang.rglob("*.py")
        if "replayssm" in path.read_text(encoding="utf-8", errors="replace")
    )
    assert len(files) >= 5, "expected sglang's ReplaySSM kernels, backends and pool"
    texts = [(str(path), path.read_text(encoding="utf-8")) for path in files]
    linter = Linter()
    linter.learn(texts)
    findings = [finding for name, text in texts for finding in linter.check(text, name)]
    assert findings == []


def test_replayssm_code_gives_no_finding_with_the_project_index(
    sglang: Path, real_trees: types.ModuleType
) -> None:
    # as a run over the tree does: names imported from sglang's own modules are resolved
    modules = RunModules(sorted(sglang.rglob("*.py")), dict, None)
    files = sorted(
        path
        for path in sglang.rglob("*.py")
        if "replayssm" in path.read_text(encoding="utf-8", errors="replace")
    )
    texts = [(str(path), path.read_text(encoding="utf-8")) for path in files]
    linter = Linter(project=modules.index)
    linter.learn(texts)
    findings = [finding for name, text in texts for finding in linter.check(text, name)]
    assert findings == []
    assert modules.index.module_of(str(sglang / real_trees.POOL)) is not None


def test_a_broken_gate_ring_in_the_real_pool_is_found(
    sglang: Path, real_trees: types.ModuleType
) -> None:
    results = real_trees.run_mutations(sglang, Linter().gate_caches)
    assert [m.code for m in results] == ["RL002", "RL003", "RL004"]
    for mutation in results:
        assert mutation.found == [(mutation.expected_row, mutation.code)], mutation.description
