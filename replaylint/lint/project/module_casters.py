"""Which functions and methods of a module cast a module they are handed: what a summary tells
importers about ``precision.convert_module(model)`` and ``to_serving_dtype(model)``.

A helper that runs ``module.to(dtype=self.dtype)``, ``module.half()`` or ``module.bfloat16()``
on a parameter converts every floating buffer of whatever its callers pass, gate buffers
included; the caller is where the gate buffer's owner is known. The summary lists, for each
function (``"name"``) and method (``"Class.name"``), the parameters it casts that way, by
position among the arguments a call writes (``self`` and ``cls`` left out) and name, with the
line of the cast and the dtype when it is a literal one (``float16``, ``bfloat16``; ``""`` when
it is not). A parameter handed on, as a bare name, to a function or method of the same module
(``return self._precision.convert_module(module)``: a method of that name) that casts the
parameter in that place counts too, followed to a fixed point. A cast to float32 or float64, or a
device move, converts no gate buffer and is left out. A parameter handed on to a callee the
module does not define is listed apart (``module_forwards``), for importers to follow into the
modules the callee comes from. Made with ``ast`` from the module's text.
"""

from __future__ import annotations

import ast
from typing import Any

_NARROW = {"half": "float16", "bfloat16": "bfloat16"}
_NARROW_DTYPES = frozenset({"float16", "half", "bfloat16"})
_WIDE = frozenset({"float32", "float", "float64", "double"})
_DTYPE_WORDS = ("dtype", "precision")

Caster = list[Any]
"""``[position, parameter, line, dtype]``."""


Forward = list[Any]
"""``[position, parameter, callee, place]``: a parameter handed on to ``callee`` of no function
or method of the module, in ``place`` (a position or a keyword)."""


def module_casters(tree: ast.Module) -> dict[str, list[Caster]]:
    """``{"name" or "Class.name": [[position, parameter, line, dtype], ...]}``."""
    return casters_and_forwards(tree)[0]


def casters_and_forwards(
    tree: ast.Module,
) -> tuple[dict[str, list[Caster]], dict[str, list[Forward]]]:
    """The module's casters, and per function or method the parameters it hands on, as bare
    names, to a function or method it does not define (``self._precision.convert_module(module)``
    of a plugin class of another module): an importer resolves those where the callee lives."""
    functions: dict[str, tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[statement.name] = (statement, False)
        elif isinstance(statement, ast.ClassDef):
            for member in statement.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    static = any(_named(d, "staticmethod") for d in member.decorator_list)
                    functions[f"{statement.name}.{member.name}"] = (member, not static)
    found: dict[str, dict[int, Caster]] = {}
    forwards: list[tuple[str, int, str, str, int | str]] = []
    for qualname, (function, bound) in functions.items():
        params = _positional(function, bound)
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            cast = _cast_of(node)
            if cast is not None and cast[0] in params:
                position = params.index(cast[0])
                found.setdefault(qualname, {})[position] = [position, cast[0], node.lineno, cast[1]]
                continue
            callee = _callee(node)
            if callee is None:
                continue
            for place, arg in _arguments(node):
                if isinstance(arg, ast.Name) and arg.id in params:
                    forwards.append((qualname, params.index(arg.id), arg.id, callee, place))
    changed = True
    while changed:  # a parameter handed on to a helper of the module that casts it
        changed = False
        for qualname, position, parameter, callee, place in forwards:
            if position in found.get(qualname, {}):
                continue
            for other, casts in list(found.items()):
                if other.rpartition(".")[2] != callee:
                    continue
                reached = _cast_at(casts, functions[other], place)
                if reached is not None:
                    line, dtype = reached[2], reached[3]
                    found.setdefault(qualname, {})[position] = [position, parameter, line, dtype]
                    changed = True
                    break
    defined = {qualname.rpartition(".")[2] for qualname in functions}
    handed: dict[str, list[Forward]] = {}
    for qualname, position, parameter, callee, place in forwards:
        if position in found.get(qualname, {}) or callee in defined:
            continue
        entry = [position, parameter, callee, place]
        if entry not in handed.setdefault(qualname, []):
            handed[qualname].append(entry)
    casters = {name: sorted(casts.values()) for name, casts in found.items() if casts}
    return casters, handed


def _positional(function: ast.FunctionDef | ast.AsyncFunctionDef, bound: bool) -> list[str]:
    """The parameters a call fills by position, ``self``/``cls`` of a method left out."""
    params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    return params[1:] if bound and params else params


def _cast_at(
    casts: dict[int, Caster],
    definition: tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool],
    place: int | str,
) -> Caster | None:
    if isinstance(place, int):
        return casts.get(place)
    params = _positional(*definition)
    return casts.get(params.index(place)) if place in params else None


def _cast_of(call: ast.Call) -> tuple[str, str] | None:
    """``(parameter, dtype)`` when ``call`` casts a bare name as a module to a narrow dtype
    (``m.half()``, ``m.to(dtype=d)``, ``m.to(device, torch.bfloat16)``, ``m.type(d)``)."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    name, method = func.value.id, func.attr
    if method in _NARROW and not call.args and not call.keywords:
        return name, _NARROW[method]
    if method not in {"to", "type"}:
        return None
    dtype = next((k.value for k in call.keywords if k.arg in {"dtype", "dst_type"}), None)
    for arg in call.args if dtype is None else ():
        if _dtype_like(arg):
            dtype = arg
            break
    if dtype is None:
        return None
    last = _last_name(dtype)
    if last in _WIDE:
        return None
    return name, last if last in _NARROW_DTYPES else ""


def _dtype_like(expr: ast.expr) -> bool:
    """``torch.bfloat16``, ``dtype``, ``self.precision_dtype``: an argument naming a dtype."""
    last = _last_name(expr).lower()
    return last in _NARROW_DTYPES | _WIDE or any(word in last for word in _DTYPE_WORDS)


def _last_name(expr: ast.expr) -> str:
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value.rpartition(".")[2]
    return ""


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _arguments(call: ast.Call) -> list[tuple[int | str, ast.expr]]:
    placed: list[tuple[int | str, ast.expr]] = []
    for position, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            break
        placed.append((position, arg))
    placed.extend((k.arg, k.value) for k in call.keywords if k.arg is not None)
    return placed


def _named(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name
