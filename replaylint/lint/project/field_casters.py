"""Which methods of a class cast every tensor it holds to a dtype they are given: what a summary
tells importers about ``state.to(device, dtype=self.param_dtype)`` on a state container.

A container of rings that is no module (a dataclass of per-layer lists, a cache object) often
defines its own ``to``: it moves every tensor, and with a dtype casts every floating one —
``tensor.to(device=device, dtype=dtype)`` in a helper mapped over its fields, or in a
comprehension over them. Called with a dtype that is not float32, it casts the gate ring with
the others. The summary lists, per method, the parameter whose dtype reaches such a cast, by
position among the arguments a call writes (``self`` left out) and name, with the line of the
cast. Only a cast of a name that stands for any of the fields counts (a loop variable, a
comprehension's, a parameter of a nested helper); a cast of one named field (``self.d_ring``)
casts that field only. Made with ``ast`` from the class's text.
"""

from __future__ import annotations

import ast
from typing import Any

FieldCaster = list[Any]
"""``[position, parameter, line]``."""

_CASTS = frozenset({"to", "type"})


def field_casters(cls: ast.ClassDef) -> dict[str, FieldCaster]:
    """``{method: [position, parameter, line]}`` for the methods of ``cls`` that cast the
    tensors they walk to a dtype parameter."""
    found: dict[str, FieldCaster] = {}
    for member in cls.body:
        if not isinstance(member, ast.FunctionDef) or member.name.startswith("__"):
            continue
        params = [a.arg for a in (*member.args.posonlyargs, *member.args.args)][1:]
        params += [a.arg for a in member.args.kwonlyargs]
        walked = _walked_names(member)
        for node in ast.walk(member):
            cast = _cast_to_parameter(node, params, walked)
            if cast is not None:
                position = params.index(cast) if cast in params else -1
                found[member.name] = [position, cast, getattr(node, "lineno", member.lineno)]
                break
    return found


def _walked_names(method: ast.FunctionDef) -> set[str]:
    """The names that stand for any of the tensors the method walks: loop and comprehension
    variables (of a loop over anything but one named field: ``for t in self.d_ring`` casts the
    d ring only), and the parameters of the helpers it defines inside."""
    names: set[str] = set()
    for node in ast.walk(method):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.For, ast.comprehension)) and not _one_field(node.iter):
            targets.append(node.target)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and node is not method:
            names.update(a.arg for a in node.args.args)
        for target in targets:
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _one_field(iterable: ast.expr) -> bool:
    """``self.d_ring`` (or an item of it): the tensors of one named field, not of every one."""
    while isinstance(iterable, ast.Subscript):
        iterable = iterable.value
    return (
        isinstance(iterable, ast.Attribute)
        and isinstance(iterable.value, ast.Name)
        and iterable.value.id == "self"
    )


def _cast_to_parameter(node: ast.AST, params: list[str], walked: set[str]) -> str | None:
    """The parameter ``node`` casts a walked tensor to (``tensor.to(dtype=dtype)``,
    ``t.to(device, dtype)``, ``t.type(dtype)``)."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _CASTS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in walked
    ):
        return None
    candidates = [k.value for k in node.keywords if k.arg in {"dtype", "dst_type"}]
    candidates += list(node.args[:2])
    for candidate in candidates:
        if isinstance(candidate, ast.Name) and candidate.id in params and "dtype" in candidate.id:
            return candidate.id
    return None
