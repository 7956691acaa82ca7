"""The pre-filter must never hide a finding: every corpus gives identical results with it on and
off (findings and fixes), and it must actually skip files that cannot hold one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from replaylint.lint.config.settings import Settings
from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.entry_points import DEFAULT_ENTRY_POINTS, EntryPoint
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.prefilter import Relevance
from replaylint.lint.model import Finding, SourceError
from replaylint.lint.rules.registry import ALL_RULES

ROOT = Path(__file__).resolve().parents[2]


def _corpus() -> list[tuple[str, str]]:
    """Every example, fixture and bundled file we have, as (name, text)."""
    texts: list[tuple[str, str]] = []
    for rule in ALL_RULES:
        for number, valid in enumerate(rule.VALID):
            texts.append((f"{rule.CODE}-valid-{number}", valid.source))
        for number, invalid in enumerate(rule.INVALID):
            texts.append((f"{rule.CODE}-invalid-{number}", invalid.source))
            if invalid.fixed_source is not None:
                texts.append((f"{rule.CODE}-fixed-{number}", invalid.fixed_source))
    for folder in ("tests/lint/fixtures", "examples", "replaylint", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            texts.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    return texts


CORPUS = _corpus()


def _results(linter: Linter, name: str, text: str) -> tuple[list[Finding], str] | str:
    try:
        return linter.check(text, name), linter.fix(text, name, unsafe=True).source
    except SourceError as error:
        return f"error: {error.message}"


def test_corpus_is_substantial() -> None:
    assert len(CORPUS) > 150
    assert sum(bool(Linter(prefilter=False).check(t, n)) for n, t in CORPUS) > 40


@pytest.mark.parametrize(("name", "text"), CORPUS, ids=[name for name, _ in CORPUS])
def test_prefilter_changes_no_result(name: str, text: str) -> None:
    filtered, full = Linter(prefilter=True), Linter(prefilter=False)
    if isinstance(_results(full, name, text), str):
        return  # unparsable: the pre-filter may skip a file the full analysis cannot read
    assert _results(filtered, name, text) == _results(full, name, text)


def test_prefilter_with_learned_names_and_custom_patterns() -> None:
    settings = Settings(
        gate_cache_patterns=("decay_ring",),
        entry_points=(*DEFAULT_ENTRY_POINTS, EntryPoint("my_step", "gates", 2)),
    )
    learned = {"replay_gates": LearnedFrom("ops.py", 3, "my_step")}
    names = GateCacheNames(settings.gate_cache_patterns).with_learned(learned)
    source = textwrap.dedent(
        """
        import torch
        replay_gates = torch.zeros(4, dtype=torch.bfloat16)
        decay_ring = torch.zeros(4, dtype=torch.half)
        my_step(a, b, torch.zeros(4, dtype=torch.half))
        """
    )
    filtered = Linter(settings, gate_caches=names, prefilter=True).check(source, "x.py")
    full = Linter(settings, gate_caches=names, prefilter=False).check(source, "x.py")
    assert filtered == full
    assert len(full) >= 2


@pytest.mark.parametrize(
    "text",
    [
        "import torch\nx = torch.zeros(3, dtype=torch.bfloat16)\n",
        "kv_cache = allocate()\nname = 'kv_cache'\n",
        "def f(g, gate, log_g):\n    return g\n",
        "x = (\n",  # unparsable, but it cannot hold a finding: not parsed, not reported
    ],
)
def test_irrelevant_text_is_skipped(text: str) -> None:
    relevance = Relevance(GateCacheNames(), DEFAULT_ENTRY_POINTS)
    assert not relevance.may_hold_finding(text)
    assert Linter().check(text, "x.py") == []


def test_first_stage_on_bytes_skips_most_text() -> None:
    relevance = Relevance(GateCacheNames(), DEFAULT_ENTRY_POINTS)
    assert not relevance.may_hold_finding_raw(b"import torch\nkv_cache = torch.zeros(3)\n")
    # A string ending like a gate-cache name passes the cheap first stage; the second decides.
    assert relevance.may_hold_finding_raw(b"name = 'kv_cache'\n")
    assert not relevance.may_hold_finding("name = 'kv_cache'\n")


@pytest.mark.parametrize(
    "text",
    [
        "self.g_cache = 1",
        "self.LAYER0_G_CACHES = 1",
        "caches['replayssm_g'] = 1",
        'caches = {f"{kind}_cache": 1 for kind in KINDS}',
        'name = kind + "_cache"',
        "out = ops.fused_kda_replayssm_decode(*args)",
    ],
)
def test_relevant_text_is_kept(text: str) -> None:
    relevance = Relevance(GateCacheNames(), DEFAULT_ENTRY_POINTS)
    assert relevance.may_hold_finding(text)
    assert relevance.may_hold_finding_raw(text.encode())


# The first stage over a whole tree runs in grep (needle_search); it must pick exactly the files
# the Python stage picks, whatever their case, encoding, line endings or binary content.
_TREE_FILES: dict[str, bytes] = {
    "lower.py": b"g_cache = 1\n",
    "upper.py": b"LAYER_G_CACHE = 1\n",
    "mixed.py": b"x = self.Replayssm_G\n",
    "built.py": b'name = f"{k}_CACHE\'"\n',
    "entry.py": b"ops.kda_replayssm_decode(a, b)\n",
    "crlf.py": b"a = 1\r\nb = gate_cache\r\n",
    "nul.py": b"\x00\x01g_cache\xff\n",
    "latin1.py": b"# -*- coding: latin-1 -*-\nname = '\xe9'\nkv_cache = 1\n",
    "plain.py": b"kv_cache = torch.zeros(3)\n",
    "empty.py": b"",
    "-leading-dash.py": b"g_cache = 1\n",
    "new\nline.py": b"replayssm_g = 1\n",
    "spaces in name.py": b"nothing here\n",
}


@pytest.mark.parametrize("grep", [True, False], ids=["grep", "python"])
def test_tree_search_matches_the_python_first_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grep: bool
) -> None:
    from replaylint.lint.gatecache import grep as needle_search

    if not grep:
        monkeypatch.setattr(needle_search.shutil, "which", lambda name: None)
    elif needle_search.shutil.which("grep") is None:
        pytest.skip("no grep here")
    relevance = Relevance(GateCacheNames(), DEFAULT_ENTRY_POINTS)
    assert relevance.byte_needles is not None
    paths = []
    for name, data in _TREE_FILES.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    paths.append(str(tmp_path / "missing.py"))  # unreadable: counted in, its reader reports it
    found = needle_search.files_containing(paths, relevance.byte_needles, jobs=2)
    expected = {
        str(tmp_path / n) for n, d in _TREE_FILES.items() if relevance.may_hold_finding_raw(d)
    }
    assert found == expected | {str(tmp_path / "missing.py")}
    assert {Path(p).name for p in expected} == {
        "lower.py", "upper.py", "mixed.py", "built.py", "entry.py", "crlf.py", "nul.py",
        "-leading-dash.py", "new\nline.py",
    }  # fmt: skip


def test_tree_search_splits_long_command_lines(tmp_path: Path) -> None:
    from replaylint.lint.gatecache import grep as needle_search

    names = [f"{'x' * 200}{number}.py" for number in range(1200)]  # about 240 kB of arguments
    for number, name in enumerate(names):
        (tmp_path / name).write_bytes(b"g_cache\n" if number % 7 == 0 else b"pass\n")
    paths = [str(tmp_path / name) for name in names]
    found = needle_search.files_containing(paths, [b"g_cache"], jobs=1)
    assert found == {p for number, p in enumerate(paths) if number % 7 == 0}


def test_a_dtype_setting_named_after_a_learned_ring_passes_the_first_stage() -> None:
    # `forget_dtype` names no gate cache, but a learned `forget_ring` makes it the gate's setting
    learned = {"forget_ring": LearnedFrom("ops.py", 3, "kda_replayssm_decode")}
    names = GateCacheNames().with_learned(learned)
    source = textwrap.dedent(
        """
        import torch

        def policy(profile):
            return Precision(ring_dtype=torch.bfloat16, forget_dtype=torch.bfloat16)
        """
    )
    relevance = Relevance(names, DEFAULT_ENTRY_POINTS)
    assert relevance.may_hold_finding(source)
    assert not Relevance(GateCacheNames(), DEFAULT_ENTRY_POINTS).may_hold_finding(source)
    assert [f.code for f in Linter(gate_caches=names).check(source, "x.py")] == ["RL001"]
