"""What an annotation says of a class: the class it names (``Optional["KimiModel"]``), the class
a ``type[X]`` parameter builds, and the class of a sequence's elements."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.syntax.nodes import dotted_name, literal_string


def annotated_name(annotation: cst.Annotation) -> cst.BaseExpression | None:
    """The class expression an annotation names: ``KimiModel``, ``"KimiModel"``,
    ``Optional[KimiModel]``, ``KimiModel | None``; None for a string that does not parse."""
    node: cst.BaseExpression = annotation.annotation
    for _ in range(3):  # `Optional["KimiModel"]`: a string inside a wrapper, or around one
        text = literal_string(node)
        if text is not None:
            try:
                node = cst.parse_expression(text)
            except cst.ParserSyntaxError:
                return None
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
            parts = [
                p
                for p in (node.left, node.right)
                if not (isinstance(p, cst.Name) and p.value == "None")
            ]
            node = parts[0] if len(parts) == 1 else node
        if (
            isinstance(node, cst.Subscript)
            and (dotted_name(node.value) or "").rpartition(".")[2] == "Optional"
            and len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
        ):
            node = node.slice[0].slice.value
    return node


_TYPE_WRAPPERS = frozenset({"type", "Type"})
_SEQUENCE_WRAPPERS = frozenset(
    {"Sequence", "MutableSequence", "Iterable", "Collection", "list", "List", "tuple", "Tuple"}
)


def class_parameter(param: cst.CSTNode) -> cst.BaseExpression | None:
    """What a class parameter builds: ``X`` of ``type[X]``, else its default class."""
    if not isinstance(param, cst.Param):
        return None
    if param.annotation is not None:
        return wrapped_class(param.annotation, "type")
    return param.default if isinstance(param.default, (cst.Name, cst.Attribute)) else None


def wrapped_class(annotation: cst.Annotation, kind: str) -> cst.BaseExpression | None:
    """The class ``X`` of ``type[X]`` (``kind="type"``) or of ``Sequence[X]``, ``list[X]``,
    ``tuple[X, ...]`` (``kind="elements"``): what a call of the parameter builds, or what its
    elements are."""
    node = annotated_name(annotation)
    if not (isinstance(node, cst.Subscript) and node.slice):
        return None
    wrapper = (dotted_name(node.value) or "").rpartition(".")[2]
    wanted = _TYPE_WRAPPERS if kind == "type" else _SEQUENCE_WRAPPERS
    if wrapper not in wanted:
        return None
    first = node.slice[0].slice
    if not isinstance(first, cst.Index):
        return None
    if len(node.slice) > 1 and not (
        wrapper in {"tuple", "Tuple"}
        and len(node.slice) == 2
        and isinstance(node.slice[1].slice, cst.Index)
        and isinstance(node.slice[1].slice.value, cst.Ellipsis)
    ):
        return None
    inner = annotated_name(cst.Annotation(first.value))
    return inner if isinstance(inner, (cst.Name, cst.Attribute)) else None
