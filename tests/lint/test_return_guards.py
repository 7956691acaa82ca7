"""Dtype policies of another module that branch on the ring they are asked about: a call that
passes the ring's name gets only the returns its tests allow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from project_support import fix_in_project, lint_in_project

from replaylint.lint.project.return_guards import return_guards

_POLICY = """
import torch


def ring_storage_dtype(precision, ring):
    if ring not in ("state", "delta", "key", "gate"):
        raise ValueError(ring)
    if ring == "state":
        return torch.float32
    return torch.bfloat16


def part_dtype(ring):
    if ring in ("gate", "state"):
        return torch.float32
    return torch.bfloat16
"""


def _findings(tmp_path: Path, body: str) -> list[tuple[int, str, str]]:
    files = {"pkg/__init__.py": "", "pkg/policy.py": _POLICY, "pkg/pool.py": body}
    return [
        (f.location.row, f.code, f.message) for f in lint_in_project(tmp_path, files, "pkg/pool.py")
    ]


_HEADER = "import torch\n\nfrom .policy import part_dtype, ring_storage_dtype\n\n\n"


def test_the_return_the_ring_name_reaches_is_the_one_judged(tmp_path: Path) -> None:
    body = _HEADER + (
        "def make(shape, precision):\n"
        '    d_cache = torch.zeros(shape, dtype=ring_storage_dtype(precision, "delta"))\n'
        '    g_cache = torch.zeros(shape, dtype=ring_storage_dtype(precision, "gate"))\n'
        "    return d_cache, g_cache\n"
    )
    found = _findings(tmp_path, body)
    assert [(row, code) for row, code, _ in found] == [(8, "RL001")]
    assert "torch.bfloat16" in found[0][2]
    assert "ring_storage_dtype" in found[0][2]


def test_a_policy_that_keeps_the_gate_ring_float32_is_no_finding(tmp_path: Path) -> None:
    body = _HEADER + (
        "def make(shape):\n"
        '    d_cache = torch.zeros(shape, dtype=part_dtype("delta"))\n'
        '    g_cache = torch.zeros(shape, dtype=part_dtype("gate"))\n'
        "    return d_cache, g_cache\n"
    )
    assert _findings(tmp_path, body) == []


def test_a_ring_name_not_known_here_keeps_every_return(tmp_path: Path) -> None:
    body = _HEADER + (
        "def make(shape, ring):\n"
        "    g_cache = torch.zeros(shape, dtype=part_dtype(ring))\n"
        "    return g_cache\n"
    )
    found = _findings(tmp_path, body)
    assert [code for _, code, _ in found] == ["RL001"]
    assert "torch.bfloat16" in found[0][2]


@pytest.mark.parametrize(
    "setting",
    [
        'gate_dtype = ring_storage_dtype(precision, "gate")',
        'gate_dtype = given.gate if given is not None else ring_storage_dtype(precision, "gate")',
    ],
)
def test_a_setting_named_for_the_gate_dtype_is_judged_per_branch(
    tmp_path: Path, setting: str
) -> None:
    body = _HEADER + (
        "def configure(shape, precision, given=None):\n"
        f"    {setting}\n"
        "    return Pool(shape, gate_dtype=gate_dtype)\n"
    )
    found = _findings(tmp_path, body)
    assert [(row, code) for row, code, _ in found] == [(7, "RL001")]
    assert "`gate_dtype`, named for the gate cache's dtype" in found[0][2]
    files = {"pkg/__init__.py": "", "pkg/policy.py": _POLICY, "pkg/pool.py": body}
    fixed = fix_in_project(tmp_path, files, "pkg/pool.py")
    assert 'ring_storage_dtype(precision, "gate")' not in fixed
    assert "torch.float32" in fixed
    assert "given.gate" in fixed or "given" not in setting


def _name_value(node: ast.expr) -> list[str]:
    return ["name", ast.unparse(node)]


def test_guards_are_read_from_ifs_that_return_and_from_else_branches() -> None:
    function = ast.parse(
        "def f(ring, n):\n"
        '    if ring == "state":\n'
        "        return 1\n"
        "    elif ring not in ('gate',):\n"
        "        return 2\n"
        "    if n > 3:\n"
        "        return 3\n"
        "    return 4\n"
    ).body[0]
    assert isinstance(function, ast.FunctionDef)
    guards = return_guards(function.body, {"ring", "n"}, set(), _name_value)
    by_value = {
        node.value.value: guards[id(node)]  # type: ignore[union-attr]
        for node in ast.walk(function)
        if isinstance(node, ast.Return)
    }
    assert by_value[1] == [["param_is", "ring", ["state"], True]]
    assert by_value[2] == [
        ["param_is", "ring", ["state"], False],
        ["param_is", "ring", ["gate"], False],
    ]
    # `n > 3` is no string test: the return stays possible whatever it says
    assert by_value[3] == [
        ["param_is", "ring", ["state"], False],
        ["param_is", "ring", ["gate"], True],
    ]
    assert by_value[4] == by_value[3]
    # a parameter the body rebinds is not tested
    assert return_guards(function.body, {"ring"}, {"ring"}, _name_value) == {
        id(node): [] for node in ast.walk(function) if isinstance(node, ast.Return)
    }


_ENUM_POLICY = """
import enum

import torch


class Precision(enum.Enum):
    FP32 = "fp32"
    BF16 = "amp_bf16"


PRECISION_TO_DTYPE = {Precision.FP32: torch.float32, Precision.BF16: torch.bfloat16}
ALL_FP32 = {Precision.FP32: torch.float32, Precision.BF16: torch.float32}


def model_dtype(precision):
    return PRECISION_TO_DTYPE[Precision(precision)]


def kept_dtype(precision):
    return ALL_FP32[Precision(precision)]
"""


@pytest.mark.parametrize(("policy", "reported"), [("model_dtype", True), ("kept_dtype", False)])
def test_a_table_keyed_by_enum_members_may_give_any_of_its_values(
    tmp_path: Path, policy: str, reported: bool
) -> None:
    body = (
        "import torch\n\nfrom .policy import kept_dtype, model_dtype\n\n\n"
        "def make(shape, precision):\n"
        f"    g_cache = torch.zeros(shape, dtype={policy}(precision))\n"
        "    return g_cache\n"
    )
    files = {"pkg/__init__.py": "", "pkg/policy.py": _ENUM_POLICY, "pkg/pool.py": body}
    found = [(f.code, f.message) for f in lint_in_project(tmp_path, files, "pkg/pool.py")]
    if reported:
        assert [code for code, _ in found] == ["RL001"]
        assert "torch.bfloat16" in found[0][1]
    else:
        assert found == []


_CONSTANT_SET_POLICY = """
import torch

from .names import HOST_FP32

FULL_PRECISION_BUFFERS = frozenset({"state", "log_decay_cache"})
LISTED = ("state", "g_ring")
GROWN = {"state"}
GROWN.add("g_ring")


def cache_dtype_for(buffer_name, compute_dtype):
    if buffer_name in FULL_PRECISION_BUFFERS:
        return torch.float32
    return compute_dtype


def listed_dtype(buffer_name):
    if buffer_name not in LISTED:
        return torch.bfloat16
    return torch.float32


def host_dtype(buffer_name):
    if buffer_name in HOST_FP32:
        return torch.float32
    return torch.float16


def grown_dtype(buffer_name):
    if buffer_name in GROWN:
        return torch.float32
    return torch.bfloat16
"""


@pytest.mark.parametrize(
    ("call", "reported"),
    [
        ('cache_dtype_for("log_decay_cache", torch.bfloat16)', False),
        ('cache_dtype_for("log_decay", torch.bfloat16)', True),  # not the name the set holds
        ('listed_dtype("g_ring")', False),
        ('listed_dtype("gate")', True),
        ('host_dtype("g_ring")', False),  # a set of another module
        ('host_dtype("gate")', True),
        # a set that grows at import time may hold any name: both returns stay possible
        ('grown_dtype("gate")', True),
        ('grown_dtype("g_ring")', True),
    ],
)
def test_a_ring_name_tested_against_a_constant_collection_picks_its_return(
    tmp_path: Path, call: str, reported: bool
) -> None:
    body = (
        "import torch\n\nfrom .policy import cache_dtype_for, grown_dtype, host_dtype, listed_dtype"
        "\n\n\n"
        "def make(shape):\n"
        f"    g_cache = torch.zeros(shape, dtype={call})\n"
        "    return g_cache\n"
    )
    files = {
        "pkg/__init__.py": "",
        "pkg/names.py": 'HOST_FP32 = ["state", "g_ring"]\n',
        "pkg/policy.py": _CONSTANT_SET_POLICY,
        "pkg/pool.py": body,
    }
    found = [(f.code, f.message) for f in lint_in_project(tmp_path, files, "pkg/pool.py")]
    assert [code for code, _ in found] == (["RL001"] if reported else [])


_LAYOUT = """
def to_engine_layout(tensor, engine_dtype=None):
    if engine_dtype is None:
        return tensor.detach().clone()
    return tensor.detach().to(dtype=engine_dtype, copy=True)
"""


@pytest.mark.parametrize(
    ("call", "reported"),
    [
        ("to_engine_layout(source.g_cache)", False),  # the default: the copy, as it is
        ("to_engine_layout(source.g_cache, None)", False),
        ("to_engine_layout(source.g_cache, torch.bfloat16)", True),
        ("to_engine_layout(source.g_cache, engine.cache_dtype)", True),  # not provably float32
        ("to_engine_layout(source.g_cache, torch.float32)", False),
    ],
)
def test_a_cast_helper_s_none_test_is_decided_by_the_argument(
    tmp_path: Path, call: str, reported: bool
) -> None:
    body = (
        "import torch\n\nfrom .layout import to_engine_layout\n\n\n"
        "def push(source, target, engine):\n"
        f"    target.g_cache = {call}\n"
    )
    files = {"pkg/__init__.py": "", "pkg/layout.py": _LAYOUT, "pkg/pool.py": body}
    found = [f.code for f in lint_in_project(tmp_path, files, "pkg/pool.py")]
    assert found == (["RL004"] if reported else [])


_CONDITIONAL_POLICY = """
import torch

FP32_RINGS = frozenset({"state", "g_cache"})


def ring_dtype(name, compute_dtype):
    if name == "write_pos":
        return torch.int32
    return torch.float32 if name in FP32_RINGS else compute_dtype


def ring_dtype_by_literal(name, compute_dtype):
    return compute_dtype if name != "g_cache" else torch.float32


def ring_dtype_untested(name, compute_dtype, fp32):
    return torch.float32 if fp32 else compute_dtype
"""


@pytest.mark.parametrize(
    ("call", "reported"),
    [
        ('ring_dtype("g_cache", self.dtype)', False),  # the branch the name reaches: float32
        ('ring_dtype("d_cache", self.dtype)', True),  # the compute dtype, for the gate ring
        ('ring_dtype_by_literal("g_cache", self.dtype)', False),
        ('ring_dtype_by_literal("d_cache", self.dtype)', True),
        ("ring_dtype_untested('g_cache', self.dtype, True)", True),  # not a test on a name
    ],
)
def test_a_conditional_return_tested_on_the_ring_name_picks_its_branch(
    tmp_path: Path, call: str, reported: bool
) -> None:
    body = (
        "import torch\n\nfrom .policy import ring_dtype, ring_dtype_by_literal, "
        "ring_dtype_untested\n\n\n"
        "class Rings:\n"
        "    def __init__(self, shape, dtype):\n"
        "        self.dtype = dtype\n"
        f"        self.g_cache = torch.zeros(shape, dtype={call})\n"
    )
    files = {"pkg/__init__.py": "", "pkg/policy.py": _CONDITIONAL_POLICY, "pkg/pool.py": body}
    found = [f.code for f in lint_in_project(tmp_path, files, "pkg/pool.py")]
    assert bool(found) is reported, found
