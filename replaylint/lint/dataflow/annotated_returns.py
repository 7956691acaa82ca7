"""Classes that return annotations name: ``def build(...) -> KimiModel``, ``def caches(model) ->
list[ReplayCache]``, ``def replay_caches(model) -> Iterator[tuple[str, ReplayCache]]``.

Typed code names the class of what a function returns even where its body (a walk over
``named_modules()`` filtered by ``isinstance``) cannot be followed. The function's summary keeps
the annotation (:mod:`replaylint.lint.project.return_annotations`); here it is read for a call, a
loop over a call's elements, or one position of the tuples a loop unpacks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.summary_values import as_value
from replaylint.lint.project.index import External, Found, Target
from replaylint.lint.project.summaries import Value
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["annotated_class", "iterated_external", "iterated_pair", "project_function"]


def project_function(prov: Provenance, func: cst.BaseExpression, site: Site) -> Found | None:
    """The project function ``func`` names: imported, or defined at the top of this module."""
    if prov.project is None:
        return None
    value = as_value(prov, func, site, NO_ENV)
    target: object = None
    if value is not None and value[0] == "ref":
        target = prov.project.resolve(str(value[2]))
    elif isinstance(func, cst.Name) and (found := prov.lookup(func.value, site)):
        if not all(
            binding.kind == "definition" and where.scope is prov.index.module
            for binding, where in found
        ):
            return None
        target = prov.project.index.lookup(prov.project.module, func.value)
    if not isinstance(target, Found) or target.definition[0] != "function":
        return None
    return target


def annotated_class(
    prov: Provenance,
    func: cst.BaseExpression,
    site: Site,
    shape: str,
    position: int | None = None,
) -> Found | None:
    """The project class the return annotation of the function ``func`` names, when it
    returns that shape (:mod:`replaylint.lint.project.return_annotations`): an ``"instance"``,
    its ``"elements"``, or at ``position`` of each item of its ``"pairs"``."""
    named = _annotated(prov, func, site, shape, position)
    return named if isinstance(named, Found) and named.definition[0] == "class" else None


def iterated_pair(
    prov: Provenance, target: cst.CSTNode, statement: cst.CSTNode, site: Site
) -> Found | None:
    """``cache`` of ``for name, cache in replay_caches(model)``, where the function is annotated
    to return an iterator of tuples whose element at that position is a project class."""
    named = _iterated(prov, target, statement, site)
    return named if isinstance(named, Found) and named.definition[0] == "class" else None


def iterated_external(
    prov: Provenance, target: cst.CSTNode, statement: cst.CSTNode, site: Site
) -> str | None:
    """The dotted name outside the project (``torch.nn.Module``) that the annotation of the
    function a loop unpacks gives ``target``'s position: ``for name, m in iter_caches(model)``
    of ``def iter_caches(model) -> Iterable[Tuple[str, nn.Module]]``."""
    named = _iterated(prov, target, statement, site)
    return named.name if isinstance(named, External) else None


def _iterated(prov: Provenance, target: cst.CSTNode, statement: cst.CSTNode, site: Site) -> Target:
    if not (
        isinstance(statement, cst.For)
        and isinstance(statement.target, cst.Tuple)
        and isinstance(statement.iter, cst.Call)
    ):
        return None
    elements = [e.value for e in statement.target.elements]
    if target not in elements or any(
        isinstance(e, cst.StarredElement) for e in statement.target.elements
    ):
        return None
    position = next(i for i, e in enumerate(elements) if e is target)
    return _annotated(prov, statement.iter.func, site, "pairs", position)


def _annotated(
    prov: Provenance,
    func: cst.BaseExpression,
    site: Site,
    shape: str,
    position: int | None,
) -> Target:
    """What the return annotation of ``func`` names in that shape and position."""
    target = project_function(prov, func, site)
    extras = target.definition[4] if target is not None and len(target.definition) > 4 else None
    annotated = extras.get("annotated") if isinstance(extras, dict) else None
    if target is None or not isinstance(annotated, list) or annotated[0] != shape:
        return None
    assert prov.project is not None
    named: Value | None = annotated[1]
    if shape == "pairs":
        positions = annotated[1]
        named = positions[position] if position is not None and position < len(positions) else None
    if named is None:
        return None
    return prov.project.index.value_target(target.module, named, (), 0)
