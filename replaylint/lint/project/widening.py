"""Which parameters a module's functions widen to float32: what a summary tells importers about
the weights they are handed.

``def _log_decay(a, A_log, dt_bias): A = A_log.float().exp() ...`` says that its author expects
``A_log`` in another dtype at run time (a model cast, a checkpoint): a class of another module that
passes ``self.A_log`` to it holds that weight in the model's dtype, whatever it was made with, and
a second path of that class that uses the weight without the cast keeps the model's dtype.

A parameter counts as widened when the function calls ``p.float()``, ``p.double()``,
``p.to(torch.float32)`` (positional or ``dtype=``) or ``p.type(torch.float32)`` on it, or passes it
on, as a bare name, to another top-level function of the module that widens the parameter in that
place (followed to a fixed point). Made with ``ast`` from the module's own text.
"""

from __future__ import annotations

import ast

_UPCASTS = frozenset({"float", "double"})
_CASTS = frozenset({"to", "type"})
_WIDE = frozenset({"float32", "float64", "float", "double"})


def widened_parameters(tree: ast.Module) -> dict[str, list[str]]:
    """``{function: [parameter, ...]}`` for the module's top-level functions that widen a
    parameter."""
    functions = {
        statement.name: statement
        for statement in tree.body
        if isinstance(statement, ast.FunctionDef)
    }
    params = {name: _parameters(function) for name, function in functions.items()}
    widened: dict[str, set[str]] = {
        name: {p for p in _cast_here(function) if p in params[name]}
        for name, function in functions.items()
    }
    changed = True
    while changed:
        changed = False
        for name, function in functions.items():
            for callee, place, passed in _passes(function, set(params[name])):
                if callee not in functions or passed in widened[name]:
                    continue
                target = place if isinstance(place, str) else _at(params[callee], place)
                if target is not None and target in widened[callee]:
                    widened[name].add(passed)
                    changed = True
    return {name: sorted(found) for name, found in widened.items() if found}


def _parameters(function: ast.FunctionDef) -> list[str]:
    args = function.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _at(params: list[str], place: int) -> str | None:
    return params[place] if place < len(params) else None


def _cast_here(function: ast.FunctionDef) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(function):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver, method = node.func.value, node.func.attr
        if not isinstance(receiver, ast.Name):
            continue
        if (method in _UPCASTS and not node.args) or (
            method in _CASTS and any(_wide(arg) for arg in _dtype_arguments(node))
        ):
            found.add(receiver.id)
    return found


def _dtype_arguments(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(k.value for k in call.keywords if k.arg == "dtype")]


def _wide(expr: ast.expr) -> bool:
    """``torch.float32``, ``torch.float``, ``"torch.float32"``."""
    if isinstance(expr, ast.Attribute):
        return expr.attr in _WIDE and isinstance(expr.value, ast.Name)
    return isinstance(expr, ast.Constant) and str(expr.value).rpartition(".")[2] in _WIDE


def _passes(function: ast.FunctionDef, params: set[str]) -> list[tuple[str, int | str, str]]:
    """(callee, place or keyword, parameter) for each parameter passed on as a bare name to a
    function called by name."""
    found: list[tuple[str, int | str, str]] = []
    for node in ast.walk(function):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        for place, arg in enumerate(node.args):
            if isinstance(arg, ast.Starred):
                break
            if isinstance(arg, ast.Name) and arg.id in params:
                found.append((node.func.id, place, arg.id))
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg is not None and isinstance(value, ast.Name) and value.id in params:
                found.append((node.func.id, keyword.arg, value.id))
    return found
