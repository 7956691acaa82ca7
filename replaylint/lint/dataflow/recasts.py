"""Module casts undone at once: the cast model handed to a function that puts its gate buffers back.

``FastModel.for_inference(model.to(torch.bfloat16))`` casts every buffer, then sets
``module.g_cache = module.g_cache.float()`` on each layer: the gate buffers end float32. A cast
is undone for a gate buffer when its result, or the name it is bound to or casts, is passed in
the same scope to a function or method (of this module, or of another module of the project
through its summary) that assigns a float32 value (``.float()``, ``.to(torch.float32)``) to an
attribute of that name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.imported import MALFORMED
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.summary_values import as_value
from replaylint.lint.project.index import Found
from replaylint.lint.syntax.nodes import (
    binding_name,
    class_body_values,
    dotted_name,
    literal_string,
    self_attribute,
)
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def undone_for(prov: Provenance, call: cst.Call, site: Site, buffer: str) -> bool:
    """Whether the module cast ``call`` is undone for the gate buffer named ``buffer``: by a
    function its result goes into, by a method of the module's classes called on its result
    (``model.to(torch.bfloat16).restore_fp32_buffers_()``), or by an assignment later in the
    scope into the cast module (``for layer in model.layers: layer.g_cache =
    layer.g_cache.float()``)."""
    names = _names_of_result(call, site)
    takers = _takers(call, site, names)
    if any(
        _restores(_restored(prov, taker.func, site), buffer)
        and _runs_with(prov, site.scope, taker, call)
        for taker in takers
    ):
        return True
    return buffer in _chained_restores(prov, call, site) or _restored_later(
        call, site, names, buffer
    )


# what a restorer records for the buffers each module lists in an attribute of its own
# (`for name in getattr(sub, "_fp32_buffer_names", ()): sub._buffers[name] = buf.float()`)
LISTED = "*"


def _restores(restored: set[str], buffer: str) -> bool:
    return buffer in restored or LISTED in restored


def _runs_with(prov: Provenance, scope: cst.CSTNode, taker: cst.Call, call: cst.Call) -> bool:
    """Whether ``taker`` runs whenever the cast ``call`` does, as far as the scope's ``if``
    statements tell: each test it runs under encloses the cast too, or is written the same as
    one that does, on the same side (``if self.bf16: restore(...)`` after ``elif self.bf16:
    cast``; not after ``if self.fp16: cast``)."""
    return _conditions(prov, scope, taker) <= _conditions(prov, scope, call)


def _conditions(prov: Provenance, scope: cst.CSTNode, node: cst.CSTNode) -> set[tuple[str, bool]]:
    """``(test as written, whether node is in its body)`` for every ``if`` around ``node``."""
    found: set[tuple[str, bool]] = set()
    module = cst.Module([])
    for inner in descendants(scope):
        if isinstance(inner, cst.If):
            if prov.within(node, inner.body):
                found.add((module.code_for_node(inner.test), True))
            elif inner.orelse is not None and prov.within(node, inner.orelse):
                found.add((module.code_for_node(inner.test), False))
    return found


def _chained_restores(prov: Provenance, call: cst.Call, site: Site) -> set[str]:
    """What a method called on the cast's result puts back, for every class of the module that
    defines a method of that name."""
    found: set[str] = set()
    for node in descendants(site.scope):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.value is call
        ):
            name = node.func.attr.value
            for cls in prov.index.classes():
                body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
                for member in body:
                    if isinstance(member, cst.FunctionDef) and member.name.value == name:
                        found |= _restored_by(member, cls)
    return found


def _restored_later(call: cst.Call, site: Site, names: set[str], buffer: str) -> bool:
    """Whether the scope, after the cast, assigns ``buffer`` of the cast module (or of an
    element of a loop over one of its attributes) a float32 value."""
    cast_seen = False
    loops: list[cst.For] = []
    for node in descendants(site.scope):
        if node is call:
            cast_seen = True
        elif not cast_seen:
            continue
        if isinstance(node, cst.For) and _rooted_in(node.iter, names):
            loops.append(node)
        if not (isinstance(node, cst.Assign) and _makes_float32(node.value)):
            continue
        for target in node.targets:
            attribute = target.target
            if not (isinstance(attribute, cst.Attribute) and attribute.attr.value == buffer):
                continue
            loop_names = {binding_name(loop.target) for loop in loops}
            if _rooted_in(attribute.value, names | {n for n in loop_names if n}):
                return True
    return False


def _rooted_in(expr: cst.BaseExpression, names: set[str]) -> bool:
    """``model``, ``model.layers``, ``model.layers[0]`` or ``model.modules()`` for ``model`` in
    ``names``."""
    while True:
        if isinstance(expr, cst.Name):
            return expr.value in names
        if isinstance(expr, cst.Attribute | cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Call):
            expr = expr.func
        else:
            return False


def _names_of_result(call: cst.Call, site: Site) -> set[str]:
    """The name the cast module is (``model.half()``), and the names its result is bound to."""
    names: set[str] = set()
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        receiver = receiver.func.value
    if isinstance(receiver, cst.Name):
        names.add(receiver.value)
    statement = site.statement
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign) and any(n is call for n in descendants(small.value)):
                names.update(
                    name for t in small.targets if (name := binding_name(t.target)) is not None
                )
                names.update(
                    dotted for t in small.targets if (dotted := dotted_name(t.target)) is not None
                )
            held = _added_module(small, call)
            if held is not None:  # `self.add_module("module", module.bfloat16())`
                names.add(held)
    return names


def _added_module(small: cst.BaseSmallStatement, call: cst.Call) -> str | None:
    """``self.module`` for ``self.add_module("module", <the cast>)``."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return None
    adding = small.value
    if not (
        isinstance(adding.func, cst.Attribute)
        and adding.func.attr.value == "add_module"
        and len(adding.args) == 2
        and isinstance(adding.args[0].value, cst.SimpleString)
        and any(n is call for n in descendants(adding.args[1].value))
    ):
        return None
    owner = dotted_name(adding.func.value)
    name = adding.args[0].value.evaluated_value
    return f"{owner}.{name}" if owner is not None and isinstance(name, str) else None


def _takers(call: cst.Call, site: Site, names: set[str]) -> Iterator[cst.Call]:
    """Calls of the scope given the cast's result or one of ``names`` as an argument."""
    for node in descendants(site.scope):
        if (
            isinstance(node, cst.Call)
            and node is not call
            and any(arg.value is call or dotted_name(arg.value) in names for arg in node.args)
        ):
            yield node


def _restored(prov: Provenance, func: cst.BaseExpression, site: Site) -> set[str]:
    """The attributes the function ``func`` names puts back to float32."""
    local = _local_function(prov, func, site)
    if local is not None:
        return _restored_by(local)
    if prov.project is None:
        return set()
    try:
        return _project_restored(prov, func, site)
    except MALFORMED:
        return set()


def _local_function(
    prov: Provenance, func: cst.BaseExpression, site: Site
) -> cst.FunctionDef | None:
    """``helper`` or ``Helper.method`` defined in this module."""
    head = func.value if isinstance(func, cst.Attribute) else func
    if not isinstance(head, cst.Name):
        return None
    for binding, _ in prov.lookup(head.value, site) or ():
        node = binding.node
        if binding.kind != "definition":
            continue
        if isinstance(node, cst.FunctionDef) and head is func:
            return node
        if isinstance(node, cst.ClassDef) and isinstance(func, cst.Attribute):
            for member in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
                if isinstance(member, cst.FunctionDef) and member.name.value == func.attr.value:
                    return member
    return None


def _restored_by(function: cst.FunctionDef, owner: cst.ClassDef | None = None) -> set[str]:
    found: set[str] = set()
    for node in descendants(function.body):
        if isinstance(node, cst.Assign) and _makes_float32(node.value):
            found.update(
                t.target.attr.value for t in node.targets if isinstance(t.target, cst.Attribute)
            )
            if any(_into_buffers(t.target) for t in node.targets):
                found.add(LISTED)  # `module._buffers[name] = buffer.float()`
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Name)
            and node.func.value == "setattr"
            and len(node.args) == 3
            and _makes_float32(node.args[2].value)
        ):  # `setattr(module, name, getattr(module, name).to(torch.float32))`
            found.update(_set_names(function, node.args[1].value, owner))
    return found


def _set_names(
    function: cst.FunctionDef, name: cst.BaseExpression, owner: cst.ClassDef | None
) -> list[str]:
    """The attribute names a ``setattr`` writes: a string, or a loop variable over a literal
    tuple of strings or a class constant (``for name in self._keep_in_fp32_buffers``)."""
    if isinstance(name, cst.SimpleString):
        text = literal_string(name)
        return [text] if text is not None else []
    if not isinstance(name, cst.Name):
        return []
    for node in descendants(function.body):
        if not (isinstance(node, cst.For) and isinstance(node.target, cst.Name)):
            continue
        if node.target.value != name.value:
            continue
        source: cst.BaseExpression = node.iter
        if self_attribute(source) and owner is not None:
            assert isinstance(source, cst.Attribute)
            constants = class_body_values(owner, source.attr.value)
            source = constants[0] if len(constants) == 1 else source
        if isinstance(source, (cst.Tuple, cst.List)):
            texts = [literal_string(e.value) for e in source.elements]
            return [t for t in texts if t is not None]
    return []


def _into_buffers(target: cst.BaseExpression) -> bool:
    return (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Attribute)
        and target.value.attr.value == "_buffers"
    )


def _makes_float32(value: cst.BaseExpression) -> bool:
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
        return False
    if value.func.attr.value == "float" and not value.args:
        return True
    return value.func.attr.value == "to" and any(
        (dotted_name(arg.value) or "").endswith("float32") for arg in value.args
    )


def _project_restored(prov: Provenance, func: cst.BaseExpression, site: Site) -> set[str]:
    """Through the summary of the module that defines ``func`` (a function, or a method of a
    class, imported)."""
    assert prov.project is not None
    index = prov.project.index
    method = func.attr.value if isinstance(func, cst.Attribute) else None
    head = func.value if isinstance(func, cst.Attribute) else func
    value = as_value(prov, head, site, NO_ENV)
    if value is None or value[0] != "ref":
        return set()
    target = prov.project.resolve(str(value[2]))
    if not isinstance(target, Found):
        return set()
    summary = index.summary(target.module)
    table = summary.get("restorers", {}) if summary is not None else {}
    key = f"{target.name}.{method}" if method is not None else target.name
    return set(table.get(key, ()))
