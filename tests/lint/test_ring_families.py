"""What the analysis learns from how code names and passes its three rings: gate-cache names that
follow from the d and k rings' names beside them, arguments that functions of the module take as
their gate cache, and dtype tables keyed by cache name."""

from __future__ import annotations

import pytest

from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.siblings import sibling_names

_LEARNED = GateCacheNames().with_learned({"alpha_buffer": LearnedFrom("layer.py", 3, "decode")})


def _codes(source: str) -> list[tuple[int, str]]:
    return [(f.location.row, f.code) for f in Linter(gate_caches=_LEARNED).check(source, "m.py")]


@pytest.mark.parametrize(
    ("text", "derived"),
    [
        ("mm.alpha_buffer; mm.delta_buffer; rows = (delta_rows, key_rows, alpha_rows)", ["alpha_rows"]),
        ("mm.alpha_buffer\ndelta = a\nkey = b\nalpha = c\n", ["alpha"]),
        ("mm.alpha_buffer\nself.spec_delta = a\nself.spec_key = b\nself.spec_alpha = c\n", ["spec_alpha"]),
        ("g_cache = x\nd_rows = a\nk_rows = b\ng_rows = c\n", ["g_rows"]),
    ],
)  # fmt: skip
def test_a_name_beside_its_d_and_k_siblings_is_a_gate_cache(text: str, derived: list[str]) -> None:
    assert sorted(sibling_names(_LEARNED, text, "m.py")) == derived


@pytest.mark.parametrize(
    "text",
    [
        # no k sibling
        "mm.alpha_buffer\ndelta_rows = a\nalpha_rows = c\n",
        # metadata words name no ring
        "mm.alpha_buffer\ndelta_shape = a\nkey_shape = b\nalpha_shape = c\n",
        # `d` and `k` alone are too weak beside a one-word name
        "g_cache = x\nd = a\nk = b\nlog = c\n",
        # the projection beside q/k/v projections is no ring: no d sibling
        "g_cache = x\nq_proj = a\nk_proj = b\nv_proj = c\ng_proj = d\n",
        # the family's shared word is never the gate's own
        "g_cache = x\nd_cache = a\nk_cache = b\ncache = c\n",
        # nor is a word that qualifies it in the middle (`move` of `alpha_move_buffer`)
        "self.alpha_move_buffer = a\nfor name in ('delta', 'key'):\n    move = b\n",
        # one step's entries, written into the rings, are not rings
        "g_cache = x\ndef update(d_row, k_row, g_row):\n    pass\n",
        "mm.alpha_buffer\ndelta_step = a\nkey_step = b\nalpha_step = c\n",
    ],
)
def test_no_gate_cache_without_both_siblings_and_a_ring_word(text: str) -> None:
    assert sibling_names(_LEARNED, text, "m.py") == {}


@pytest.mark.parametrize(
    ("learned", "text"),
    [
        # the word the d and k rings share with the gate ring (`buf` of `decay_buf` beside
        # `d_buf` and `k_buf`) is not its own
        (
            "decay_buf",
            "self.decay_buf = a\nself.d_buf = b\nself.k_buf = c\n"
            "rows = {'delta': d, 'key': k}\nfor buf in rings:\n    pass\n",
        ),
        # nor is a word too generic to name the gate ring (`log` of `alpha_log`)
        ("alpha_log", "self.alpha_log = a\nrows = {'delta': d, 'key': k}\nlog = x\n"),
    ],
)
def test_a_shared_or_generic_word_of_the_gate_ring_makes_no_sibling(
    learned: str, text: str
) -> None:
    names = GateCacheNames().with_learned({learned: LearnedFrom("layer.py", 3, "decode")})
    assert sibling_names(names, text, "m.py") == {}


def test_the_word_the_siblings_replace_is_the_gate_rings_own() -> None:
    """Beside `snapshot_kda_delta_ring` and `snapshot_kda_key_ring`, the gate ring's own word in
    `snapshot_kda_decay_ring` is `decay`, in the middle: `snapshot`, a mapping loaded from a
    file, is not a ring, though `delta` and `key` are names of the file too."""
    names = GateCacheNames().with_learned(
        {"snapshot_kda_decay_ring": LearnedFrom("layer.py", 3, "", "a ring's place")}
    )
    text = (
        "self.snapshot_kda_delta_ring = a\nself.snapshot_kda_key_ring = b\n"
        "self.snapshot_kda_decay_ring = c\nsnapshot = torch.load(path)\ndelta, key = d, k\n"
        "host_decay = h\nhost_delta = i\nhost_key = j\n"
    )
    assert sorted(sibling_names(names, text, "m.py")) == ["host_decay"]


def test_a_derived_name_is_reported_with_why() -> None:
    source = (
        "import torch\n\nclass Graph:\n    def __init__(self, mm, shape):\n"
        "        self.delta_rows = torch.zeros(shape, dtype=mm.delta_buffer.dtype)\n"
        "        self.key_rows = torch.zeros(shape, dtype=mm.key_buffer.dtype)\n"
        "        self.alpha_rows = torch.zeros(shape, dtype=torch.bfloat16)\n"
        "        self.alpha_source = mm.alpha_buffer\n"
    )
    findings = Linter(gate_caches=_LEARNED).check(source, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(7, "RL001")]
    assert "named like the gate ring `alpha_buffer` beside `delta_rows` and `key_rows`" in (
        findings[0].message
    )


# --------------------------------------------------------------- gate-cache parameters
_CACHE = """\
import torch


class ReplayCache:
    @classmethod
    def from_tensors(cls, d_ring, k_ring, log_alpha):
        cache = cls()
        cache.log_alpha = log_alpha
        return cache


def fork(d_rows, k_rows):
    fresh = torch.empty_like(d_rows)
    return ReplayCache.from_tensors(d_rows, k_rows, fresh)
"""


def test_an_argument_for_a_gate_cache_parameter_of_the_module_is_a_gate_cache() -> None:
    names = GateCacheNames().with_learned({"log_alpha": LearnedFrom("m.py", 1, "f")})
    findings = Linter(gate_caches=names).check(_CACHE, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(13, "RL003")]
    assert "log_alpha=fresh" in findings[0].message


@pytest.mark.parametrize(
    ("body", "reported"),
    [
        ("return g_cache if g_cache.dtype == torch.float32 else g_cache.float()", False),
        ("self.g_cache = g_cache", True),
    ],
)
def test_a_helper_that_converts_its_gate_argument_takes_any_dtype(
    body: str, reported: bool
) -> None:
    source = (
        f"import torch\n\ndef adopt(self, g_cache):\n    {body}\n\n"
        "adopt(pool, torch.zeros(4, dtype=torch.bfloat16))\n"
    )
    assert _codes(source) == ([(6, "RL001")] if reported else [])


def test_a_gate_cache_passed_on_by_its_own_name_is_checked_once() -> None:
    source = (
        "import torch\nfrom typing import NamedTuple\n\n"
        "class Seed(NamedTuple):\n    d_cache: torch.Tensor\n    g_cache: torch.Tensor\n\n"
        "def seed(d):\n    g_cache = torch.zeros(4, dtype=torch.bfloat16)\n"
        "    return Seed(d, g_cache), {'g_cache': g_cache}, dict(g_cache=g_cache)\n"
    )
    assert _codes(source) == [(9, "RL001")]


# --------------------------------------------------------------- dtype tables
@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("torch.bfloat16", [(6, "RL001")]),
        ("dtype", [(6, "RL002")]),
        ("torch.float32", []),
    ],
)
def test_the_gate_entry_of_a_dtype_table_is_the_gate_rings_dtype(
    entry: str, expected: list[tuple[int, str]]
) -> None:
    source = (
        "import torch\n\ndef cache_dtypes(dtype):\n"
        '    return {\n        "state": torch.float32,\n'
        f'        "g_cache": {entry},\n'
        '        "d_cache": dtype,\n    }\n'
    )
    assert _codes(source) == expected
    if expected:
        fixed = Linter().fix(source, "m.py", unsafe=True).source
        assert '"g_cache": torch.float32,' in fixed


def test_a_dict_of_tensors_is_no_dtype_table() -> None:
    source = "import torch\n\ndef rings(d, g):\n    return {'d_cache': d, 'g_cache': g}\n"
    assert _codes(source) == []


# --------------------------------------------------------------- settings named for the gate dtype
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("class Cfg:\n    gate_dtype: torch.dtype = torch.bfloat16\n", [(3, "RL001")]),
        ("def shapes(n, g_dtype=torch.half):\n    return n\n", [(2, "RL001")]),
        ("cfg = Config(gate_ring_dtype=torch.bfloat16)\n", [(2, "RL001")]),
        ("def f():\n    g_cache_dtype = torch.float16\n", [(3, "RL001")]),
        ("class Cfg:\n    gate_dtype: torch.dtype = torch.float32\n", []),
        ("def f():\n    ssm_dtype = torch.bfloat16\n    orig_dtype = torch.bfloat16\n", []),
        ("def f():\n    gate_dtype = torch.int32\n", []),  # not a floating dtype: no ring's
        # a module's policy constant is reported where a ring is made with it
        ("GATE_RING_DTYPE = torch.bfloat16\n", []),
    ],
)
def test_a_setting_named_for_the_gate_dtype_is_checked(
    source: str, expected: list[tuple[int, str]]
) -> None:
    # the pre-filter lets these files through although they name no gate cache
    assert _codes(f"import torch\n{source}") == expected
