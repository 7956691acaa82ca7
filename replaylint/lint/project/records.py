"""What a record class (a dataclass or a NamedTuple) says about its fields, read with ``ast``:
which fields its constructor fills by position, whether it is frozen, a field's default."""

from __future__ import annotations

import ast

from replaylint.lint.project.module_facts import dotted

CONDITIONAL: tuple[type[ast.stmt], ...] = (
    ast.If,
    ast.Try,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Match,
    *((ast.TryStar,) if hasattr(ast, "TryStar") else ()),
)
"""Statements whose body runs under a condition (or not at all)."""


def positional_fields(cls: ast.ClassDef) -> list[str] | None:
    """The fields a record's constructor fills by position, in order; None when which argument
    fills which is not certain (``kw_only``, ``KW_ONLY``, ``field(init=False)``, a base class
    of a dataclass, fields bound under a condition)."""
    named_tuple = any(dotted(base).endswith("NamedTuple") for base in cls.bases)
    if not named_tuple and (cls.bases or cls.keywords):
        return None  # a dataclass's base classes contribute fields of their own
    for decorator in cls.decorator_list:
        if isinstance(decorator, ast.Call) and any(k.arg == "kw_only" for k in decorator.keywords):
            return None
    fields: list[str] = []
    for statement in cls.body:
        if isinstance(statement, CONDITIONAL):
            return None
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        written = dotted(statement.annotation) or (
            dotted(statement.annotation.value)
            if isinstance(statement.annotation, ast.Subscript)
            else ""
        )
        if written.endswith("ClassVar"):
            continue
        value = statement.value
        if written.endswith("KW_ONLY") or (
            isinstance(value, ast.Call)
            and dotted(value.func).endswith("field")
            and any(k.arg in {"init", "kw_only"} for k in value.keywords)
        ):
            return None
        if statement.target.id in fields:
            return None
        fields.append(statement.target.id)
    return fields


def frozen(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and any(
        k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in node.keywords
    )


def field_default(value: ast.expr | None) -> ast.expr | None:
    """``field(default=x)`` -> ``x``; ``field(...)`` without a default -> None."""
    if isinstance(value, ast.Call) and dotted(value.func).endswith("field"):
        for keyword in value.keywords:
            if keyword.arg == "default":
                return keyword.value
        return None
    return value
