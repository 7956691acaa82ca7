"""Small questions about libcst nodes that every layer asks: names, keys, arguments, source text.

No torch knowledge and no dataflow: each answer reads one node (and its children) as written.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.syntax.traversal import syntax_children


def dotted_name(node: cst.CSTNode) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def decorated(function: cst.FunctionDef, name: str) -> bool:
    """Whether ``function`` carries the decorator ``name`` (``classmethod``, ``staticmethod``)."""
    return any(dotted_name(d.decorator) == name for d in function.decorators)


def properties_named(cls: cst.ClassDef, name: str) -> list[cst.FunctionDef]:
    """The ``@property`` methods called ``name`` in the body of ``cls``."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return [
        method
        for method in body
        if isinstance(method, cst.FunctionDef)
        and method.name.value == name
        and decorated(method, "property")
    ]


def class_body_values(
    cls: cst.ClassDef, name: str, *, annotated: bool = True
) -> list[cst.BaseExpression]:
    """The values bound to ``name`` in the body of ``cls``, in order: ``name = v`` and, with
    ``annotated``, ``name: T = v``. Callers decide how many bindings they accept."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    values: list[cst.BaseExpression] = []
    for statement in body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target, value = small.targets[0].target, small.value
            elif annotated and isinstance(small, cst.AnnAssign) and small.value is not None:
                target, value = small.target, small.value
            else:
                continue
            if isinstance(target, cst.Name) and target.value == name:
                values.append(value)
    return values


def is_name(expr: cst.BaseExpression, name: str) -> bool:
    """Whether ``expr`` is the bare name ``name``."""
    return isinstance(expr, cst.Name) and expr.value == name


def self_attribute(expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is ``self.<name>``."""
    return (
        isinstance(expr, cst.Attribute)
        and isinstance(expr.value, cst.Name)
        and expr.value.value == "self"
    )


def is_none_literal(expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is the literal ``None``."""
    return isinstance(expr, cst.Name) and expr.value == "None"


def name_attribute(expr: cst.Attribute) -> str | None:
    """``entry.name``, an attribute of a plain name, written out (how a loop over records binds a
    key); None for a longer chain or another root."""
    value = expr.value
    return f"{value.value}.{expr.attr.value}" if isinstance(value, cst.Name) else None


def binding_name(target: cst.BaseExpression) -> str | None:
    """The name a target binds: ``x`` -> x, ``a.b.x`` -> x, ``d["x"]`` -> x."""
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Attribute):
        return target.attr.value
    if isinstance(target, cst.Subscript):
        return string_key(target)
    return None


def string_key(subscript: cst.Subscript) -> str | None:
    """``"x"`` in ``d["x"]``; None for any other subscript."""
    if len(subscript.slice) != 1:
        return None
    index = subscript.slice[0].slice
    if isinstance(index, cst.Index):
        return literal_string(index.value)
    return None


def literal_string(node: cst.BaseExpression) -> str | None:
    """The value of a plain (not f-, not bytes) string literal."""
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def method_name(call: cst.Call) -> str | None:
    """``x.foo(...)`` -> ``"foo"``."""
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return None


def keyword_arg(call: cst.Call, keyword: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    return None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    """The arguments passed by position, without ``*args`` and ``**kwargs``."""
    return [arg for arg in call.args if arg.keyword is None and arg.star == ""]


def read_count(node: cst.CSTNode, name: str) -> int:
    """How often ``name`` is read in ``node``."""
    return sum(1 for found in read_names(node) if found.value == name)


def read_names(node: cst.CSTNode) -> list[cst.Name]:
    """Names in ``node`` (not keyword names of calls, not attribute names)."""
    if isinstance(node, cst.Name):
        return [node]
    if isinstance(node, cst.Attribute):
        return read_names(node.value)
    if isinstance(node, cst.Arg):
        return read_names(node.value)
    found: list[cst.Name] = []
    for child in syntax_children(node):
        found.extend(read_names(child))
    return found


def plain_elements(sequence: cst.Tuple | cst.List) -> list[cst.BaseExpression] | None:
    """The elements of a tuple or list literal; None when one is spread (``*rest``), which
    moves every place after it."""
    if any(isinstance(e, cst.StarredElement) for e in sequence.elements):
        return None
    return [e.value for e in sequence.elements]


def plain_element(sequence: cst.Tuple | cst.List, position: int) -> cst.BaseExpression | None:
    """The element at ``position`` of a tuple or list literal without a spread."""
    elements = plain_elements(sequence)
    return elements[position] if elements is not None and 0 <= position < len(elements) else None


def one_line(module: cst.Module, node: cst.CSTNode, limit: int = 60) -> str:
    """``node``'s source on one line, shortened to ``limit`` characters (for messages)."""
    text = " ".join(module.code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


Comprehension = cst.ListComp | cst.SetComp | cst.GeneratorExp


def comprehension_in(value: cst.BaseExpression) -> Comprehension | None:
    """The comprehension ``value`` is, directly or wrapped in ``tuple(...)`` / ``list(...)``."""
    if isinstance(value, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
        return value
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Name)
        and value.func.value in {"tuple", "list"}
        and len(value.args) == 1
    ):
        inner = value.args[0].value
        if isinstance(inner, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
            return inner
    return None


def record_fields(cls: cst.ClassDef) -> list[tuple[str, cst.BaseExpression | None]] | None:
    """The fields of a NamedTuple or dataclass, in order, with their defaults; None for any
    other class, and for a dataclass whose fields do not all take a position in ``__init__``
    (``kw_only``, ``KW_ONLY``, ``field(init=False)``): which argument fills which is not read."""
    decorators = [d.decorator for d in cls.decorators]
    dataclass = [d for d in decorators if "dataclass" in (dotted_name(_callee(d)) or "")]
    named_tuple = any((dotted_name(base.value) or "").endswith("NamedTuple") for base in cls.bases)
    if not (dataclass or named_tuple) or not isinstance(cls.body, cst.IndentedBlock):
        return None
    if any(isinstance(d, cst.Call) and keyword_arg(d, "kw_only") is not None for d in dataclass):
        return None
    fields: list[tuple[str, cst.BaseExpression | None]] = []
    for statement in cls.body.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not isinstance(small, cst.AnnAssign) or not isinstance(small.target, cst.Name):
                continue
            annotation = small.annotation.annotation
            if isinstance(annotation, cst.Subscript):
                annotation = annotation.value
            written = dotted_name(annotation) or ""
            if written.endswith("ClassVar"):
                continue  # a class attribute, not a field
            if written.endswith("KW_ONLY") or (
                isinstance(small.value, cst.Call) and keyword_arg(small.value, "init") is not None
            ):
                return None
            fields.append((small.target.value, small.value))
    return fields


def _callee(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.func if isinstance(node, cst.Call) else node


def getattr_name(call: cst.Call) -> cst.BaseExpression | None:
    """``name`` in ``getattr(obj, name).method(...)``."""
    held = call.func.value if isinstance(call.func, cst.Attribute) else None
    if (
        isinstance(held, cst.Call)
        and isinstance(held.func, cst.Name)
        and held.func.value == "getattr"
        and len(held.args) == 2
    ):
        return held.args[1].value
    return None


def constant_slice(expr: cst.BaseExpression) -> slice | None:
    """The slice of ``names[1:3]``, ``names[:-1]``, when every bound is an integer literal."""
    if not (
        isinstance(expr, cst.Subscript)
        and len(expr.slice) == 1
        and isinstance(expr.slice[0].slice, cst.Slice)
    ):
        return None
    part = expr.slice[0].slice
    bounds: list[int | None] = []
    for bound in (part.lower, part.upper, part.step):
        if bound is None:
            bounds.append(None)
            continue
        sign = 1
        if isinstance(bound, cst.UnaryOperation) and isinstance(bound.operator, cst.Minus):
            sign, bound = -1, bound.expression
        if not isinstance(bound, cst.Integer):
            return None
        bounds.append(sign * int(bound.evaluated_value))
    if bounds[2] == 0:
        return None  # a zero step raises
    return slice(*bounds)


def only_statement(line: cst.CSTNode) -> cst.CSTNode:
    """The one small statement of a line that holds just one (``x = f()``); ``line`` itself
    otherwise."""
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line.body[0]
    return line


def entries_rewritten(scope: cst.CSTNode, name: str) -> bool:
    """Whether ``scope`` replaces entries of the mapping ``name`` (``name[key] = x``,
    ``name.update(...)``, ``name.setdefault(...)``)."""
    stack: list[cst.CSTNode] = [scope]
    while stack:
        node = stack.pop()
        if (
            isinstance(node, cst.AssignTarget)
            and isinstance(node.target, cst.Subscript)
            and is_name(node.target.value, name)
        ):
            return True
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and is_name(node.func.value, name)
            and node.func.attr.value in {"update", "setdefault", "__setitem__"}
        ):
            return True
        stack.extend(syntax_children(node))
    return False
