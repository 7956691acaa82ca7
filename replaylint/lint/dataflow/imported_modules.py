"""Module casts of model classes that another module of the project defines.

``loader.py`` writes ``model = KimiModel.from_pretrained(path); model.half()`` or
``def prepare(model: KimiModel): model.to(torch.bfloat16)`` with ``KimiModel`` imported from
``modeling.py``. Through the project index the receiver's class is found in its module, and
that class's summary (:mod:`replaylint.lint.project.module_facts`) says whether it, a base class
or a part it builds (``self.layers = nn.ModuleList([KimiDeltaAttention(...)])``, in any module of
the project, at any depth) registers a floating gate buffer. A class on the way that decides
itself what casts do (guarded, or overriding a cast method) stops the search: nothing is
reported. The receiver must be understood in every way it may have been made: built by calling
the class or one of its inherited constructors (``from_pretrained``, ``from_config``), returned
by a function of the project whose result is such a call, a local bound only to those, a
parameter annotated with the class, or a part of such an instance that its class's summary says
holds one project class (``layer.attn.cache``, ``for layer in model.layers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.annotated_returns import (
    annotated_class,
    iterated_pair,
    project_function,
)
from replaylint.lint.dataflow.helpers import (
    CalledFunction,
    called_function,
    module_class,
    own_method,
)
from replaylint.lint.dataflow.imported import MALFORMED
from replaylint.lint.dataflow.instances import INHERITED_CONSTRUCTORS, MODULE_CHAIN, chain_root
from replaylint.lint.dataflow.new_instances import (
    constructed_here,
    handed_on,
    method_flags,
    methods_called,
    methods_called_after,
)
from replaylint.lint.dataflow.records import unpacked as unpacked_from
from replaylint.lint.dataflow.run_methods import methods_run_elsewhere
from replaylint.lint.dataflow.scalars import instance_values
from replaylint.lint.dataflow.strings import NO_ENV
from replaylint.lint.dataflow.summary_values import as_value
from replaylint.lint.project.gate_buffers import (
    ImportedGateBuffer,
    class_gate_buffer,
    class_value,
    imports_gate_buffer_class,
    registered_gate_buffer,
)
from replaylint.lint.project.index import Found
from replaylint.lint.project.summaries import Value
from replaylint.lint.syntax.annotations import annotated_name, wrapped_class
from replaylint.lint.syntax.nodes import (
    dotted_name,
    is_none_literal,
    plain_element,
    properties_named,
    self_attribute,
)
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

__all__ = [
    "ImportedGateBuffer",
    "assigned_gate_buffer",
    "imported_class",
    "imported_gate_buffer",
    "imports_gate_buffer_class",
    "imports_gate_buffer_holder",
]

if TYPE_CHECKING:
    from replaylint.lint.dataflow.index import ModuleIndex
    from replaylint.lint.dataflow.provenance import Provenance

_MAX_DEPTH = 6


def imports_gate_buffer_holder(prov: Provenance) -> bool:
    """Whether the module imports a project class that holds a gate buffer (:class:`Provenance`
    asks once per module: most modules import none, and their casts need no further question)."""
    project = prov.project
    return project is not None and imports_gate_buffer_class(
        project.index, prov.index.gate_caches.matches, project.module
    )


def imported_gate_buffer(
    prov: Provenance, receiver: cst.BaseExpression, site: Site
) -> ImportedGateBuffer | None:
    """The gate buffer a module cast of ``receiver`` converts, when ``receiver`` is certainly an
    instance of a class of another module of the project that holds one; None otherwise."""
    if prov.project is None:
        return None
    try:
        found = _instance(prov, receiver, site, 0)
        if found is None:
            return None
        # a module made in this scope holds what its methods called here install; one handed in
        # (a parameter, an attribute) may have had any of them run
        made = _made_in_scope(prov, receiver, site)
        known_calls = made and not handed_on(receiver, site)
        called = methods_called(receiver, site) if known_calls else None
        if made and not known_calls:
            called = methods_run_elsewhere(prov, receiver, site, _class)
        fresh = constructed_here(
            prov, receiver, site, lambda func, at: _class(prov, func, at) is not None
        )
        return class_gate_buffer(
            prov.project.index,
            prov.index.gate_caches.matches,
            found,
            called,
            fresh=fresh,
            reinstalled=methods_called_after(receiver, site),
            flags=method_flags(receiver, site) if known_calls else None,
        )
    except MALFORMED:
        return None


def assigned_gate_buffer(
    prov: Provenance, receiver: cst.BaseExpression, site: Site
) -> ImportedGateBuffer | None:
    """The gate buffer that the class of another project module ``receiver`` is certainly an
    instance of registers: what ``receiver.load_state_dict(state, assign=True)`` replaces."""
    found = imported_class(prov, receiver, site)
    if found is None or prov.project is None:
        return None
    return registered_gate_buffer(prov.project.index, prov.index.gate_caches.matches, found)


def _made_in_scope(prov: Provenance, receiver: cst.BaseExpression, site: Site) -> bool:
    """Whether ``receiver`` is a call or a local every binding of which this scope assigns."""
    receiver = chain_root(receiver)
    if isinstance(receiver, cst.Call):
        return True  # `Transformer.from_name(name)`, `build()`: made by the call
    if not isinstance(receiver, cst.Name):
        return False
    found = prov.lookup(receiver.value, site)
    return bool(found) and all(binding.kind == "assign" for binding, _ in found or ())


def imported_class(prov: Provenance, receiver: cst.BaseExpression, site: Site) -> Found | None:
    """The class of another module of the project that ``receiver`` is certainly an instance
    of; None when that is not known."""
    if prov.project is None:
        return None
    try:
        return _instance(prov, receiver, site, 0)
    except MALFORMED:
        return None


# ------------------------------------------------------------------ what the receiver is
def _instance(
    prov: Provenance,
    expr: cst.BaseExpression,
    site: Site,
    depth: int,
    position: int | None = None,
) -> Found | None:
    """The project class ``expr`` is an instance of (with ``position``: the class of that element
    of the tuple ``expr`` is, as in ``model, meta = load_model(path)``)."""
    if depth > _MAX_DEPTH:
        return None
    if position is not None and isinstance(expr, (cst.Tuple, cst.List)):
        element = plain_element(expr, position)
        return None if element is None else _instance(prov, element, site, depth + 1)
    if isinstance(expr, cst.Call):
        func = expr.func
        if position is None:
            if isinstance(func, cst.Attribute) and func.attr.value in MODULE_CHAIN:
                return _instance(prov, func.value, site, depth + 1)
            if isinstance(func, cst.Attribute):
                owner = _class(prov, func.value, site)
                if owner is not None and _constructs(owner, func.attr.value):
                    return owner  # `Transformer.from_name(name)`
            made = _class(prov, func, site) or _built_by_parameter(prov, func, site)
            if made is not None:
                return made
            if (
                isinstance(func, (cst.Name, cst.Attribute))
                and (dotted_name(func) or "").rpartition(".")[2] in _MODULE_CONTAINERS
                and len(expr.args) == 1
            ):
                return _element(prov, expr.args[0].value, site, depth + 1)
        local = called_function(prov.index, prov, expr, site) or _method_of_part(
            prov, func, site, depth
        )
        if local is not None:
            returned = _returned_here(prov, local, depth, position)
            if returned is None and position is None and local[2] is False:
                returned = annotated_class(prov, func, site, "instance")  # `-> Cache`
            return returned
        return _returned_class(prov, func, site, position)
    if isinstance(expr, cst.Name):
        found = prov.lookup(expr.value, site)
        if not found:
            return None
        classes: list[Found | None] = []
        for binding, binding_site in found:
            if binding.kind == "assign" and binding.value is not None:
                classes.append(_instance(prov, binding.value, binding_site, depth + 1, position))
            elif (
                position is None
                and binding.kind == "assign"
                and (unpacked := unpacked_from(binding))
            ):
                value, at = unpacked
                classes.append(_instance(prov, value, binding_site, depth + 1, at))
            elif (
                position is None and binding.kind == "param" and isinstance(binding.node, cst.Param)
            ):
                annotation = binding.node.annotation
                classes.append(
                    None if annotation is None else _annotated(prov, annotation, binding_site)
                )
            elif position is None and binding.kind == "loop":
                source = _loop_source(binding.node, binding.statement)
                part = None if source is None else _part(prov, source, site, depth)
                if part is None and source is not None:  # `for cache in self.caches`
                    part = _element(prov, source, site, depth + 1)
                if part is None and source is None:  # `for name, cache in replay_caches(m)`
                    part = iterated_pair(prov, binding.node, binding.statement, site)
                classes.append(part)
            else:
                classes.append(None)
        if classes and all(c is not None for c in classes):
            return classes[0]
    if position is None and self_attribute(expr) and (holder := site.enclosing_class()) is not None:
        assert isinstance(expr, cst.Attribute)
        return _attribute_instance(prov, holder, expr.attr.value, depth)
    if position is None and isinstance(expr, cst.Attribute):
        return _part(prov, expr, site, depth) or _assigned_here(prov, expr.attr.value, depth)
    return None


def _method_of_part(
    prov: Provenance, func: cst.BaseExpression, site: Site, depth: int
) -> CalledFunction | None:
    """``block.attn.build_cache`` with ``block.attn`` an instance of a class of this module
    (found through the project index): that class's method."""
    if not isinstance(func, cst.Attribute) or prov.project is None:
        return None
    owner = _instance(prov, func.value, site, depth + 1)
    if owner is None or owner.module != prov.project.module:
        return None
    cls = module_class(prov.index, owner.name)
    method = None if cls is None else own_method(prov.index, cls, func.attr.value)
    if cls is None or method is None or method.decorators:
        return None  # none, or a static or class method, or one wrapped
    return method, (prov.index.module, cls, method), True


def _assigned_here(prov: Provenance, attribute: str, depth: int) -> Found | None:
    """``block.attn.kv_cache`` of a holder the analysis cannot follow, where every value the
    module gives an attribute of that name (``block.attn.kv_cache = attn.build_cache(...)``,
    ``= None``) is an instance of one project class: that class."""
    values = assigned_attributes(prov.index).get(attribute)
    if not values:
        return None
    sites = prov.index.call_sites()
    classes: set[tuple[str, str]] = set()
    found: Found | None = None
    for value in values:
        where = sites.get(id(value)) if isinstance(value, cst.Call) else None
        made = None if where is None else _instance(prov, value, where, depth + 1)
        if made is None:
            return None
        classes.add((made.module, made.name))
        found = made
    return found if len(classes) == 1 else None


_ASSIGNED = ("imported_modules.assigned", 0)


def assigned_attributes(index: ModuleIndex) -> dict[str, list[cst.BaseExpression]]:
    """Attribute name -> every value the module assigns to ``<anything>.<name>`` (``None``
    left out: an attribute cleared holds no other class), read in one walk."""
    known: dict[str, list[cst.BaseExpression]] | None = index.memo.get(_ASSIGNED)
    if known is None:
        known = {}
        for node in descendants(index.module):
            if isinstance(node, cst.Assign):
                targets = [t.target for t in node.targets]
            elif isinstance(node, cst.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            value = node.value
            assert value is not None
            for target in targets:
                if isinstance(target, cst.Attribute) and not is_none_literal(value):
                    known.setdefault(target.attr.value, []).append(value)
        index.memo[_ASSIGNED] = known
    return known


_MODULE_CONTAINERS = frozenset({"ModuleList", "Sequential"})


def _built_by_parameter(prov: Provenance, func: cst.BaseExpression, site: Site) -> Found | None:
    """``block_cls(config)`` with ``block_cls: type[Block]``: a Block of the project."""
    if not isinstance(func, cst.Name):
        return None
    found = prov.lookup(func.value, site) or []
    built = [
        wrapped_class(b.node.annotation, "type")
        if b.kind == "param" and isinstance(b.node, cst.Param) and b.node.annotation is not None
        else None
        for b, _ in found
    ]
    if len(built) != 1 or built[0] is None:
        return None
    return _class(prov, built[0], site)


def _element(prov: Provenance, expr: cst.BaseExpression, site: Site, depth: int) -> Found | None:
    """The project class of the elements of ``expr``: a parameter ``blocks: Sequence[Block]``,
    a list of instances."""
    if isinstance(expr, (cst.List, cst.Tuple)) and expr.elements:
        classes = [_instance(prov, e.value, site, depth + 1) for e in expr.elements]
        return classes[0] if all(c is not None and c == classes[0] for c in classes) else None
    if isinstance(expr, (cst.ListComp, cst.GeneratorExp)):
        return _instance(prov, expr.elt, site, depth + 1)
    if isinstance(expr, cst.Call):  # `caches(model)` of `def caches(...) -> list[Cache]`
        return annotated_class(prov, expr.func, site, "elements")
    if self_attribute(expr) and (holder := site.enclosing_class()) is not None:
        assert isinstance(expr, cst.Attribute)
        return _held_elements(prov, holder, expr.attr.value, depth + 1)
    if not isinstance(expr, cst.Name):
        return None
    found = prov.lookup(expr.value, site) or []
    if len(found) != 1:
        return None
    binding, binding_site = found[0]
    if binding.kind == "param" and isinstance(binding.node, cst.Param):
        annotation = binding.node.annotation
        element = wrapped_class(annotation, "elements") if annotation is not None else None
        return _class(prov, element, binding_site) if element is not None else None
    if binding.kind == "assign" and binding.value is not None:
        return _element(prov, binding.value, binding_site, depth + 1)
    return None


def _held_elements(prov: Provenance, owner: cst.ClassDef, name: str, depth: int) -> Found | None:
    """The project class of the elements of ``self.<name>``: of every list the class's methods
    assign it, or of what its property ``name`` returns (``-> List[Cache]``, or a list held)."""
    if depth > _MAX_DEPTH:
        return None
    classes = [
        _element(prov, value, where, depth + 1)
        for value, where in instance_values(prov, owner, name)
    ]
    for method in properties_named(owner, name):
        element = wrapped_class(method.returns, "elements") if method.returns else None
        if element is not None:
            classes.append(_class(prov, element, Site((prov.index.module, owner), None)))
            continue
        scopes = (prov.index.module, owner, method)
        for returned, statement in prov.index.scope(method).returns:
            value = returned.value
            found = (
                None if value is None else _element(prov, value, Site(scopes, statement), depth + 1)
            )
            classes.append(found)
    first = classes[0] if classes else None
    return first if first is not None and all(c == first for c in classes) else None


def _part(prov: Provenance, expr: cst.BaseExpression, site: Site, depth: int) -> Found | None:
    """``layer.attn.cache``, ``model.layers``: the one project class the holder's class builds
    into that attribute (the elements of a ``ModuleList`` of them included), from its summary."""
    if not isinstance(expr, cst.Attribute) or prov.project is None:
        return None
    holder = _instance(prov, expr.value, site, depth + 1)
    if holder is None:
        return _installed_on_elements(prov, expr, site, depth)
    index = prov.project.index
    parts: set[tuple[str, str]] = set()
    found: Found | None = None
    for cls in (holder, *_project_bases(prov, holder)):
        facts = cls.definition[3].get("module")
        if not isinstance(facts, dict):
            continue
        installed = [(attribute, callees) for attribute, callees, _ in facts.get("installs", ())]
        for attribute, callees in [*facts["holds"], *installed]:
            if attribute != expr.attr.value:
                continue
            for callee in callees:
                part = class_value(index, cls.module, callee) if callee[0] != "either" else None
                if part is not None:
                    parts.add((part.module, part.name))
                    found = part
    if not parts:
        return _installed_on_elements(prov, expr, site, depth)
    return found if len(parts) == 1 else None


def _installed_on_elements(
    prov: Provenance, expr: cst.Attribute, site: Site, depth: int
) -> Found | None:
    """``b.attention.cache`` of ``for b in model.layers``, where the class of ``model`` installs
    the part on each of its layers (``for b in self.layers: b.attention.cache = Cache(...)`` in
    ``setup_caches``): the class its summary records for that path, or the first of a choice of
    classes (``StaticCache if static else Cache``) when they are one family."""
    assert prov.project is not None
    chain: list[str] = []
    root: cst.BaseExpression = expr
    while isinstance(root, cst.Attribute):
        chain.insert(0, root.attr.value)
        root = root.value
    if not isinstance(root, cst.Name) or not chain:
        return None
    found = prov.lookup(root.value, site) or []
    if len(found) != 1 or found[0][0].kind != "loop":
        return None
    source = _loop_source(found[0][0].node, found[0][0].statement)
    if not isinstance(source, cst.Attribute):
        return None
    container = _instance(prov, source.value, site, depth + 1)
    facts = container.definition[3].get("module") if container is not None else None
    if container is None or not isinstance(facts, dict):
        return None
    index = prov.project.index
    classes: list[Found] = []
    for attribute, callees, _ in facts.get("installs", ()):
        if str(attribute).split(".")[1:] != chain:
            continue
        for callee in callees:
            choices = callee[1] if callee[0] == "either" else [callee]
            classes += [c for c in (class_value(index, container.module, v) for v in choices) if c]
    if not classes:
        return None
    first = classes[0]
    family = {(first.module, first.name)} | {
        (b.module, b.name) for c in classes for b in _project_bases(prov, c)
    }
    return first if all((c.module, c.name) in family for c in classes) else None


def _project_bases(prov: Provenance, found: Found) -> list[Found]:
    assert prov.project is not None
    facts = found.definition[3].get("module")
    bases = facts["bases"] if isinstance(facts, dict) else ()
    return [b for b in (class_value(prov.project.index, found.module, v) for v in bases) if b]


def _loop_source(target: cst.CSTNode, statement: cst.CSTNode) -> cst.BaseExpression | None:
    """What ``for target in source`` (or ``for i, target in enumerate(source)``) runs over."""
    if not isinstance(statement, cst.For):
        return None
    source, loop_target = statement.iter, statement.target
    if loop_target is target:
        return source
    if (
        isinstance(loop_target, cst.Tuple)
        and len(loop_target.elements) == 2
        and loop_target.elements[1].value is target
        and isinstance(source, cst.Call)
        and isinstance(source.func, cst.Name)
        and source.func.value == "enumerate"
        and source.args
    ):
        return source.args[0].value
    return None


def _attribute_instance(
    prov: Provenance, owner: cst.ClassDef, name: str, depth: int
) -> Found | None:
    """The project class of ``self.<name>`` when every value the class's methods assign it is
    an instance of it (``self.stack = Stack(...)``); a value made from the attribute itself
    (``self.stack = self.stack.to(dtype)``) keeps its class."""
    classes: list[Found | None] = []
    for value, where in instance_values(prov, owner, name):
        root = chain_root(value)
        if self_attribute(root) and isinstance(root, cst.Attribute) and root.attr.value == name:
            continue
        classes.append(_instance(prov, value, where, depth + 1))
    first = classes[0] if classes else None
    return first if first is not None and all(c == first for c in classes) else None


def _returned_here(
    prov: Provenance, called: CalledFunction, depth: int, position: int | None
) -> Found | None:
    """The class every ``return`` of a function of this module gives an instance of."""
    function, scopes, _ = called
    classes: list[Found | None] = []
    for returned, statement in prov.index.scope(function).returns:
        if returned.value is None:
            return None
        classes.append(
            _instance(prov, returned.value, Site(scopes, statement), depth + 1, position)
        )
    if classes and all(c is not None for c in classes):
        return classes[0]
    return None


def _class(prov: Provenance, expr: cst.BaseExpression, site: Site) -> Found | None:
    """The project class ``expr`` (an imported name, or an attribute of an imported module)
    denotes."""
    if prov.project is None:
        return None
    value = as_value(prov, expr, site, NO_ENV)
    if value is not None and value[0] == "ref":
        target = prov.project.resolve(str(value[2]))
    elif isinstance(expr, cst.Name) and _module_class(prov, expr, site):
        # a class of this module: its summary says which parts of other modules it builds
        target = prov.project.resolve(f"{prov.project.module}.{expr.value}")
    else:
        return None
    return target if isinstance(target, Found) and target.definition[0] == "class" else None


def _module_class(prov: Provenance, name: cst.Name, site: Site) -> bool:
    """Whether ``name`` is bound only by one class statement at the top of this module."""
    found = prov.lookup(name.value, site) or []
    return (
        len(found) == 1
        and found[0][0].kind == "definition"
        and isinstance(found[0][0].statement, cst.ClassDef)
        and found[0][0].statement in prov.index.module.body
    )


def _constructs(cls: Found, method: str) -> bool:
    """Whether ``cls.method(...)`` makes an instance of ``cls``: an inherited constructor
    (``from_pretrained``), or a classmethod of the class that returns ``cls(...)``."""
    flags = cls.definition[3]
    made = flags.get("constructors") if isinstance(flags, dict) else None
    return method in INHERITED_CONSTRUCTORS or (isinstance(made, list) and method in made)


def _returned_class(
    prov: Provenance, func: cst.BaseExpression, site: Site, position: int | None = None
) -> Found | None:
    """The class a project function returns an instance of: ``return KimiModel(config)`` (with
    ``position``: ``return KimiModel(config), meta``)."""
    target = project_function(prov, func, site)
    if target is None:
        return None
    result: Value = target.definition[3]
    if result[0] != "call" and position is None:  # `def build(...) -> KimiModel`
        return annotated_class(prov, func, site, "instance")
    if position is not None:
        elements = result[1] if result[0] == "tuple" else []
        result = elements[position] if position < len(elements) else ["unknown"]
    if result[0] != "call":
        return None
    callee: Value = result[1]
    if callee[0] == "attr" and callee[2] in INHERITED_CONSTRUCTORS:
        callee = callee[1]
    assert prov.project is not None
    return class_value(prov.project.index, target.module, callee)


def _annotated(prov: Provenance, annotation: cst.Annotation, site: Site) -> Found | None:
    """``model: KimiModel``, ``"KimiModel"``, ``Optional[KimiModel]``, ``KimiModel | None``."""
    node = annotated_name(annotation)
    return _class(prov, node, site) if isinstance(node, (cst.Name, cst.Attribute)) else None
