"""Which classes of the module an expression builds: instances, and the submodules they hold.

Two questions, both about the module's own classes (by name):

* :func:`instance_classes` — what a value *is*, for the receiver of a module cast: every way it
  may have been made must be understood (direct construction, ``cls(...)`` in a classmethod, a
  classmethod such as ``from_pretrained`` called on the class, a factory function or method of
  the module, an annotated parameter, ``self`` and ``self.<attribute>``, a part of another
  instance (``layer.cache``: what the holder's class builds there) and a loop variable over the
  parts an instance holds (``for layer in model.layers``)); otherwise None.
* :func:`contained_classes` — what a value set as an attribute *holds*: the classes built inside
  it, through ``nn.ModuleList``, ``nn.ModuleDict``, ``nn.Sequential``, lists, tuples, dicts,
  comprehensions, conditionals, and local lists appended to before they are wrapped. A part that
  is not understood holds nothing.

Both start from :mod:`.module_classes`: the module's classes and what their methods assign to
attributes of ``self``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import records
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.module_classes import (
    ADDING_METHODS,
    ModuleClasses,
    Names,
    attribute_values,
    is_static,
    module_classes,
)
from replaylint.lint.syntax.annotations import annotated_name, class_parameter, wrapped_class
from replaylint.lint.syntax.nodes import (
    decorated,
    dotted_name,
    is_name,
    plain_element,
    properties_named,
)
from replaylint.lint.syntax.sites import ScopeNode, Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

_MAX_DEPTH = 6
_MODULE_CONTAINERS = frozenset({"ModuleList", "ModuleDict", "Sequential"})
# methods of nn.Module that return the module itself, keeping what it holds
MODULE_CHAIN = frozenset({"to", "cuda", "cpu", "eval", "train", "requires_grad_", "share_memory"})
# callables whose result holds what their arguments hold
_CONTAINERS = frozenset(
    {"ModuleList", "ModuleDict", "Sequential", "list", "tuple", "dict", "OrderedDict"}
)
# constructors a model class inherits from its library (transformers): they return `cls(...)`
INHERITED_CONSTRUCTORS = frozenset({"from_pretrained", "from_config", "_from_config"})


def chain_root(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``model.cuda().eval()`` -> ``model``: the module a chain of module methods runs on."""
    while (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in MODULE_CHAIN
    ):
        expr = expr.func.value
    return expr


# ---------------------------------------------------------------- what a value holds (may)
def contained_classes(
    prov: Provenance,
    classes: ModuleClasses,
    expr: cst.BaseExpression,
    site: Site,
    passed: dict[str, Names] | None = None,
) -> Names:
    """The module classes whose instances ``expr``'s value is, or holds as elements; ``passed``
    names the classes a construction gives class parameters (``layer_cls=PinnedLayer``)."""
    return _Resolver(prov, classes, site, passed or {}).contained(expr, site, 0, None)


def method_of_instance(
    prov: Provenance, call: cst.Call, site: Site
) -> tuple[cst.FunctionDef, tuple[ScopeNode, ...]] | None:
    """The method ``x.m(...)`` runs when ``x`` is an instance of one class of the module that
    defines ``m`` (or inherits it from a class of the module): ``self.config.ring_shapes(b)``."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return None
    classes = module_classes(prov)
    names = instance_classes(prov, classes, func.value, site)
    if not names or len(set(names)) != 1:
        return None
    cls = classes.by_name.get(names[0])
    for owner in classes.mro(cls) if cls is not None else ():
        for statement in owner.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == func.attr.value:
                return statement, (*classes.scopes[id(owner)], statement)
    return None


def instance_classes(
    prov: Provenance, classes: ModuleClasses, expr: cst.BaseExpression, site: Site
) -> Names | None:
    """The module classes ``expr``'s value may be an instance of, when every way it may have
    been made is one of them; None otherwise."""
    return _Resolver(prov, classes, site).instances(expr, site, 0, None)


@dataclass
class _Resolver:
    prov: Provenance
    classes: ModuleClasses
    use: Site
    """Where the question is asked: its ``if`` tests decide conditionals on the same test."""
    passed: dict[str, Names] = dataclasses.field(default_factory=dict)

    def contained(
        self, expr: cst.BaseExpression, site: Site, depth: int, cls_name: str | None
    ) -> Names:
        if depth > _MAX_DEPTH:
            return ()
        deeper = depth + 1
        if isinstance(expr, cst.Call):
            made = self._constructed(expr.func, site, deeper, cls_name)
            if made is not None:
                return made
            func = expr.func
            if isinstance(func, cst.Attribute) and func.attr.value in MODULE_CHAIN:
                return self.contained(func.value, site, deeper, cls_name)
            if (dotted_name(func) or "").rpartition(".")[2] in _CONTAINERS:
                return _union(self.contained(a.value, site, deeper, cls_name) for a in expr.args)
            returned = self._returned(expr, site, deeper, cls_name, self.contained)
            return _union(r for r in returned or () if r is not None)
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set, cst.Dict)):
            return _union(
                self.contained(element.value, site, deeper, cls_name) for element in expr.elements
            )
        if isinstance(expr, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
            return self.contained(expr.elt, site, deeper, cls_name)
        if isinstance(expr, cst.DictComp):
            return self.contained(expr.value, site, deeper, cls_name)
        if isinstance(expr, cst.IfExp):
            parts = (expr.body, expr.orelse)
            return _union(self.contained(part, site, deeper, cls_name) for part in parts)
        if isinstance(expr, cst.BooleanOperation):
            parts = (expr.left, expr.right)
            return _union(self.contained(part, site, deeper, cls_name) for part in parts)
        if isinstance(expr, cst.Subscript):
            return self.contained(expr.value, site, deeper, cls_name)
        if isinstance(expr, cst.Name):
            found: list[Names] = []
            for binding, binding_site in self.prov.lookup(expr.value, site) or ():
                if binding.kind == "assign" and binding.value is not None:
                    found.append(self.contained(binding.value, binding_site, deeper, cls_name))
                elif (
                    binding.kind == "param"
                    and isinstance(binding.node, cst.Param)
                    and binding.node.annotation is not None
                ):  # `blocks: Sequence[Block]`
                    element = wrapped_class(binding.node.annotation, "elements")
                    cls = self.classes.by_name.get(dotted_name(element) or "") if element else None
                    found.append(self.classes.family(cls) if cls is not None else ())
            for added in _added_to(expr.value, site.scope):  # `layers.append(Layer(...))`
                found.append(self.contained(added, site, deeper, cls_name))
            return _union(found)
        return ()

    def instances(
        self, expr: cst.BaseExpression, site: Site, depth: int, cls_name: str | None
    ) -> Names | None:
        if depth > _MAX_DEPTH:
            return None
        if is_name(expr, "None"):
            return ()  # `self.model = None` until loaded: no module to cast
        deeper = depth + 1
        if isinstance(expr, cst.Call):
            made = self._constructed(expr.func, site, deeper, cls_name)
            if made is not None:
                return made
            func = expr.func
            if isinstance(func, cst.Attribute) and func.attr.value in MODULE_CHAIN:
                return self.instances(func.value, site, deeper, cls_name)
            if (dotted_name(func) or "").rpartition(".")[2] in _MODULE_CONTAINERS:
                # a cast of `nn.ModuleList(blocks)` is a cast of every block it holds
                return self.contained(expr, site, deeper, cls_name) or None
            returned = self._returned(expr, site, deeper, cls_name, self.instances)
            return _all_known(returned)
        if isinstance(expr, cst.IfExp):
            decided = self._decided(expr.test, site)
            if decided is not None:
                return self.instances(expr.body if decided else expr.orelse, site, deeper, cls_name)
            parts = (expr.body, expr.orelse)
            return _all_known([self.instances(part, site, deeper, cls_name) for part in parts])
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
            owner = self._self_class(expr.value.value, site)
            if owner is None:
                return self._held(expr, site, deeper)
            values = [
                self.instances(value, value_site, deeper, None)
                for attribute, value, value_site in attribute_values(self.classes, owner)
                if attribute == expr.attr.value
            ]
            return _all_known(values) if values else None
        if isinstance(expr, cst.Attribute):
            return self._held(expr, site, deeper)
        if isinstance(expr, cst.Name):
            owner = self._self_class(expr.value, site)
            if owner is not None:
                return self.classes.family(owner)
            found = self.prov.lookup(expr.value, site)
            if not found:
                return None
            bound: list[Names | None] = []
            for binding, binding_site in found:
                if binding.kind == "assign" and binding.value is not None:
                    bound.append(self.instances(binding.value, binding_site, deeper, cls_name))
                elif binding.kind == "assign" and (unpacked := records.unpacked(binding)):
                    value, position = unpacked  # `model, meta = load_model(...)`
                    bound.append(self._element(value, position, binding_site, deeper, cls_name))
                elif binding.kind == "param" and isinstance(binding.node, cst.Param):
                    annotation = binding.node.annotation
                    bound.append(None if annotation is None else self._annotated(annotation))
                elif binding.kind == "loop":
                    bound.append(self._iterated(binding.node, binding.statement, site, deeper))
                else:
                    bound.append(None)
            return _all_known(bound)
        return None

    def _held(self, expr: cst.Attribute, site: Site, depth: int) -> Names | None:
        """``layer.cache`` where ``layer`` is an instance of the module's classes: what each of
        them builds into ``cache`` (``self.cache = Cache(...)``, a ``ModuleList`` of layers)."""
        holders = self.instances(expr.value, site, depth, None)
        if not holders:
            return None
        found: list[Names | None] = []
        for holder in holders:
            cls = self.classes.by_name.get(holder)
            if cls is None:
                return None
            values = [
                (value, value_site)
                for attribute, value, value_site in attribute_values(self.classes, cls)
                if attribute == expr.attr.value
            ]
            if not values:
                return None
            for value, value_site in values:
                made = self.instances(value, value_site, depth, None)
                found.append(made if made else self.contained(value, value_site, depth, None))
        return _all_known(found)

    def _iterated(
        self, target: cst.CSTNode, statement: cst.CSTNode, site: Site, depth: int
    ) -> Names | None:
        """The module classes a ``for`` loop's variable takes: the elements of what it runs over
        (``for layer in model.layers``, ``for i, layer in enumerate(...)``, ``.values()``)."""
        if not isinstance(statement, cst.For):
            return None
        source: cst.BaseExpression = statement.iter
        loop_target = statement.target
        if isinstance(loop_target, cst.Tuple):
            elements = [element.value for element in loop_target.elements]
            if not (isinstance(source, cst.Call) and len(elements) == 2 and elements[1] is target):
                return None
            if is_name(source.func, "enumerate") and source.args:
                source = source.args[0].value  # `for i, layer in enumerate(model.layers)`
            elif isinstance(source.func, cst.Attribute) and source.func.attr.value == "items":
                source = source.func.value  # `for name, layer in layers.items()`
            else:
                return None
        elif loop_target is not target:
            return None
        if (
            isinstance(source, cst.Call)
            and isinstance(source.func, cst.Attribute)
            and source.func.attr.value in {"values", "children", "modules"}
            and not source.args
        ):
            source = source.func.value
        holders = self._elements(source, site, depth)
        return holders or None

    def _elements(self, source: cst.BaseExpression, site: Site, depth: int) -> Names:
        """The module classes whose instances ``source`` holds as elements."""
        if isinstance(source, cst.Attribute):
            holders = self.instances(source.value, site, depth, None)
            found: list[Names] = []
            for holder in holders or ():
                cls = self.classes.by_name.get(holder)
                if cls is None:
                    continue
                for attribute, value, value_site in attribute_values(self.classes, cls):
                    if attribute == source.attr.value:
                        found.append(self.contained(value, value_site, depth, None))
                found.extend(self._property_elements(cls, source.attr.value, depth))
            return _union(found)
        return self.contained(source, site, depth, None)

    def _property_elements(self, cls: cst.ClassDef, name: str, depth: int) -> Iterator[Names]:
        """The module classes of the elements the property ``name`` of ``cls`` returns
        (``-> List[Cache]``, or a list it returns)."""
        for method in properties_named(cls, name):
            element = wrapped_class(method.returns, "elements") if method.returns else None
            held = self.classes.by_name.get(dotted_name(element) or "") if element else None
            if held is not None:
                yield self.classes.family(held)
                continue
            scopes = (*self.classes.scopes[id(cls)], method)
            for returned, statement in self.prov.index.scope(method).returns:
                if returned.value is not None:
                    yield self._elements(returned.value, Site(scopes, statement), depth + 1)

    def _element(
        self, value: cst.BaseExpression, position: int, site: Site, depth: int, cls_name: str | None
    ) -> Names | None:
        """The instances at ``position`` of what a factory call returns as a tuple."""
        if not isinstance(value, cst.Call):
            return None

        def element(
            returned: cst.BaseExpression, at: Site, depth: int, cls_name: str | None
        ) -> Names | None:
            if not isinstance(returned, (cst.Tuple, cst.List)):
                return None
            element = plain_element(returned, position)
            return None if element is None else self.instances(element, at, depth, cls_name)

        return _all_known(self._returned(value, site, depth, cls_name, element))

    # ---------------------------------------------------------------- shared by both questions
    def _constructed(
        self, func: cst.BaseExpression, site: Site, depth: int, cls_name: str | None
    ) -> Names | None:
        """The classes a call of ``func`` constructs, when ``func`` is (bound to) a class."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(func, cst.Name):
            if func.value == "cls":
                if cls_name is not None:
                    return (cls_name,)
                owner = site.enclosing_class()
                function = site.scope
                if (
                    owner is not None
                    and isinstance(function, cst.FunctionDef)
                    and decorated(function, "classmethod")
                ):
                    return self.classes.family(owner)
                return None
            found = self.prov.lookup(func.value, site)
            if found and all(b.kind == "param" for b, _ in found):
                if func.value in self.passed:
                    return self.passed[func.value]
                # `block_cls: type[Block] = Block`: a call builds a Block (or a subclass)
                built = [class_parameter(b.node) for b, _ in found]
                built_names = {dotted_name(b) or "" for b in built if b is not None}
                if len(built_names) == 1 and None not in built:
                    cls = self.classes.by_name.get(next(iter(built_names)))
                    return self.classes.family(cls) if cls is not None else None
                return None
            if found and all(b.kind == "definition" for b, _ in found):
                names = {b.node.name.value for b, _ in found if isinstance(b.node, cst.ClassDef)}
                if len(names) == len(found) and names <= self.classes.by_name.keys():
                    return tuple(sorted(names))
                return None
            if found is None:  # defined after use, or nowhere: the module's class by that name
                return (func.value,) if func.value in self.classes.by_name else None
            # `model_class = Fast if fast else Slow; model_class(config)`
            values = [b.value for b, _ in found if b.kind == "assign" and b.value is not None]
            if len(values) != len(found):
                return None
            return _all_known(
                [
                    self._constructed(v, s, depth + 1, cls_name)
                    for v, (_, s) in zip(values, found, strict=True)
                ]
            )
        if isinstance(func, cst.IfExp):
            parts = (func.body, func.orelse)
            return _all_known([self._constructed(p, site, depth + 1, cls_name) for p in parts])
        if isinstance(func, cst.Subscript):
            # `ATTENTION_CLASSES[config.attn_implementation](config, layer_idx)`
            entries = self._table(func.value, site)
            if entries is None:
                return None
            return _all_known([self._constructed(v, s, depth + 1, cls_name) for v, s in entries])
        return None

    def _table(
        self, table: cst.BaseExpression, site: Site
    ) -> list[tuple[cst.BaseExpression, Site]] | None:
        """The values of a dict literal ``table`` is (or a name bound once to one)."""
        if isinstance(table, cst.Name):
            found = self.prov.lookup(table.value, site) or []
            if len(found) != 1 or found[0][0].kind != "assign" or found[0][0].value is None:
                return None
            binding, site = found[0]
            assert binding.value is not None
            table = binding.value
        if not isinstance(table, cst.Dict) or not table.elements:
            return None
        if not all(isinstance(e, cst.DictElement) for e in table.elements):
            return None
        return [(element.value, site) for element in table.elements]

    def _returned(
        self,
        call: cst.Call,
        site: Site,
        depth: int,
        cls_name: str | None,
        resolve: Callable[[cst.BaseExpression, Site, int, str | None], Names | None],
    ) -> list[Names | None]:
        """``resolve`` of each value a factory of the module returns for ``call`` (a function,
        a method on ``self``/``cls``, or a classmethod called on one of the module's classes)."""
        func = call.func
        target: tuple[cst.FunctionDef, tuple[ScopeNode, ...]] | None = None
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            owners = self._constructed(func.value, site, depth, cls_name)
            if owners is not None and len(owners) == 1:
                owner = self.classes.by_name[owners[0]]
                target = self._method(owner, func.attr.value)
                if target is None:
                    inherited = func.attr.value in INHERITED_CONSTRUCTORS
                    return [owners] if inherited else []
                cls_name = owners[0]
        if target is None:
            called = called_function(self.prov.index, self.prov, call, site)
            if called is None:
                return []
            target = called[0], called[1]
        function, scopes = target
        results: list[Names | None] = []
        for returned, statement in self.prov.index.scope(function).returns:
            value = returned.value
            if value is None or is_name(value, "None"):
                continue  # no module to cast
            results.append(resolve(value, Site(scopes, statement), depth, cls_name))
        return results

    def _method(
        self, owner: cst.ClassDef, name: str
    ) -> tuple[cst.FunctionDef, tuple[ScopeNode, ...]] | None:
        for cls in self.classes.mro(owner):
            for statement in cls.body.body:
                if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                    return statement, (*self.classes.scopes[id(cls)], statement)
        return None

    def _self_class(self, name: str, site: Site) -> cst.ClassDef | None:
        """The enclosing class when ``name`` is the first parameter of an instance method."""
        owner = site.enclosing_class()
        function = site.scope
        if owner is None or not isinstance(function, cst.FunctionDef) or is_static(function):
            return None
        params = function.params.params or function.params.posonly_params
        if not params or params[0].name.value != name or decorated(function, "classmethod"):
            return None
        found = self.prov.lookup(name, site) or []
        return owner if all(b.kind == "param" for b, _ in found) else None

    def _annotated(self, annotation: cst.Annotation) -> Names | None:
        """The module class a parameter annotation names (see :func:`annotated_name`)."""
        node = annotated_name(annotation)
        name = dotted_name(node) if node is not None else None
        return (name,) if name is not None and name in self.classes.by_name else None

    def _decided(self, test: cst.BaseExpression, site: Site) -> bool | None:
        """The value of ``test`` where the question is asked, when that statement sits in an
        ``if`` on the same test (``x = A() if fast else B()`` ... ``if fast: x.to(...)``)."""
        if site.scope is not self.use.scope:
            return None
        entry = self.prov.index.scope(self.use.scope).statements.get(id(self.use.statement))
        if entry is None:
            return None
        tested, negated = _without_not(test)
        for guard in entry[1]:
            if guard.test is not None:
                guarded, guard_negated = _without_not(guard.test)
                if guarded == tested:
                    return guard.polarity is (negated == guard_negated)
        return None


def _added_to(name: str, scope: cst.CSTNode) -> Iterator[cst.BaseExpression]:
    """Values a scope adds to the list or dict ``name``: ``name.append(x)``, ``name += [x]``,
    ``name[key] = x``."""
    stack = [scope]
    while stack:
        node = stack.pop()
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and is_name(node.func.value, name)
            and node.func.attr.value in ADDING_METHODS
            and node.args
        ):
            yield node.args[-1].value
        elif (isinstance(node, cst.AugAssign) and is_name(node.target, name)) or (
            isinstance(node, cst.Assign)
            and any(
                isinstance(t.target, cst.Subscript) and is_name(t.target.value, name)
                for t in node.targets
            )
        ):
            yield node.value
        stack.extend(
            child
            for child in syntax_children(node)
            if not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda))
        )


def _union(parts: Iterator[Names] | list[Names]) -> Names:
    return tuple(dict.fromkeys(name for part in parts for name in part))


def _all_known(parts: list[Names | None]) -> Names | None:
    if not parts or any(part is None for part in parts):
        return None
    return _union([part for part in parts if part is not None])


def _without_not(test: cst.BaseExpression) -> tuple[str, bool]:
    """``test``'s source without a leading ``not``, and whether there was one."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _code(test.expression), True
    return _code(test), False


def _code(node: cst.CSTNode) -> str:
    return " ".join(cst.Module(body=[]).code_for_node(node).split())
