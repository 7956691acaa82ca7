"""The fixture modules, run: every finding is a real non-float32 gate cache, every fix makes it
float32 without touching the other caches, and clean builders are left alone.

Each fixture defines ``build_*`` functions that allocate, cast or load rings and return them by
name. They run on CPU torch before the fix (``.in.py``) and after it (``.out.py``):

* ``build_clean_*``: unchanged source; gate caches float32 before and after, every dtype equal.
* ``build_unfixed_*``: a finding without a fix: the gate cache is not float32, before and after.
* any other ``build_*``: some gate cache is not float32 before; all are float32 after, and every
  other tensor keeps its dtype.
"""

from __future__ import annotations

import ast
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")

from fixture_support import FIXTURES, linter_for, output_of  # noqa: E402

from replaylint.lint.gatecache.names import GateCacheNames  # noqa: E402

Builder = Callable[..., dict[str, Any]]


def _load(text: str, filename: str, tag: str) -> types.ModuleType:
    """Execute fixture source as a throwaway module (dataclasses need it in sys.modules)."""
    module = types.ModuleType(f"replaylint_fixture_{tag}")
    module.__file__ = filename
    sys.modules[module.__name__] = module
    try:
        exec(compile(text, filename, "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def _builders(module: types.ModuleType) -> dict[str, Builder]:
    return {
        name: value
        for name, value in vars(module).items()
        if name.startswith("build_") and inspect.isfunction(value)
    }


def _function_sources(text: str) -> dict[str, str]:
    tree = ast.parse(text)
    return {
        node.name: ast.get_source_segment(text, node) or ""
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


def _run(builder: Builder, tmp_path: Path) -> dict[str, Any]:
    parameters = inspect.signature(builder).parameters
    tmp_path.mkdir(parents=True, exist_ok=True)
    result = builder(str(tmp_path)) if "tmp_path" in parameters else builder()
    assert isinstance(result, dict), f"{builder.__name__} must return its tensors by name"
    assert result, f"{builder.__name__} returned no tensors"
    return result


def _dtypes(tensors: dict[str, Any]) -> dict[str, Any]:
    return {name: tensor.dtype for name, tensor in tensors.items()}


def _cases() -> Iterator[Any]:
    for fixture in FIXTURES:
        before_text = fixture.read_text(encoding="utf-8")
        names = _function_sources(before_text)
        for name in sorted(n for n in names if n.startswith("build_")):
            yield pytest.param(fixture, name, id=f"{fixture.name.removesuffix('.in.py')}-{name}")


@pytest.fixture(scope="module")
def loaded() -> dict[Path, tuple[types.ModuleType, types.ModuleType, GateCacheNames]]:
    modules = {}
    for index, fixture in enumerate(FIXTURES):
        before = fixture.read_text(encoding="utf-8")
        after = output_of(fixture).read_text(encoding="utf-8")
        names = linter_for(fixture, before).gate_caches
        modules[fixture] = (
            _load(before, str(fixture), f"{index}_before"),
            _load(after, str(output_of(fixture)), f"{index}_after"),
            names,
        )
    return modules


@pytest.mark.parametrize(("fixture", "name"), list(_cases()))
def test_builder_before_and_after_the_fix(
    fixture: Path,
    name: str,
    loaded: dict[Path, tuple[types.ModuleType, types.ModuleType, GateCacheNames]],
    tmp_path: Path,
) -> None:
    module_before, module_after, gate_names = loaded[fixture]
    before = _dtypes(_run(_builders(module_before)[name], tmp_path / "before"))
    after = _dtypes(_run(_builders(module_after)[name], tmp_path / "after"))
    gates = {key for key in before if gate_names.matches(key)}
    assert gates, f"{name} returns no gate cache (keys: {sorted(before)})"
    assert set(after) == set(before)
    others = set(before) - gates

    if name.startswith("build_clean_"):
        sources_before = _function_sources(fixture.read_text(encoding="utf-8"))
        sources_after = _function_sources(output_of(fixture).read_text(encoding="utf-8"))
        assert sources_after[name] == sources_before[name], "the fix touched a clean builder"
        assert all(before[key] == torch.float32 for key in gates), before
        assert after == before
    elif name.startswith("build_unfixed_"):
        assert any(before[key] != torch.float32 for key in gates), before
        assert after == before
    else:
        assert any(before[key] != torch.float32 for key in gates), (
            f"{name}: the finding claims a non-float32 gate cache, but it is {before}"
        )
        assert all(after[key] == torch.float32 for key in gates), after
        assert {key: after[key] for key in others} == {key: before[key] for key in others}


def test_builders_leave_the_default_dtype_alone(tmp_path: Path) -> None:
    # Builders that emulate a model loader must restore torch's default dtype.
    assert torch.get_default_dtype() == torch.float32
