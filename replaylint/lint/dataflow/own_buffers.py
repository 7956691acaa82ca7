"""Loops over a module's own buffers: ``for name, buf in self.named_buffers()`` in a class that
registers its buffers under literal names.

A cache module's snapshot, swap and restore methods walk ``self.named_buffers()``,
``self.buffers()``, ``self.state_dict().items()`` or ``self._buffers.items()``; each iteration is
one of the buffers the class registers (``self.register_buffer("g_cache", ...)``,
``self.g_cache = nn.Buffer(...)``), so the loop's name and tensor are known per iteration. The
names are a lower bound: buffers of submodules and of base classes are not listed.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.syntax.nodes import is_name, method_name, positional_args
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

__all__ = ["own_buffer_items"]

_PAIRS = frozenset({"named_buffers"})
_TENSORS = frozenset({"buffers"})
_MAPPINGS = frozenset({"state_dict", "_buffers"})


def own_buffer_items(
    expr: cst.BaseExpression, site: Site
) -> list[tuple[cst.BaseExpression, Site]] | None:
    """Per buffer the class of ``site`` registers, what an iteration of ``expr`` yields
    (``(name, self.<name>)``, the tensor, or the name); None when ``expr`` is no such walk."""
    shape = _walk(expr)
    if shape is None:
        return None
    cls = site.enclosing_class()
    if cls is None:
        return None
    names = registered_buffers(cls)
    if not names:
        return None
    items: list[tuple[cst.BaseExpression, Site]] = []
    for name in names:
        key = cst.SimpleString(repr(name))
        tensor = cst.Attribute(value=cst.Name("self"), attr=cst.Name(name))
        if shape == "pairs":
            items.append((cst.Tuple([cst.Element(key), cst.Element(tensor)]), site))
        elif shape == "tensors":
            items.append((tensor, site))
        else:
            items.append((key, site))
    return items


def _walk(expr: cst.BaseExpression) -> str | None:
    """``"pairs"``, ``"tensors"`` or ``"names"``: what iterating ``expr`` yields, when it walks
    the buffers of ``self``."""
    if not isinstance(expr, cst.Call) or not isinstance(expr.func, cst.Attribute):
        return None
    method = method_name(expr)
    receiver = expr.func.value
    if method in _PAIRS | _TENSORS and is_name(receiver, "self") and not positional_args(expr):
        return "pairs" if method in _PAIRS else "tensors"
    if method in {"items", "values", "keys"} and not expr.args:
        mapping = receiver
        owned = (
            isinstance(mapping, cst.Call)
            and isinstance(mapping.func, cst.Attribute)
            and mapping.func.attr.value == "state_dict"
            and is_name(mapping.func.value, "self")
            and not mapping.args
        ) or (
            isinstance(mapping, cst.Attribute)
            and mapping.attr.value == "_buffers"
            and is_name(mapping.value, "self")
        )
        if owned:
            return {"items": "pairs", "values": "tensors", "keys": "names"}[method]
    return None


def registered_buffers(cls: cst.ClassDef) -> list[str]:
    """The literal names the class's methods register buffers under, in order."""
    names: list[str] = []
    for node in descendants(cls):
        name: str | None = None
        if isinstance(node, cst.Call) and method_name(node) == "register_buffer":
            func = node.func
            args = positional_args(node)
            if isinstance(func, cst.Attribute) and is_name(func.value, "self") and args:
                first = args[0].value
                if isinstance(first, cst.SimpleString) and isinstance(first.evaluated_value, str):
                    name = first.evaluated_value
        elif isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = node.targets[0].target
            value = node.value
            if (
                isinstance(target, cst.Attribute)
                and is_name(target.value, "self")
                and isinstance(value, cst.Call)
                and method_name(value) == "Buffer"
            ):
                name = target.attr.value
        if name is not None and name not in names:
            names.append(name)
    return names
