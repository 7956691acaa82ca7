"""The signatures of a module's functions and the parameters a helper converts: where a call
that hands the gate cache to a function of the module binds it (``init_rings(d, k, g)``), and
whether that function makes a new tensor of another dtype from it (so the caller's ring is not
the one the function keeps)."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.syntax.traversal import descendants

__all__ = ["converted_parameters", "signatures"]


def signatures(module: cst.Module) -> dict[str, tuple[cst.FunctionDef, list[str]] | None]:
    """The positional parameters, as a call writes its arguments, of the module's functions
    (``name``), classes (``name``: their ``__init__``) and methods (``.name``: called on an
    instance or a class, so without ``self``/``cls``). A name defined twice is None: which one
    a call reaches is not certain."""
    found: dict[str, tuple[cst.FunctionDef, list[str]] | None] = {}

    def define(key: str, function: cst.FunctionDef, parameters: list[str]) -> None:
        if key not in found:
            found[key] = (function, parameters)
        elif (known := found[key]) is None or known[1] != parameters:
            found[key] = None

    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            define(statement.name.value, statement, _positional(statement, method=False))
        elif isinstance(statement, cst.ClassDef):
            body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else ()
            for member in body:
                if not isinstance(member, cst.FunctionDef):
                    continue
                parameters = _positional(member, method=True)
                if member.name.value == "__init__":
                    define(statement.name.value, member, parameters)
                define(f".{member.name.value}", member, parameters)
    return found


def _positional(function: cst.FunctionDef, *, method: bool) -> list[str]:
    parameters = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
    static = any(
        isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod"
        for d in function.decorators
    )
    return parameters[1:] if method and not static and parameters else parameters


def converted_parameters(function: cst.FunctionDef) -> set[str]:
    """Names the function calls a method on that makes a new tensor of another dtype
    (``g.float()``, ``g.to(...)``, ``g.type(...)``) or compares the dtype of."""
    found: set[str] = set()
    for node in descendants(function.body):
        if (
            isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.attr.value in _CONVERTING
        ):
            found.add(node.value.value)
    return found


# what a helper that converts its argument calls on it (or reads to decide a conversion)
_CONVERTING = frozenset({"float", "to", "type", "type_as", "half", "bfloat16", "double", "dtype"})
