"""Settings named for the gate cache's dtype that are given the dtype of another setting
(RL002), and which names count as such settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from project_support import cli_rows, lint_in_project

from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.names import GateCacheNames


def _codes(body: str) -> list[tuple[str, int]]:
    return [(f.code, f.location.row) for f in Linter().check(f"import torch\n\n{body}")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def f(self):\n    self.log_decay_dtype = self.dtype\n", [("RL002", 4)]),
        ("def f(args):\n    return Spec(gate_dtype=args.cache_dtype)\n", [("RL002", 4)]),
        ("def f(x, dtype):\n    x.gate_ring_dtype = DTYPES.get(x.flag, dtype)\n", [("RL002", 4)]),
        ("def f(g_dtype, dtype):\n    g_dtype = g_dtype if g_dtype else dtype\n", [("RL002", 4)]),
        # the gate's own setting passed on, a float32 fallback, a float32-by-role setting
        ("def f(gate_dtype):\n    return Spec(gate_dtype=gate_dtype)\n", []),
        ("def f(x):\n    x.gate_dtype = DTYPES.get(x.flag, torch.float32)\n", []),
        ("def f(args):\n    return Spec(gate_dtype=args.state_dtype)\n", []),
        ("def f(args):\n    return Spec(gate_dtype=args.acc_dtype)\n", []),
        ("def f(self):\n    gate_dtype = self.config.replay_gate_dtype\n", []),
        # a known float32 value of another name is float32
        ("def f():\n    dtype = torch.float32\n    return Spec(gate_dtype=dtype)\n", []),
        # a call is no setting: what it returns is judged by the rules of allocations
        ("def f(args):\n    return Spec(gate_dtype=pick(args.dtype))\n", []),
        # the d and k rings' settings may borrow the model dtype
        ("def f(args):\n    return Spec(ring_dtype=args.dtype, k_dtype=args.dtype)\n", []),
    ],
)
def test_a_gate_dtype_setting_given_another_settings_dtype(
    body: str, expected: list[tuple[str, int]]
) -> None:
    assert _codes(body) == expected


def test_the_fix_makes_the_setting_float32() -> None:
    source = "import torch\n\ndef f(args):\n    return Spec(gate_dtype=args.cache_dtype)\n"
    (finding,) = Linter().check(source)
    assert "the dtype of another setting" in finding.message
    assert finding.fix is not None
    fixed = Linter().fix(source, unsafe=True)
    assert "Spec(gate_dtype=torch.float32)" in fixed.source
    assert not fixed.remaining


@pytest.mark.parametrize(
    ("name", "names_it"),
    [
        ("gate_dtype", True),
        ("g_dtype", True),
        ("log_decay_dtype", True),
        ("gate_ring_dtype", True),
        ("ring_log_decay_dtype", True),
        ("replay_gate_ring_dtype", True),
        ("wkv_gate_dtype", False),  # another kind of gate
        ("moe_gate_dtype", False),
        ("ring_dtype", False),
        ("cache_dtype", False),
        ("ring_g_dtype", False),
        ("GATE_DTYPE", False),
    ],
)
def test_which_names_are_gate_dtype_settings(name: str, names_it: bool) -> None:
    assert GateCacheNames().names_gate_dtype(name) is names_it


@pytest.mark.parametrize("setting_first", [True, False])
def test_one_finding_for_a_setting_that_reaches_the_gate_ring(setting_first: bool) -> None:
    setting = "def for_model(config, shape):\n    gate_dtype = config.dtype\n    return make(shape, gate_dtype)\n"
    helper = "def make(shape, gate_dtype):\n    return {'g_cache': torch.zeros(shape, dtype=gate_dtype)}\n"
    body = setting + "\n" + helper if setting_first else helper + "\n" + setting
    findings = _codes(body)
    assert [code for code, _ in findings] == ["RL002"]


_SPEC = (
    "from typing import NamedTuple\n\n"
    "class Spec(NamedTuple):\n"
    "    slots: int\n"
    "    gate_dtype: torch.dtype = {default}\n\n"
)


@pytest.mark.parametrize(
    ("tail", "default", "expected"),
    [
        # the module declares the setting once, with a literal default: RL001 judges that line
        ("", "torch.float32", []),
        ("", "torch.bfloat16", [("RL001", 7)]),
        # assigned somewhere: what it holds at the allocation is not the declaration's
        (
            "def tune(spec, dtype):\n    spec.gate_dtype = dtype\n",
            "torch.float32",
            [("RL002", 10), ("RL002", 14)],
        ),
        # a default that is not a literal dtype: the allocation is judged too
        ("", "DEFAULT_DTYPE", [("RL002", 7), ("RL002", 10)]),
    ],
)
def test_a_ring_allocated_with_a_declared_gate_dtype_setting(
    tail: str, default: str, expected: list[tuple[str, int]]
) -> None:
    body = _SPEC.format(default=default) + (
        "def allocate(spec, shape):\n"
        "    g_cache = torch.zeros(shape, dtype=spec.gate_dtype)\n"
        "    return g_cache\n\n"
    )
    assert sorted(_codes(body + tail)) == expected


def test_a_gate_dtype_setting_no_module_declares_is_judged_where_it_is_used() -> None:
    body = "def allocate(spec, shape):\n    return {'g_cache': torch.zeros(shape, dtype=spec.gate_dtype)}\n"
    assert _codes(body) == [("RL002", 4)]


def test_a_dtype_field_named_like_the_gate_cache_is_its_dtype_setting() -> None:
    body = (
        "from typing import NamedTuple\n\n"
        "class SlotDtypes(NamedTuple):\n"
        "    d_cache: torch.dtype = torch.bfloat16\n"
        "    g_cache: torch.dtype = torch.bfloat16\n\n"
        "class Pool:\n"
        "    def __init__(self, shape, dtypes=SlotDtypes()):\n"
        "        self.g_cache = torch.zeros(shape, dtype=dtypes.g_cache)\n"
        "    def grow(self, n):\n"
        "        self.g_cache = torch.cat([self.g_cache, self.g_cache.new_zeros(n)])\n"
    )
    # the field's default is reported; the allocation reading it, and the ring's own
    # reassignments, are not judged again
    assert _codes(body) == [("RL001", 7)]
    # a field named like the ring without a dtype annotation is no setting
    assert _codes(
        body.replace("g_cache: torch.dtype", "g_cache: int").replace(
            "torch.bfloat16\n\nclass Pool", "0\n\nclass Pool"
        )
    ) == [("RL002", 11)]


_LAYOUT = """
from typing import NamedTuple


class Layout(NamedTuple):
    key_dtype: torch.dtype = torch.bfloat16
    logdecay_dtype: torch.dtype = {default}

    def allocate(self, n):
        return dict(
            key_ring=torch.zeros(n, dtype=self.key_dtype),
            logdecay_ring=torch.zeros(n, dtype=self.logdecay_dtype),
        )


class ReplayCacheSpec(NamedTuple):
    dtype: torch.dtype = torch.bfloat16

    @property
    def logdecay_dtype(self) -> torch.dtype:
        return self.dtype


def from_spec(spec: {annotation}, n):
    logdecay_ring = torch.zeros(n, dtype=spec.logdecay_dtype)
    return logdecay_ring


def unrelated(spec: Int8Config):  # another function's parameter of that name
    return spec


def step(layout, spec, n):
    rings = layout.allocate(n)
    fused_recurrent_kda_replayssm_decode(
        d_cache=None, k_cache=rings["key_ring"], g_cache=rings["logdecay_ring"]
    )
    fused_recurrent_kda_replayssm_decode(d_cache=None, k_cache=None, g_cache=from_spec(spec, n))
"""


@pytest.mark.parametrize("annotation", ["Layout", "ReplayCacheSpec"])
@pytest.mark.parametrize("default", ["torch.bfloat16", "torch.float32"])
def test_a_setting_named_after_a_learned_ring(
    tmp_path: Path, annotation: str, default: str
) -> None:
    # `logdecay_dtype` beside the learned ring `logdecay_ring` is the gate ring's setting: a
    # non-float32 default is reported where it is declared, not at the allocations reading it;
    # the key ring's setting is not one. The getter of that name that hands out the spec's
    # one dtype is reported where it returns it, and the allocation reading it is not again.
    source = _LAYOUT.replace("{default}", default).replace("{annotation}", annotation)
    (tmp_path / "layout.py").write_text(f"import torch\n{source}", encoding="utf-8")
    expected = [("layout.py", 8, "RL001")] if default == "torch.bfloat16" else []
    expected.append(("layout.py", 22, "RL002"))
    assert cli_rows(tmp_path, "--isolated", "--no-cache", ".") == expected


def test_a_setting_given_an_imported_literal_is_reported_once(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/policy.py": "import torch\n\nWIRE_DTYPE = torch.bfloat16\n",
        "pkg/config.py": (
            "from dataclasses import dataclass\n\nimport torch\n\nfrom .policy import WIRE_DTYPE\n\n"
            "@dataclass(frozen=True)\nclass CacheConfig:\n"
            "    ring_dtype: torch.dtype = WIRE_DTYPE\n"
            "    gate_dtype: torch.dtype = WIRE_DTYPE\n"
        ),
    }
    found = lint_in_project(tmp_path, files, "pkg/config.py")
    # the literal the constant holds is RL001's; RL002 does not report the same setting again
    assert [(f.code, f.location.row) for f in found] == [("RL001", 10)]


def test_the_gate_field_of_an_annotated_record_is_judged_where_it_is_built(
    tmp_path: Path,
) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/datatypes.py": (
            "from typing import NamedTuple\n\nimport torch\n\n"
            "class RingDtypes(NamedTuple):\n"
            "    delta: torch.dtype\n"
            "    key: torch.dtype\n"
            "    logdecay: torch.dtype\n\n"
            "FP16 = RingDtypes(torch.float16, torch.float16, torch.float16)\n"
        ),
        "pkg/model.py": (
            "import torch\n\nfrom .datatypes import RingDtypes\n\n"
            "def setup(n, dtypes: RingDtypes):\n"
            "    g_cache = torch.zeros(n, dtype=dtypes.logdecay)\n"
            "    return g_cache\n\n"
            "def unannotated(n, dtypes):\n"
            "    g_cache = torch.zeros(n, dtype=dtypes.logdecay)\n"
            "    return g_cache\n"
        ),
    }
    assert [(f.code, f.location.row) for f in lint_in_project(tmp_path, files, "pkg/model.py")] == [
        ("RL002", 10)
    ]
    built = lint_in_project(tmp_path, files, "pkg/datatypes.py")
    assert [(f.code, f.location.row) for f in built] == [("RL001", 10)]
