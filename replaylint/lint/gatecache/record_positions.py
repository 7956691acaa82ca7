"""Gate rings handed to a record of the rings by position.

A record class whose field is named like a gate cache (``class ReplayRings(NamedTuple): state;
d_cache; k_cache; g_cache; write_pos``) is filled positionally as often as by keyword:

    @classmethod
    def from_cache(cls, c):
        return cls(c["ssm_state"], c["delta_mem"], c["key_mem"], c["log_forget"], c["write_pos"])

What the construction passes at the gate field's place is the gate ring, as ``ReplayRings(
g_cache=c["log_forget"])`` would say by keyword. Records are NamedTuples and dataclasses (not
``kw_only``, no base class but ``NamedTuple``) of the same file; a construction is a call of the
class by name, or of ``cls`` in one of its class methods. A call that spreads arguments before
the gate field's place (``cls(*parts)``) says nothing.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from replaylint.lint.gatecache.calls import dotted, passed_name
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom

__all__ = ["positional_record_names", "record_field_pattern", "record_fields"]

_NOT_TENSORS = re.compile(r"\b(?:dtype|str|int|float|bool)\b")


def record_field_pattern(names: GateCacheNames) -> re.Pattern[str]:
    """A class-body line that declares a field named like a gate cache (``g_cache:``): the text
    test before a file is parsed for such records."""
    words = names.literal_alternation()
    return re.compile(rf"^[ \t]+\w*(?:{words})\w*[ \t]*:[^=\n]", re.MULTILINE)


def positional_record_names(
    tree: ast.Module, filename: str, patterns: GateCacheNames
) -> Iterator[tuple[str, LearnedFrom]]:
    """The names passed at a gate field's place to the records of ``tree``."""
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        fields = record_fields(cls)
        if fields is None:
            continue
        gates = [i for i, field in enumerate(fields) if field and patterns.matches(field)]
        if not gates:
            continue
        for call, built in _constructions(tree, cls):
            for position in gates:
                yield from _passed_at(call, position, fields, built, filename)


def record_fields(cls: ast.ClassDef) -> list[str] | None:
    """The fields a NamedTuple or dataclass (not ``kw_only``, no base class but ``NamedTuple``)
    fills by position, in order, with ``""`` for a field declared a dtype, a name or a number
    (it holds no ring); None for any other class, and for one whose places a reading of its
    body cannot be sure of (an ``InitVar``)."""
    named_tuple = any(_last_part(base) == "NamedTuple" for base in cls.bases)
    dataclass = any(_last_part(_called(d)) == "dataclass" for d in cls.decorator_list)
    if not (named_tuple or (dataclass and not cls.bases)):
        return None
    for decorator in cls.decorator_list:
        if isinstance(decorator, ast.Call) and any(k.arg == "kw_only" for k in decorator.keywords):
            return None
    fields: list[str] = []
    for statement in cls.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            written = ast.unparse(statement.annotation)
            if "ClassVar" in written or "KW_ONLY" in written:
                continue
            if "InitVar" in written:
                return None
            fields.append("" if _NOT_TENSORS.search(written) else statement.target.id)
    return fields


def _constructions(tree: ast.Module, cls: ast.ClassDef) -> Iterator[tuple[ast.Call, str]]:
    """Calls of ``cls`` by name anywhere in ``tree``, and of ``cls`` in its class methods."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == cls.name
        ):
            yield node, cls.name
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef) or not any(
            dotted(d) == "classmethod" for d in method.decorator_list
        ):
            continue
        first = method.args.posonlyargs + method.args.args
        if not first:
            continue
        own = first[0].arg
        for node in ast.walk(method):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == own
            ):
                yield node, cls.name


def _passed_at(
    call: ast.Call, position: int, fields: list[str], built: str, filename: str
) -> Iterator[tuple[str, LearnedFrom]]:
    args = call.args
    if any(isinstance(a, ast.Starred) for a in args[: position + 1]) or position >= len(args):
        return
    argument = args[position]
    name = passed_name(argument)
    others = [*(a for a in args if a is not argument), *(k.value for k in call.keywords)]
    if name is None or any(passed_name(other) == name for other in others):
        return
    yield name, LearnedFrom(filename, call.lineno, f"{built}({fields[position]}=...)")


def _called(node: ast.expr) -> ast.expr:
    return node.func if isinstance(node, ast.Call) else node


def _last_part(node: ast.expr) -> str:
    return (dotted(node) or "").rpartition(".")[2]
