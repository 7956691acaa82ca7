"""The fixture packages: modules that take their gate caches' dtypes from sibling modules.

Textually, as for single-module fixtures: the findings of every module are exactly the annotated
ones, ``--fix`` turns the ``in/`` tree into the golden ``out/`` tree (modules without a finding,
the policy modules among them, stay byte for byte), and the fixed tree keeps only the unfixable
findings. Run on CPU torch, as ``test_fixture_behaviour.py`` runs single modules: each package is
imported from its ``in/`` and from its ``out/`` tree and every ``build_*`` function of it runs,
with the same rules (``build_clean_*`` unchanged and float32, ``build_unfixed_*`` still wrong,
the others float32 after the fix with every other tensor's dtype kept).

Set ``REPLAYLINT_UPDATE_FIXTURES=1`` to rewrite the ``out/`` trees after a deliberate change.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixture_support import PACKAGES, expectations, package_linter, package_modules

pytestmark = pytest.mark.skipif(not PACKAGES, reason="no fixture packages found")


def _ids(path: Path) -> str:
    return path.name


def _relative(package: Path, tree: str, module: Path) -> Path:
    return module.relative_to(package / tree)


@pytest.mark.parametrize("package", PACKAGES, ids=_ids)
def test_findings_are_exactly_the_annotated_ones(package: Path) -> None:
    linter = package_linter(package / "in")
    annotated = 0
    for module in package_modules(package / "in"):
        text = module.read_text(encoding="utf-8")
        expected, _ = expectations(text)
        annotated += len(expected)
        findings = linter.check(text, str(module))
        assert {(f.location.row, f.code) for f in findings} == expected, module
    assert annotated >= 5, "a fixture package should hold several findings"


@pytest.mark.parametrize("package", PACKAGES, ids=_ids)
def test_fix_gives_the_golden_tree(package: Path) -> None:
    linter = package_linter(package / "in")
    for module in package_modules(package / "in"):
        text = module.read_text(encoding="utf-8")
        result = linter.fix(text, str(module), unsafe=True)
        assert result.dropped == ()
        golden = package / "out" / _relative(package, "in", module)
        if os.environ.get("REPLAYLINT_UPDATE_FIXTURES"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(result.source, encoding="utf-8")
        assert result.source == golden.read_text(encoding="utf-8"), module
        if not expectations(text)[0]:
            assert result.source == text, f"{module} has no finding but the fix changed it"
    outs = {_relative(package, "out", m) for m in package_modules(package / "out")}
    assert outs == {_relative(package, "in", m) for m in package_modules(package / "in")}


@pytest.mark.parametrize("package", PACKAGES, ids=_ids)
def test_only_unfixable_findings_remain_and_fixes_converge(package: Path) -> None:
    linter = package_linter(package / "out")
    for module in package_modules(package / "out"):
        fixed = module.read_text(encoding="utf-8")
        _, remaining = expectations(fixed)
        findings = linter.check(fixed, str(module))
        assert {(f.location.row, f.code) for f in findings} == remaining, module
        assert all(f.fix is None for f in findings)
        assert linter.fix(fixed, str(module), unsafe=True).source == fixed


@pytest.mark.parametrize("package", PACKAGES, ids=_ids)
def test_messages_name_the_module_the_dtype_came_from(package: Path) -> None:
    linter = package_linter(package / "in")
    messages = [
        finding.message
        for module in package_modules(package / "in")
        for finding in linter.check(module.read_text(encoding="utf-8"), str(module))
    ]
    assert sum(" at " in m and ".py:" in m for m in messages) >= 3, messages


# --------------------------------------------------------------------------- behaviour
def _builders_of(tree: Path) -> Iterator[tuple[str, str]]:
    for module in package_modules(tree):
        names = [
            node.name
            for node in ast.parse(module.read_text(encoding="utf-8")).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("build_")
        ]
        dotted = ".".join(module.relative_to(tree).with_suffix("").parts)
        for name in names:
            yield dotted, name


def _cases() -> Iterator[Any]:
    for package in PACKAGES:
        for dotted, name in _builders_of(package / "in"):
            yield pytest.param(package, dotted, name, id=f"{package.name}-{dotted}-{name}")


def _function_source(path: Path, name: str) -> str:
    text = path.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    raise AssertionError(f"{name} not in {path}")


def _run_in(tree: Path, dotted: str, name: str) -> dict[str, Any]:
    """Import ``dotted`` from ``tree`` (the package is forgotten afterwards) and run ``name``."""
    torch = pytest.importorskip("torch")
    top = dotted.partition(".")[0]
    sys.path.insert(0, str(tree))
    try:
        module: types.ModuleType = importlib.import_module(dotted)
        builder = getattr(module, name)
        assert inspect.isfunction(builder)
        result = builder()
    finally:
        sys.path.remove(str(tree))
        for loaded in [m for m in sys.modules if m == top or m.startswith(f"{top}.")]:
            del sys.modules[loaded]
    assert isinstance(result, dict), f"{name} must return its tensors by name"
    assert result, f"{name} returned no tensors"
    assert all(isinstance(value, torch.Tensor) for value in result.values())
    return {key: value.dtype for key, value in result.items()}


@pytest.mark.parametrize(("package", "dotted", "name"), list(_cases()))
def test_builder_before_and_after_the_fix(package: Path, dotted: str, name: str) -> None:
    torch = pytest.importorskip("torch")
    gate_names = package_linter(package / "in").gate_caches
    before = _run_in(package / "in", dotted, name)
    after = _run_in(package / "out", dotted, name)
    gates = {key for key in before if gate_names.matches(key)}
    assert gates, f"{name} returns no gate cache (keys: {sorted(before)})"
    assert set(after) == set(before)
    others = set(before) - gates
    path = Path(*dotted.split(".")).with_suffix(".py")
    if name.startswith("build_clean_"):
        clean_before = _function_source(package / "in" / path, name)
        assert _function_source(package / "out" / path, name) == clean_before
        assert all(before[key] == torch.float32 for key in gates), before
        assert after == before
    elif name.startswith("build_unfixed_"):
        assert any(before[key] != torch.float32 for key in gates), before
        assert after == before
    else:
        assert any(before[key] != torch.float32 for key in gates), before
        assert all(after[key] == torch.float32 for key in gates), after
        assert {key: after[key] for key in others} == {key: before[key] for key in others}
