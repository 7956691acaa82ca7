"""Helpers that allocate one tensor per key of the mapping a caller passes, all in one dtype:
a call whose mapping names the gate cache is reported (RL006), in this module and across
modules of the project."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from project_support import lint_in_project

from replaylint.lint.engine import Linter
from replaylint.lint.project.summaries import summarise

_HELPERS = """
import torch


def alloc_rings(shapes, dtype, device="cpu"):
    # one zeroed buffer per name, all in the given dtype
    return {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape in shapes.items()}


def alloc_like(names, shape, dtype=torch.bfloat16):
    return {name: torch.empty(shape, dtype=dtype) for name in names}


def alloc_default(shapes):
    return {name: torch.zeros(shape) for name, shape in shapes.items()}


def alloc_zipped(shapes, dtype, **kwargs):
    # the same helper spelled with zip; `**kwargs` cannot hold a second dtype
    return dict(zip(shapes, (torch.zeros(shape, dtype=dtype, **kwargs) for shape in shapes.values())))
"""


def _rows(tmp_path: Path, body: str) -> list[tuple[int, str]]:
    user = (
        "import torch\nfrom .alloc import alloc_default, alloc_like, alloc_rings, alloc_zipped\n\n"
        f"{body}"
    )
    files = {"pkg/__init__.py": "", "pkg/alloc.py": _HELPERS, "pkg/user.py": user}
    return [(f.location.row, f.code) for f in lint_in_project(tmp_path, files, "pkg/user.py")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # a literal mapping whose keys name the gate cache, in a dtype not provably float32
        (
            "def f(dtype):\n    return alloc_rings({'d_cache': (2,), 'g_cache': (2,)}, dtype)\n",
            [(5, "RL006")],
        ),
        # the gate key added to a spread of other shapes
        (
            "def f(shapes, dtype):\n    return alloc_rings({**shapes, 'g_cache': (2,)}, dtype)\n",
            [(5, "RL006")],
        ),
        # through a local, passed by keyword
        (
            "def f(dtype):\n    shapes = {'k_cache': (1,), 'g_cache': (1,)}\n"
            "    return alloc_rings(dtype=dtype, shapes=shapes)\n",
            [(6, "RL006")],
        ),
        # `dict(zip(shapes, ...))`: one allocation per key, like the comprehension
        (
            "def f(dtype):\n    return alloc_zipped({'d_cache': (2,), 'g_cache': (2,)}, dtype)\n",
            [(5, "RL006")],
        ),
        (
            "def f():\n"
            "    return alloc_zipped({'d_cache': (2,), 'g_cache': (2,)}, torch.float32, device='cpu')\n",
            [],
        ),
        # the helper's own default dtype (bfloat16), keys iterated directly
        ("def f():\n    return alloc_like(('d_cache', 'g_cache'), (2,))\n", []),
        ("def f():\n    return alloc_like({'d_cache': 1, 'g_cache': 2}, (2,))\n", [(5, "RL006")]),
        # float32 for everything, or no gate key: nothing to report
        ("def f():\n    return alloc_rings({'g_cache': (2,)}, torch.float32)\n", []),
        ("def f(dtype):\n    return alloc_rings({'d_cache': (2,), 'k_cache': (2,)}, dtype)\n", []),
        (
            "def f(shapes, dtype):\n"
            "    return alloc_rings({k: shapes[k] for k in ('d_cache', 'k_cache')}, dtype)\n",
            [],
        ),
        # keys the analysis cannot read are not guessed
        ("def f(shapes, dtype):\n    return alloc_rings(shapes, dtype)\n", []),
        # no dtype in the helper: the default dtype decides (RL003's question, not this one)
        ("def f():\n    return alloc_default({'g_cache': (2,)})\n", []),
    ],
)
def test_a_per_key_helper_of_another_module(
    tmp_path: Path, body: str, expected: list[tuple[int, str]]
) -> None:
    assert _rows(tmp_path, body) == expected


def test_the_mapping_of_an_attribute_and_a_method_of_the_module(tmp_path: Path) -> None:
    body = """
def cache_shapes(n):
    return {"d_cache": (n,), "k_cache": (n,), "g_cache": (n,)}


class Spec:
    def shapes(self):
        return {"d_cache": (1,), "g_cache": (1,)}


class Pool:
    def __init__(self, spec: Spec, n, dtype):
        self.spec, self.dtype = spec, dtype
        self.shapes = cache_shapes(n)

    def allocate(self):
        for name, t in alloc_rings(self.shapes, self.dtype).items():
            setattr(self, name, t)

    def spare(self):
        return [alloc_rings(self.spec.shapes(), dtype=self.dtype) for _ in range(2)]
"""
    assert _rows(tmp_path, body) == [(20, "RL006"), (24, "RL006")]


def test_a_helper_of_the_same_module() -> None:
    source = """
import torch


def _alloc(shapes, dtype=torch.bfloat16):
    return {n: torch.empty(s, dtype=dtype) for n, s in shapes.items()}


def good(dtype):
    rings = _alloc({"d_cache": (1,), "k_cache": (1,)}, dtype)
    rings.update(_alloc({"g_cache": (1,)}, torch.float32))
    return rings


def bad():
    return _alloc({"d_cache": (1,), "g_cache": (1,)})
"""
    findings = Linter().check(source)
    assert [(f.code, f.location.row) for f in findings] == [("RL006", 16)]
    message = findings[0].message
    assert "`_alloc` (line 5)" in message
    assert "`torch.bfloat16`" in message
    assert findings[0].fix is None  # the helper serves callers without a gate cache too


def test_the_message_names_the_helper_and_the_passed_dtype(tmp_path: Path) -> None:
    user = (
        "from .alloc import alloc_rings\n\n"
        "def f(dtype):\n    return alloc_rings({'d_cache': 1, 'g_cache': 2}, dtype)\n"
    )
    files = {"pkg/__init__.py": "", "pkg/alloc.py": _HELPERS, "pkg/user.py": user}
    (finding,) = lint_in_project(tmp_path, files, "pkg/user.py")
    assert "pkg/alloc.py:4), which gives every entry of" in finding.message
    assert "the dtype this call passes, `dtype`" in finding.message


def test_the_summary_of_a_per_key_comprehension() -> None:
    summary = summarise(_HELPERS)
    assert summary is not None
    result = summary["names"]["alloc_rings"][3]
    assert result[0] == "per_key"
    assert result[1] == ["param", "shapes"]
    assert result[2][0] == "call"
    assert result[2][2] == [["loop", "value"]]
    assert ["dtype", ["param", "dtype"]] in result[2][3]
    filtered = "def f(m):\n    return {k: v for k, v in m.items() if k}\n"
    assert summarise(filtered)["names"]["f"][3] == ["unknown"]  # type: ignore[index]


def test_a_zipped_helper_of_the_same_module() -> None:
    source = """
import torch


def _alloc(shapes, dtype):
    return dict(zip(shapes, [torch.zeros(s, dtype=dtype) for s in shapes.values()]))


def pool(dtype):
    return _alloc({"d_cache": (1,), "g_cache": (1,)}, dtype)


def other(dtype):
    return _alloc({"d_cache": (1,), "k_cache": (1,)}, dtype)
"""
    findings = Linter().check(source)
    assert [(f.code, f.location.row) for f in findings] == [("RL006", 10)]
    assert "`_alloc` (line 5)" in findings[0].message


def test_the_split_fix_makes_only_the_gate_entry_again_in_float32() -> None:
    torch = pytest.importorskip("torch")
    source = (
        "import torch\n\n"
        "def alloc_rings(shapes, dtype):\n"
        "    return {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}\n\n"
        "def pool(dtype):\n"
        '    shapes = {"d_cache": (2,), "g_cache": (2,), "k_cache": (2,)}\n'
        "    return alloc_rings(shapes, dtype)\n"
    )
    fixed = Linter().fix(source, unsafe=True).source
    assert '**alloc_rings({"g_cache": shapes["g_cache"]}, torch.float32)' in fixed
    assert [f.code for f in Linter().check(fixed)] == []
    namespace: dict[str, object] = {}
    exec(compile(fixed, "<fixed>", "exec"), namespace)
    rings = namespace["pool"](torch.bfloat16)  # type: ignore[operator]
    assert list(rings) == ["d_cache", "g_cache", "k_cache"]  # every key in its place
    assert [t.dtype for t in rings.values()] == [torch.bfloat16, torch.float32, torch.bfloat16]


_NESTED = """
import torch


def alloc_ring(shape, dtype, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


def make_rings(shapes, dtype):
    return {name: alloc_ring(shape, dtype) for name, shape in shapes.items()}
"""


def test_a_mapping_of_unknown_keys_read_under_the_gate_key(tmp_path: Path) -> None:
    body = """
class Pool:
    def __init__(self, shapes, dtype):
        rings = make_rings(shapes, dtype)
        self.d_cache = rings["d_cache"]
        self.g_cache = rings["g_cache"]


def state_only(shapes, dtype):
    rings = make_rings(shapes, dtype)
    return rings["d_cache"]
"""
    files = {
        "pkg/__init__.py": "",
        "pkg/helpers.py": _NESTED,
        "pkg/user.py": f"from .helpers import make_rings\n{body}",
    }
    rows = [(f.location.row, f.code) for f in lint_in_project(tmp_path, files, "pkg/user.py")]
    # the entries are made by `alloc_ring`, an allocation helper `make_rings` calls per key
    assert rows == [(5, "RL006")]


def test_a_per_key_helper_that_allocates_through_a_helper_of_its_module() -> None:
    source = f"""{_NESTED}

def new_pool(shapes, dtype):
    rings = make_rings(shapes, dtype)
    return rings["d_cache"], rings["g_cache"]
"""
    findings = Linter().check(source, "example.py")
    assert [(f.location.row, f.code) for f in findings] == [(14, "RL006")]
    fixed = Linter().fix(source, "example.py", unsafe=True).source
    assert 'make_rings({"g_cache": shapes["g_cache"]}, torch.float32)' in fixed


_FILLED = """
import torch


def make_rings(shapes, dtype):
    \"\"\"One zeroed ring per name.\"\"\"
    rings = {}
    for name, shape in shapes.items():
        rings[name] = torch.zeros(shape, dtype=dtype)
    return rings
"""


def test_the_summary_of_a_dict_filled_in_a_loop() -> None:
    summary = summarise(ast.parse(_FILLED))["names"]["make_rings"]
    assert summary[3][0] == "per_key"
    assert summary[3][2][3] == [["dtype", ["param", "dtype"]]]
    # a loop that also filters, or writes the dict twice, is not a plain per-key fill
    filtered = _FILLED.replace("        rings[name]", "        if name:\n            rings[name]")
    assert summarise(ast.parse(filtered))["names"]["make_rings"][3][0] != "per_key"


def test_a_helper_that_fills_a_dict_in_a_loop(tmp_path: Path) -> None:
    user = """from .filled import make_rings


def here(n, dtype):
    return make_rings({"d_cache": (n,), "g_cache": (n,)}, dtype)


def no_gate(n, dtype):
    return make_rings({"d_cache": (n,)}, dtype)
"""
    files = {"pkg/__init__.py": "", "pkg/filled.py": _FILLED, "pkg/user.py": user}
    rows = [(f.location.row, f.code) for f in lint_in_project(tmp_path, files, "pkg/user.py")]
    assert rows == [(5, "RL006")]
    same_module = (
        _FILLED + '\n\ndef here(n, dtype):\n    return make_rings({"g_cache": (n,)}, dtype)\n'
    )
    assert [f.code for f in Linter().check(same_module, "example.py")] == ["RL006"]
