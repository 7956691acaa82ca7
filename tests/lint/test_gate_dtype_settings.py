"""Settings named for the gate cache's dtype that are given the dtype of another setting
(RL002), and which names count as such settings."""

from __future__ import annotations

import textwrap
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
        # the fallback of an attribute the namespace may lack
        (
            "def f(args, dtype):\n    args.gate_dtype = getattr(args, 'gate_dtype', dtype)\n",
            [("RL002", 4)],
        ),
        ("def f(args):\n    args.gate_dtype = getattr(args, 'gate_dtype', torch.float32)\n", []),
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


_RING_POLICY = """
import torch

# (d/k rings, log-decay ring) for each --dtype
RING_DTYPES = {
    "float16": (torch.float16, torch.float32),
    "bfloat16": (torch.bfloat16, torch.bfloat16),
}
SAFE_DTYPES = {
    "float16": (torch.float16, torch.float32),
    "bfloat16": (torch.bfloat16, torch.float32),
}
"""

_RING_USER = """
import torch

from .policy import RING_DTYPES, SAFE_DTYPES


def known(cache_cls):
    ring_dtype, gate_dtype = RING_DTYPES["bfloat16"]
    return cache_cls(ring_dtype, gate_dtype=gate_dtype)


def any_mode(cache_cls, mode):
    ring_dtype, gate_dtype = RING_DTYPES[mode]
    return cache_cls(ring_dtype, gate_dtype=gate_dtype)


def half(cache_cls):
    ring_dtype, gate_dtype = RING_DTYPES["float16"]
    return cache_cls(ring_dtype, gate_dtype=gate_dtype)


def safe(cache_cls, mode):
    ring_dtype, gate_dtype = SAFE_DTYPES[mode]
    return cache_cls(ring_dtype, gate_dtype=gate_dtype)
"""


def test_a_gate_dtype_unpacked_from_a_table_of_another_module(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", "pkg/policy.py": _RING_POLICY, "pkg/user.py": _RING_USER}
    found = lint_in_project(tmp_path, files, "pkg/user.py")
    assert [(f.location.row, f.code) for f in found] == [(7, "RL001"), (12, "RL001")]
    assert "is set to torch.bfloat16 (from `RING_DTYPES` at " in found[0].message
    # a key not known here: the `"float16"` entry keeps it float32, the other does not
    assert "may be set to torch.bfloat16 (from `RING_DTYPES` at " in found[1].message


def test_a_gate_dtype_unpacked_from_a_table_of_the_module_is_judged_at_the_entry() -> None:
    source = _RING_POLICY + _RING_USER.split("from .policy import RING_DTYPES, SAFE_DTYPES\n")[1]
    findings = Linter().check(source, "m.py")
    # the `"bfloat16"` entry, for `known` and `any_mode` alike; nothing for `half` and `safe`
    assert sorted({(f.location.row, f.code) for f in findings}) == [(7, "RL001")]


def test_a_table_the_module_writes_to_is_not_read_as_its_literal() -> None:
    source = (
        _RING_POLICY
        + 'RING_DTYPES["bfloat16"] = (torch.bfloat16, torch.float32)\n'
        + _RING_USER.split("from .policy import RING_DTYPES, SAFE_DTYPES\n")[1]
    )
    findings = Linter().check(source, "m.py")
    assert [f for f in findings if f.location.row == 7] == []


_FILLED_RECORD = """
from dataclasses import dataclass

import torch


@dataclass
class StateDtypes:
    ring: torch.dtype = torch.bfloat16
    gate: torch.dtype | None = None
    state: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.gate is None:
            self.gate = {fill}


def allocate(shapes, dtypes: StateDtypes):
    return {{
        name: torch.zeros(shape, dtype=dtypes.gate if name == "g_cache" else dtypes.ring)
        for name, shape in shapes.items()
    }}
"""


@pytest.mark.parametrize(
    ("fill", "expected"),
    [
        # the gate left unset follows the d/k rings: reported where the record fills it in,
        # not again at the comprehension that reads the field
        ("self.ring", [(15, "RL002")]),
        ("torch.float32", []),
        ("self.state", []),  # float32 by its default, which no construction here overrides
    ],
)
def test_a_record_that_fills_its_gate_field_is_judged_where_it_does(
    fill: str, expected: list[tuple[int, str]]
) -> None:
    findings = Linter().check(_FILLED_RECORD.format(fill=fill), "m.py")
    assert [(f.location.row, f.code) for f in findings] == expected


_STATE_TABLE = """
import torch

# (ring, gate, checkpoint state) dtypes for each trainer precision
STATE_DTYPES = {
    "32": (torch.float32, torch.float32, torch.float32),
    "16-mixed": (torch.float16, torch.float16, torch.float32),
}
SHAPES = {"32": (4, 8, 16)}
"""

_STATE_USER = """
from .precision import SHAPES, STATE_DTYPES


def from_precision(precision, make):
    ring, gate, state = STATE_DTYPES[precision]
    return {"g_cache": make(ring, gate, state)}


def shapes(precision, make):
    d, g, s = SHAPES[precision]  # sizes, not dtypes: `g` is no gate dtype here
    return make(d, g, s)
"""


def test_the_gate_word_among_names_unpacked_from_a_tuple_of_dtypes(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", "pkg/precision.py": _STATE_TABLE, "pkg/user.py": _STATE_USER}
    found = lint_in_project(tmp_path, files, "pkg/user.py")
    assert [(f.location.row, f.code) for f in found] == [(5, "RL001")]
    assert "may be set to torch.float16 (from `STATE_DTYPES` at " in found[0].message


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        # keyword-only: every call sets it as `gate_dtype=...`, judged where it is written
        ("shape, *, gate_dtype=None", []),
        # a positional parameter may be passed without its name: the allocation is judged
        ("shape, gate_dtype=None", [("RL002", 4)]),
        ("shape, *, dtype=None", [("RL002", 4)]),  # not the gate's own setting
    ],
)
def test_a_keyword_only_gate_dtype_parameter_is_judged_at_its_calls(
    params: str, expected: list[tuple[str, int]]
) -> None:
    name = "dtype" if "*, dtype" in params else "gate_dtype"
    body = (
        f"def allocate({params}):\n"
        f"    g_cache = torch.zeros(shape, dtype=torch.float32 if {name} is None else {name})\n"
        "    return g_cache\n"
    )
    assert _codes(body) == expected


_HELD_POLICY = """
import torch

from .policy import RING_DTYPES


class Engine:
    def __init__(self, n, dtypes):
        self.n = n
        self.dtypes = dtypes

    def init_cache(self, cache_cls):
        ring_dtype, gate_dtype = self.dtypes
        return cache_cls(self.n, ring_dtype, gate_dtype=gate_dtype)


def get_engine(n, dtype: str):
    dtypes = RING_DTYPES[dtype]
    return Engine(n, dtypes)


def get_fp32_engine(n, dtype):
    return Engine(n, (dtype, torch.float32))
"""


def test_a_dtype_tuple_held_by_an_instance_is_judged_where_it_is_looked_up(
    tmp_path: Path,
) -> None:
    # `self.dtypes` is what `Engine(...)` is given: the table entry looked up in `get_engine`
    # (reported there), and a literal tuple whose gate element is float32
    files = {"pkg/__init__.py": "", "pkg/policy.py": _RING_POLICY, "pkg/engine.py": _HELD_POLICY}
    found = lint_in_project(tmp_path, files, "pkg/engine.py")
    assert [(f.location.row, f.code) for f in found] == [(17, "RL001")]
    assert "may be set to torch.bfloat16 (from `RING_DTYPES` at " in found[0].message


_PRECISION = """
import torch

MIXED_PRECISION_TO_DTYPE = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def rollout_cache_dtypes(mixed_precision, model_dtype):
    if mixed_precision == "no":
        return model_dtype, model_dtype, torch.float32
    compute = MIXED_PRECISION_TO_DTYPE[mixed_precision]
    return compute, compute, compute


def kept_cache_dtypes(mixed_precision, model_dtype):
    if mixed_precision == "no":
        return model_dtype, model_dtype, torch.float32
    compute = MIXED_PRECISION_TO_DTYPE[mixed_precision]
    return compute, compute, torch.float32
"""

_ACCELERATOR = """
class Accelerator:
    def __init__(self, mixed_precision="no"):
        self.mixed_precision = mixed_precision
"""

_TRAINER = """
import torch

from pkg.accelerate import Accelerator
from pkg.utils import kept_cache_dtypes, rollout_cache_dtypes


class Trainer:
    def __init__(self, mixed_precision, pool_cls):
        self.accelerator = Accelerator(mixed_precision)
        delta_dtype, key_dtype, decay_dtype = rollout_cache_dtypes(self.accelerator.mixed_precision, torch.bfloat16)
        self.pool = pool_cls(delta_dtype, key_dtype, gate_dtype=decay_dtype)

    def spare(self, pool_cls):
        delta_dtype, key_dtype, decay_dtype = kept_cache_dtypes(self.accelerator.mixed_precision, torch.bfloat16)
        return pool_cls(delta_dtype, key_dtype, gate_dtype=decay_dtype)
"""


def test_a_local_bound_once_in_a_branching_helper_is_read_at_its_return(
    tmp_path: Path,
) -> None:
    # `compute` is bound once, then returned under a test on the mode; the mode of the call is
    # an attribute of an instance of a project class that its constructor sets from an
    # argument, so any entry of the table may be the one returned
    files = {
        "pkg/__init__.py": "",
        "pkg/accelerate.py": _ACCELERATOR,
        "pkg/utils.py": _PRECISION,
        "pkg/trainer.py": _TRAINER,
    }
    found = lint_in_project(tmp_path, files, "pkg/trainer.py")
    assert [(f.code, f.location.row) for f in found] == [("RL001", 10)]
    assert "`decay_dtype`, named for the gate cache's dtype, may be set to" in found[0].message
    assert "torch.bfloat16 or torch.float16" in found[0].message


_TEXT_SETTINGS = """
import os

import torch

STR_TO_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "fp32": torch.float32}


def transfer_dtypes(default="bfloat16"):
    ring_dtype = os.environ.get("KV_TRANSFER_DTYPE", default)
    decay_dtype = os.environ.get("KV_TRANSFER_DECAY_DTYPE", ring_dtype)
    return STR_TO_DTYPE[ring_dtype], STR_TO_DTYPE[decay_dtype]


def short_names():
    cache_dtype = os.environ.get("RING_DTYPE", "bf16")
    gate_dtype = os.environ.get("GATE_DTYPE", cache_dtype)
    return STR_TO_DTYPE[gate_dtype]
"""


def test_a_setting_that_holds_a_dtype_name_is_fixed_with_a_name(tmp_path: Path) -> None:
    # the text is parsed later: `torch.float32` in its place would fail at `STR_TO_DTYPE[...]`
    torch = pytest.importorskip("torch")
    found = Linter().check(_TEXT_SETTINGS)
    assert [(f.code, f.location.row) for f in found] == [("RL002", 11), ("RL002", 17)]
    fixed = Linter().fix(_TEXT_SETTINGS, unsafe=True).source
    assert 'os.environ.get("KV_TRANSFER_DECAY_DTYPE", "float32")' in fixed
    assert 'os.environ.get("GATE_DTYPE", "fp32")' in fixed
    namespace: dict[str, object] = {}
    exec(compile(fixed, "fixed.py", "exec"), namespace)
    assert namespace["transfer_dtypes"]() == (torch.bfloat16, torch.float32)  # type: ignore[operator]
    assert namespace["short_names"]() == torch.float32  # type: ignore[operator]


def test_a_dtype_table_of_the_gate_entry_beside_entries_kept_as_they_are() -> None:
    # `None`: keep the buffer's own dtype; the gate buffer's entry is a dtype written out
    source = """
        class PinnedSlotCache:
            storage_dtypes = {"ssm_state": None, "g_cache": None}

        class CompactSlotCache(PinnedSlotCache):
            storage_dtypes = {"ssm_state": None, "g_cache": torch.float16}

        NOT_A_TABLE = {"ssm_state": None, "g_cache": make_ring()}
        """
    found = _codes(textwrap.dedent(source))
    assert found == [("RL001", 8)]


def test_a_wire_format_field_that_names_the_gate_dtype_as_text() -> None:
    source = """
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class WireFormat:
            delta: str = "bfloat16"
            key: str = "bfloat16"
            g_cache: str = "float32"

        @dataclass(frozen=True)
        class HalfWireFormat(WireFormat):
            delta: str = "float16"
            key: str = "float16"
            g_cache: str = "float16"
        """
    found = Linter().check(f"import torch\n\n{textwrap.dedent(source)}")
    assert [(f.code, f.location.row) for f in found] == [("RL001", 16)]
    assert '"float16" (torch.float16)' in found[0].message
    fixed = Linter().fix(f"import torch\n\n{textwrap.dedent(source)}", unsafe=True).source
    assert 'g_cache: str = "float32"\n' in fixed.split("HalfWireFormat")[1]


def test_a_dtype_picked_by_a_setting_of_the_gate_is_judged_at_that_setting() -> None:
    # `opt.decay_dtype` is the gate's own setting: where it is declared and set decides
    source = """
        STR2DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

        class Cache:
            def __init__(self, shape, decay_dtype=torch.float32):
                self.decay_dtype = decay_dtype
                self.g_cache = torch.zeros(shape, dtype=self.decay_dtype)

        def from_opt(opt, shape):
            return Cache(shape, decay_dtype=STR2DTYPE[opt.decay_dtype])

        """
    assert _codes(textwrap.dedent(source)) == []
    # a mode that is no setting of the gate: the keyword is reported where it picks the entry
    other = textwrap.dedent(source) + (
        "\ndef from_mode(opt, shape):\n    return Cache(shape, decay_dtype=STR2DTYPE[opt.mode])\n"
    )
    row = 3 + other.splitlines().index("    return Cache(shape, decay_dtype=STR2DTYPE[opt.mode])")
    assert ("RL002", row) in _codes(other)


def test_a_gate_setting_picked_through_another_modules_table_is_judged_there(
    tmp_path: Path,
) -> None:
    # the table's entries are read through the project index (literal dtypes, RL001's kind);
    # the constructor's keyword is picked by `opt.decay_dtype`, judged where that is declared
    files = {
        "pkg/__init__.py": "",
        "pkg/misc.py": """
            import torch

            STR2DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

            def str2dtype(name):
                return STR2DTYPE[name]
            """,
        "pkg/decoder.py": """
            import torch

            from pkg import misc

            class Decoder:
                def __init__(self, shape, decay_dtype=torch.float32):
                    self.decay_dtype = decay_dtype
                    self.shape = shape

                @classmethod
                def from_opt(cls, opt):
                    return cls(opt.shape, decay_dtype=misc.str2dtype(opt.decay_dtype))

                def init_state(self):
                    return {"g_cache": torch.zeros(self.shape, dtype=self.decay_dtype)}

            def from_mode(opt):
                return Decoder(opt.shape, decay_dtype=misc.str2dtype(opt.mode))
            """,
    }
    found = lint_in_project(tmp_path / "with_mode", files, "pkg/decoder.py")
    rows = [f.location.row for f in found]
    assert 13 not in rows  # `from_opt`: `opt.decay_dtype` picks it
    assert 18 in rows  # `from_mode`: a mode that is no setting of the gate
    files["pkg/decoder.py"] = files["pkg/decoder.py"].split("            def from_mode")[0]
    assert lint_in_project(tmp_path / "without", files, "pkg/decoder.py") == []
