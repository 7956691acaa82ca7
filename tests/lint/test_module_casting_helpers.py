"""Module casts through a helper of another module: ``fabric.setup_module(model)``, where a method
of that name in an imported project module casts the module it is handed."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from project_support import cli_rows, fix_in_project, lint_in_project, write_tree

from replaylint.lint.project.module_casters import module_casters

_PRECISION = """
import torch
from torch import nn


class Precision:
    def convert_module(self, module: nn.Module) -> nn.Module:
        return module


class HalfPrecision(Precision):
    def __init__(self, dtype=torch.bfloat16):
        self._dtype = dtype

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._dtype)


class Fabric:
    def __init__(self, precision: Precision):
        self._precision = precision

    def setup_module(self, module: nn.Module, move: bool = True) -> nn.Module:
        module = self._precision.convert_module(module)
        return module.to("cpu") if move else module


def to_serving(config, model):
    return model.half()


class Serving:
    def to_half(self, config, model):
        return to_serving(config, model)


def to_device(model, device):
    return model.to(device)
"""

_MODEL = """
import torch
from torch import nn


class Ring(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))


class Attention(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n
        self.cache = None

    def build_cache(self, n):
        return Ring(n)


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList(Attention(n) for _ in range(2))

    def set_cache(self, n):
        for layer in self.layers:
            layer.cache = layer.build_cache(n)


class Plain(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Linear(n, n)
"""

_USE = """
from pkg.model import Model, Plain
from pkg.precision import Fabric, HalfPrecision, Serving, to_device, to_serving


def serve(n):
    fabric = Fabric(HalfPrecision())
    model = Model(n)
    model.set_cache(n)
    model = fabric.setup_module(model)
    plain = fabric.setup_module(Plain(n))
    moved = to_device(Model(n), "cpu")
    served = Model(n)
    served.set_cache(n)
    half = Serving().to_half(None, model=served)
    # a function of the project's own is judged where it casts
    own = to_serving(None, served)
    return model, plain, moved, half, own
"""

_FILES = {
    "pkg/__init__.py": "",
    "pkg/precision.py": _PRECISION,
    "pkg/model.py": _MODEL,
    "pkg/use.py": _USE,
}


def test_a_summary_lists_the_parameters_a_helper_casts_as_a_module() -> None:
    casters = module_casters(ast.parse(_PRECISION.lstrip("\n")))
    assert casters == {
        "HalfPrecision.convert_module": [[0, "module", 15, ""]],
        # handed on to a method of that name that casts it
        "Fabric.setup_module": [[0, "module", 15, ""]],
        "to_serving": [[1, "model", 28, "float16"]],
        "Serving.to_half": [[1, "model", 28, "float16"]],
    }  # `to_device` only moves it, `Precision.convert_module` returns it


def test_float32_casts_and_device_moves_are_no_module_casts() -> None:
    source = textwrap.dedent(
        """\
        import torch

        def a(m):
            return m.to(torch.float32)

        def b(m, device):
            return m.to(device, non_blocking=True)

        def c(m, dtype):
            return m.to("cuda", dtype)

        def d(m):
            return m.type(torch.float64)
        """
    )
    assert module_casters(ast.parse(source)) == {"c": [[0, "m", 10, ""]]}


def test_a_call_of_a_casting_helper_is_reported_where_the_model_is_known(tmp_path: Path) -> None:
    found = lint_in_project(tmp_path, _FILES, "pkg/use.py")
    rows = [(f.location.row, f.code) for f in found]
    # `Plain` holds no gate buffer; `to_device` moves the model only
    assert rows == [(9, "RL004"), (14, "RL004")]
    first, second = (f.message for f in found)
    assert "`fabric.setup_module(model)`, which casts `model` as a module" in first
    assert "(`Fabric.setup_module`, " in first
    assert "held by `Model.layer.cache`" in first
    assert "to torch.float16" in second  # the helper's literal dtype


def test_the_fix_protects_the_model_it_hands_to_the_helper(tmp_path: Path) -> None:
    fixed = fix_in_project(tmp_path, _FILES, "pkg/use.py")
    assert "fabric.setup_module(replaylint.guards.keep_fp32_gate_caches(model))" in fixed
    assert "to_half(None, model=replaylint.guards.keep_fp32_gate_caches(served))" in fixed
    assert "fabric.setup_module(Plain(n))" in fixed


@pytest.mark.parametrize("cache", [True, False])
def test_a_run_over_the_tree_analyses_the_file_that_calls_the_helper(
    tmp_path: Path, cache: bool
) -> None:
    # `use.py` names no gate cache and calls no cast method: the helper's name lets it through
    write_tree(
        tmp_path, {"pyproject.toml": "[project]\nname = 'pkg'\n\n[tool.replaylint]\n", **_FILES}
    )
    rows = cli_rows(tmp_path, *(() if cache else ("--no-cache",)))
    assert [row for row in rows if row[0] == "pkg/use.py"] == [
        ("pkg/use.py", 9, "RL004"),
        ("pkg/use.py", 14, "RL004"),
    ]


def test_a_gate_dtype_a_policy_of_another_module_returns_is_judged_where_it_is_passed(
    tmp_path: Path,
) -> None:
    # `ring_dtype` is no setting of the gate dtype itself: the keyword that passes it for one is
    policy = "import torch\n\n\ndef ring_dtype(mode):\n    return torch.bfloat16\n"
    user = (
        "import torch\n\nfrom .policy import ring_dtype\n\n\n"
        "def run(generate, mode):\n"
        "    generate(gate_dtype=ring_dtype(mode))\n"
        "    generate(gate_dtype=torch.bfloat16)\n"
    )
    files = {"pkg/__init__.py": "", "pkg/policy.py": policy, "pkg/user.py": user}
    found = lint_in_project(tmp_path, files, "pkg/user.py")
    assert [(f.location.row, f.code) for f in found] == [(7, "RL001"), (8, "RL001")]
    assert "(from `ring_dtype` at " in found[0].message
    assert "pkg/policy.py:4)" in found[0].message


def test_a_gate_dtype_a_function_named_for_it_returns_is_judged_at_its_return(
    tmp_path: Path,
) -> None:
    policy = "import torch\n\n\ndef log_decay_dtype(mode):\n    return torch.bfloat16\n"
    user = (
        "from .policy import log_decay_dtype\n\n\n"
        "def run(generate, mode):\n"
        "    generate(gate_dtype=log_decay_dtype(mode))\n"
    )
    files = {"pkg/__init__.py": "", "pkg/policy.py": policy, "pkg/user.py": user}
    assert lint_in_project(tmp_path, files, "pkg/user.py") == []
    found = lint_in_project(tmp_path, files, "pkg/policy.py")
    assert [(f.location.row, f.code) for f in found] == [(5, "RL001")]
    assert "`log_decay_dtype`, named for the gate cache's dtype, returns torch.bfloat16" in (
        found[0].message
    )


def test_a_converter_method_the_project_calls_is_judged_at_its_callers(tmp_path: Path) -> None:
    # `HalfPrecision.convert_module` returns the module it is handed, cast: `Fabric` calls it,
    # and a caller handing it a model of a gate-buffer class is reported (use.py:9)
    write_tree(
        tmp_path, {"pyproject.toml": "[project]\nname = 'pkg'\n\n[tool.replaylint]\n", **_FILES}
    )
    rows = cli_rows(tmp_path, "--no-cache")
    assert [row for row in rows if row[0] == "pkg/precision.py"] == [
        ("pkg/precision.py", 28, "RL004")
    ]
    assert ("pkg/use.py", 9, "RL004") in rows


def test_a_converter_method_no_module_calls_is_judged_where_it_casts(tmp_path: Path) -> None:
    precision = _PRECISION.replace("self._precision.convert_module(module)", "module")
    files = {**_FILES, "pkg/precision.py": precision}
    write_tree(
        tmp_path, {"pyproject.toml": "[project]\nname = 'pkg'\n\n[tool.replaylint]\n", **files}
    )
    rows = cli_rows(tmp_path, "--no-cache")
    assert [row for row in rows if row[0] == "pkg/precision.py"] == [
        ("pkg/precision.py", 15, "RL004"),
        ("pkg/precision.py", 28, "RL004"),
    ]


_SPLIT = {
    "pkg/__init__.py": "",
    "pkg/model.py": _MODEL,
    "pkg/lite/__init__.py": """
        from pkg.lite.fabric import Fabric
        from pkg.lite.plugins import HalfPrecision, Precision
        """,
    # the plugins and the wrapper that hands them the module live in two modules
    "pkg/lite/plugins.py": _PRECISION.split("class Fabric")[0],
    "pkg/lite/fabric.py": """
        from torch import nn

        from pkg.lite.plugins import Precision


        class Fabric:
            def __init__(self, precision: Precision):
                self._precision = precision

            def setup(self, module: nn.Module) -> nn.Module:
                return self._precision.convert_module(module)
        """,
    "pkg/use.py": """
        from pkg.lite import Fabric, HalfPrecision
        from pkg.model import Model, Plain


        def serve(n):
            fabric = Fabric(HalfPrecision())
            model = Model(n)
            model.set_cache(n)
            return fabric.setup(model), fabric.setup(Plain(n))
        """,
}


def test_a_module_handed_on_to_a_plugin_of_another_module_is_cast_there(tmp_path: Path) -> None:
    found = lint_in_project(tmp_path, _SPLIT, "pkg/use.py")
    assert [(f.location.row, f.code) for f in found] == [(9, "RL004")]
    assert "(`Fabric.setup`, " in found[0].message
    assert "pkg/lite/plugins.py:" in found[0].message


def test_a_summary_lists_what_a_method_hands_on_to_a_callee_of_another_module() -> None:
    from replaylint.lint.project.module_casters import casters_and_forwards

    source = textwrap.dedent(_SPLIT["pkg/lite/fabric.py"])
    casters, forwards = casters_and_forwards(ast.parse(source))
    assert casters == {}
    assert forwards["Fabric.setup"] == [[0, "module", "convert_module", 0]]
