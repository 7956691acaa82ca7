"""Helpers of other project modules that cast or read tensors, and the loads a module makes
through ``with`` and loops: each case is linted with its project index."""

from __future__ import annotations

from pathlib import Path

import pytest
from project_support import fix_in_project, lint_in_project

from replaylint.lint.engine import Linter

_UTILS = """
import torch


def to_dtype(tensor, dtype):
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def wire(tensor):
    return tensor.half()


def load_tensors(blob, dtypes):
    tensors = {}
    for name, (start, end, dtype) in dtypes.items():
        tensors[name] = torch.frombuffer(bytearray(blob[start:end]), dtype=dtype)
    return tensors


def load_as_float(blob):
    return {k: v.float() for k, v in torch.load(blob).items()}
"""


def _rows(tmp_path: Path, body: str) -> list[tuple[int, str]]:
    user = f"import torch\nfrom .utils import load_as_float, load_tensors, to_dtype, wire\n\n{body}"
    files = {"pkg/__init__.py": "", "pkg/utils.py": _UTILS, "pkg/user.py": user}
    return [(f.location.row, f.code) for f in lint_in_project(tmp_path, files, "pkg/user.py")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def f(ring, dtype):\n    g_cache = to_dtype(ring, dtype)\n", [(5, "RL004")]),
        ("def f(ring):\n    g_cache = to_dtype(ring, torch.bfloat16)\n", [(5, "RL004")]),
        ("def f(ring):\n    g_cache = to_dtype(ring, torch.float32)\n", []),
        ("def f(ring):\n    g_cache = wire(ring)\n", [(5, "RL004")]),
        ("def f(blob, d):\n    g_cache = load_tensors(blob, d)['g_cache']\n", [(5, "RL005")]),
        ("def f(blob):\n    g_cache = load_as_float(blob)['g_cache']\n", []),
    ],
)
def test_helpers_of_another_module_that_cast_or_read(
    tmp_path: Path, body: str, expected: list[tuple[int, str]]
) -> None:
    assert _rows(tmp_path, body) == expected


def test_a_cast_helper_is_fixed_at_the_call(tmp_path: Path) -> None:
    user = (
        "import torch\nfrom .utils import to_dtype\n\n"
        "def f(ring):\n    g_cache = to_dtype(ring, torch.bfloat16)\n    return g_cache\n"
    )
    files = {"pkg/__init__.py": "", "pkg/utils.py": _UTILS, "pkg/user.py": user}
    fixed = fix_in_project(tmp_path, files, "pkg/user.py")
    assert "g_cache = to_dtype(ring, torch.float32)" in fixed


@pytest.mark.parametrize(
    "body",
    [
        "with np.load(path) as dump:\n        g_cache = torch.from_numpy(dump['g_cache'])\n",
        "state = torch.load(path)\n    for name, entry in state['layers'].items():\n"
        "        g_cache = entry['g_cache']\n",
        "for entry in torch.load(path).values():\n        g_cache = entry['g_cache']\n",
    ],
)
def test_loads_through_with_and_loops(body: str) -> None:
    source = f"import numpy as np\nimport torch\n\ndef restore(path):\n    {body}"
    assert [f.code for f in Linter().check(source, "m.py")] == ["RL005"]


def test_a_loop_over_the_keys_of_a_load_reads_no_tensor() -> None:
    source = (
        "import torch\n\ndef restore(path):\n"
        "    for g_cache in torch.load(path).keys():\n        print(g_cache)\n"
    )
    assert Linter().check(source, "m.py") == []


_DTYPES = """
import torch

_str_to_torch_dtype_dict = dict(float16=torch.float16, bfloat16=torch.bfloat16, float32=torch.float32)


def str_dtype_to_torch(dtype):
    ret = _str_to_torch_dtype_dict.get(dtype)
    assert ret is not None, f"Unsupported dtype: {dtype}"
    return ret


GATE_DTYPE = getattr(torch, "bfloat16")
"""


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ('str_dtype_to_torch("bfloat16")', "RL001"),
        ('str_dtype_to_torch("float32")', None),
        ("GATE_DTYPE", "RL001"),
    ],
)
def test_dtype_tables_built_by_dict_and_getattr_of_torch(
    tmp_path: Path, dtype: str, expected: str | None
) -> None:
    user = (
        "import torch\nfrom ._utils import GATE_DTYPE, str_dtype_to_torch\n\n"
        f"def f(shape):\n    g_cache = torch.zeros(shape, dtype={dtype})\n    return g_cache\n"
    )
    files = {"pkg/__init__.py": "", "pkg/_utils.py": _DTYPES, "pkg/user.py": user}
    codes = [f.code for f in lint_in_project(tmp_path, files, "pkg/user.py")]
    assert codes == ([expected] if expected else [])


_RING_DTYPES = """
import torch

_NAMES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def to_torch_dtype(name):
    return name if isinstance(name, torch.dtype) else _NAMES[name]


def ring_dtypes(precision):
    precision = to_torch_dtype(precision)
    return precision, precision, torch.float32


def shared_ring_dtypes(precision):
    precision = to_torch_dtype(precision)
    return precision, precision, precision
"""


@pytest.mark.parametrize(
    ("policy", "expected"), [("ring_dtypes", []), ("shared_ring_dtypes", ["RL002"])]
)
def test_a_returned_element_is_followed_when_the_body_rebinds_a_parameter(
    tmp_path: Path, policy: str, expected: list[str]
) -> None:
    # the rebound parameter is unknown, the literal element beside it is still read
    user = (
        f"import torch\nfrom ._policy import {policy}\n\n"
        f"def build(precision, shape):\n    d_dtype, _, g_dtype = {policy}(precision)\n"
        "    g_cache = torch.zeros(shape, dtype=g_dtype)\n    return g_cache\n"
    )
    files = {"pkg/__init__.py": "", "pkg/_policy.py": _RING_DTYPES, "pkg/user.py": user}
    codes = [f.code for f in lint_in_project(tmp_path, files, "pkg/user.py")]
    assert codes == expected


_TABLES = """
import torch


def ring_dtypes(dtype):
    return {"d_cache": dtype, "k_cache": dtype, "g_cache": torch.float32}


def shared_ring_dtypes(dtype):
    return {"d_cache": dtype, "k_cache": dtype, "g_cache": dtype}
"""


@pytest.mark.parametrize(
    ("policy", "after", "expected"),
    [
        ("ring_dtypes", "", []),
        ("shared_ring_dtypes", "", ["RL002"]),
        ("local_ring_dtypes", "", []),
        ("local_shared_ring_dtypes", "", ["RL002"]),
        # the caller writes the entry: the table no longer says what it holds
        ("ring_dtypes", '    dtypes["g_cache"] = dtype\n', ["RL002"]),
    ],
)
def test_an_entry_of_a_dict_a_function_returns(
    tmp_path: Path, policy: str, after: str, expected: list[str]
) -> None:
    user = (
        "import torch\nfrom ._tables import ring_dtypes, shared_ring_dtypes\n\n"
        'def local_ring_dtypes(dtype):\n    return {"g_cache": torch.float32}\n\n'
        'def local_shared_ring_dtypes(dtype):\n    return {"g_cache": dtype}\n\n'
        f"def build(shape, dtype):\n    dtypes = {policy}(dtype)\n{after}"
        '    g_cache = torch.zeros(shape, dtype=dtypes["g_cache"])\n    return g_cache\n'
    )
    files = {"pkg/__init__.py": "", "pkg/_tables.py": _TABLES, "pkg/user.py": user}
    codes = [f.code for f in lint_in_project(tmp_path, files, "pkg/user.py")]
    assert codes == expected


_LIKE_HELPERS = """
import torch


def alloc_like(t):
    return torch.empty_like(t)


def new_ring(t, shape):
    return t.new_zeros(shape)


def float_like(t):
    return torch.zeros_like(t, dtype=torch.float32)
"""


@pytest.mark.parametrize(
    ("made", "expected"),
    [
        ("alloc_like(d_cache)", ["RL003"]),
        ("new_ring(d_cache, (n,))", ["RL003"]),
        ("float_like(d_cache)", []),
        # a float32 tensor passed: the copy is float32 too
        ("alloc_like(state)", []),
    ],
)
def test_helpers_of_another_module_that_allocate_like_a_tensor(
    tmp_path: Path, made: str, expected: list[str]
) -> None:
    user = (
        "import torch\nfrom ._like import alloc_like, float_like, new_ring\n\n"
        "def build(n, dtype):\n"
        "    d_cache = torch.zeros(n, dtype=dtype)\n"
        "    state = torch.zeros(n, dtype=torch.float32)\n"
        f"    g_cache = {made}\n"
        "    return g_cache, state\n"
    )
    files = {"pkg/__init__.py": "", "pkg/_like.py": _LIKE_HELPERS, "pkg/user.py": user}
    assert [f.code for f in lint_in_project(tmp_path, files, "pkg/user.py")] == expected
    if expected:
        fixed = fix_in_project(tmp_path, files, "pkg/user.py")
        assert f"g_cache = {made}.to(torch.float32)" in fixed
