"""What is known about one parsed module before any question is asked: its imports and scopes.

A :class:`ModuleIndex` is built per file and answers name questions — which dotted name an
expression denotes through the module's imports, which bindings a scope holds, how often a local
is read — each computed on first use and kept for the file's other questions.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import libcst as cst

from replaylint.lint.dataflow.imports import ImportTable
from replaylint.lint.dataflow.scopes import Binding, Scope, build_scope
from replaylint.lint.dataflow.torch_api import dtype_from_qualified_name
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.syntax.nodes import dotted_name, read_names
from replaylint.lint.syntax.sites import ScopeNode, Site
from replaylint.lint.syntax.traversal import descendants, syntax_children

_ASSIGNMENT_OPERATOR = r"(?:[-+*/%&|^@]|//|\*\*|<<|>>)?=(?!=)"
"""``=`` or an augmented assignment's operator, not ``==``."""


class ModuleIndex:
    """Name resolution and local bindings of one module, built lazily."""

    def __init__(
        self, module: cst.Module, gate_caches: GateCacheNames, source: str | None = None
    ) -> None:
        self.module = module
        self.gate_caches = gate_caches
        self.source = source
        """The module's text, when known: cheap textual questions before a walk of the tree."""
        self._imports: ImportTable | None = None
        self._scopes: dict[int, Scope] = {}
        self._reads: dict[tuple[int, str], int] = {}
        self._calls: dict[str, list[cst.Call]] | None = None
        self._classes: list[cst.ClassDef] | None = None
        self._declared: dict[str, list[cst.ClassDef]] | None = None
        self._withs: list[cst.With] | None = None
        self._call_sites: dict[int, Site] | None = None
        self._assigned: set[str] | None = None
        self._module_assigned: set[str] = set()
        self._assigned_not_on_self: set[str] = set()
        self._next: dict[int, cst.BaseStatement] | None = None
        self._unassigned: dict[str, bool] = {}
        self._upcast: dict[int, frozenset[str]] = {}
        self.memo: dict[tuple[str, int], Any] = {}
        """Answers to module-wide questions other analyses ask many times (the module's
        classes, what a class's methods assign), keyed by the question and a node's id."""

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """Fully resolved dotted names of ``node`` (``th.zeros`` -> ``{"torch.zeros"}``).

        A name no import binds resolves to itself (``x.half`` -> ``{"x.half"}``); an expression
        that is not a dotted name (a call, a subscript) resolves to nothing.
        """
        return self._import_table().resolve(node)[0]

    def imported_names(self, node: cst.CSTNode) -> set[str]:
        """Like :meth:`qualified_names`, but only for names that come from an import."""
        names, imported = self._import_table().resolve(node)
        return names if imported else set()

    def _import_table(self) -> ImportTable:
        if self._imports is None:
            self._imports = ImportTable(self.module)
        return self._imports

    def scope(self, node: ScopeNode) -> Scope:
        """The bindings of ``node``'s own body, built on first use."""
        scope = self._scopes.get(id(node))
        if scope is None:
            scope = self._scopes[id(node)] = build_scope(node)
        return scope

    def read_once(self, binding: Binding) -> bool:
        """Whether the local that ``binding`` makes is read exactly once in its scope."""
        if binding.scope is None:
            return False
        key = (id(binding.scope), binding.name)
        count = self._reads.get(key)
        if count is None:
            scope = self.scope(binding.scope)
            written = sum(
                1 for b in scope.bindings.get(binding.name, ()) if isinstance(b.node, cst.Name)
            )
            total = sum(1 for n in read_names(binding.scope) if n.value == binding.name)
            count = self._reads[key] = total - written
        return count == 1

    def calls_named(self, name: str) -> list[cst.Call]:
        """Every call in the module whose callee's last name is ``name`` (``f(...)``,
        ``self.f(...)``, ``mod.f(...)``), in source order."""
        if self._calls is None:
            self._collect()
        assert self._calls is not None
        return self._calls.get(name, [])

    def classes(self) -> list[cst.ClassDef]:
        """Every class defined in the module, nested ones included."""
        if self._classes is None:
            self._collect()
        assert self._classes is not None
        return self._classes

    def declared_classes(self) -> dict[str, list[cst.ClassDef]]:
        """The classes of the module's top level and of their bodies, by name: found without a
        walk of every statement, for the question whether a call constructs one."""
        if self._declared is None:
            declared: dict[str, list[cst.ClassDef]] = {}
            pending: list[cst.CSTNode] = list(self.module.body)
            while pending:
                statement = pending.pop()
                if isinstance(statement, cst.ClassDef):
                    declared.setdefault(statement.name.value, []).append(statement)
                    body = statement.body
                    pending.extend(body.body if isinstance(body, cst.IndentedBlock) else ())
            self._declared = declared
        return self._declared

    def withs(self) -> list[cst.With]:
        """Every ``with`` statement of the module."""
        if self._withs is None:
            self._collect()
        assert self._withs is not None
        return self._withs

    def call_sites(self) -> dict[int, Site]:
        """Every call of the module by ``id``, with the site it is evaluated at."""
        if self._call_sites is None:
            self._call_sites = _call_sites(self.module)
        return self._call_sites

    def assigns_attribute(self, name: str, *, by_setattr: bool = True) -> bool:
        """Whether the module assigns ``<anything>.<name>`` (``self.dtype = dtype``), or
        (``by_setattr``) sets attributes by name (``setattr``), anywhere."""
        if self._assigned is None:
            if self._never_assigned(name, by_setattr=by_setattr):
                return False
            self._collect()
        assert self._assigned is not None
        return name in self._assigned or (by_setattr and "*" in self._assigned)

    def assigns_attribute_not_on_self(self, name: str) -> bool:
        """Whether the module assigns ``<something other than self>.<name>``, or sets
        attributes by name (``setattr``), anywhere."""
        if self._assigned is None:
            if self._never_assigned(name):
                return False
            self._collect()
        assert self._assigned is not None
        return name in self._assigned_not_on_self or "*" in self._assigned

    def assigns_module_attribute(self, name: str) -> bool:
        """Whether the module may rebind the attribute ``name`` of a module object:
        ``policy.WIRE_DTYPE = ...``, or a ``setattr`` on an imported name (a ``setattr`` on a
        local object sets that object's attribute)."""
        if self._assigned is None:
            if self._never_assigned(name):
                return False
            self._collect()
        return name in self._module_assigned or "*" in self._module_assigned

    def _never_assigned(self, name: str, *, by_setattr: bool = True) -> bool:
        """Whether the text rules out every assignment of ``<anything>.<name>`` (and, with
        ``by_setattr``, every ``setattr``): a superset of what the walk finds, read without
        walking the tree."""
        if self.source is None or not name.isidentifier():
            return False
        if by_setattr and "setattr" in self.source:
            return False
        known = self._unassigned.get(name)
        if known is None:
            written = re.compile(rf"\.[\s\\]*{name}[\s\\)]*(?::|{_ASSIGNMENT_OPERATOR})")
            known = self._unassigned[name] = written.search(self.source) is None
        return known

    def upcast_attributes(self, cls: cst.ClassDef) -> frozenset[str]:
        """Attributes of ``self`` that a method of ``cls`` casts to float32 or wider
        (``self.A_log.float()``, ``self.dt_bias.to(torch.float32)``): what the class's own code
        expects may not be float32 when it runs."""
        known = self._upcast.get(id(cls))
        if known is None:
            known = self._upcast[id(cls)] = frozenset(_upcast_attributes(self, cls))
        return known

    def next_statement(self, statement: cst.CSTNode | None) -> cst.BaseStatement | None:
        """The statement that follows ``statement`` in its block, if any."""
        if self._next is None:
            self._collect()
        assert self._next is not None
        return None if statement is None else self._next.get(id(statement))

    def _collect(self) -> None:
        calls: dict[str, list[cst.Call]] = {}
        classes: list[cst.ClassDef] = []
        withs: list[cst.With] = []
        assigned: set[str] = set()
        not_on_self: set[str] = set()
        setattr_roots: set[str | None] = set()
        imported: set[str] = set()
        following: dict[int, cst.BaseStatement] = {}
        stack: list[cst.CSTNode] = [self.module]
        while stack:
            node = stack.pop()
            if isinstance(node, (cst.Module, cst.IndentedBlock)):
                body: Sequence[cst.BaseStatement] = node.body
                following.update((id(a), b) for a, b in itertools.pairwise(body))
            if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and isinstance(
                node.target, cst.Attribute
            ):
                assigned.add(node.target.attr.value)
                receiver = node.target.value
                if not (isinstance(receiver, cst.Name) and receiver.value == "self"):
                    not_on_self.add(node.target.attr.value)
            if isinstance(node, cst.Call):
                func = node.func
                name = (
                    func.value
                    if isinstance(func, cst.Name)
                    else func.attr.value
                    if isinstance(func, cst.Attribute)
                    else None
                )
                if name is not None:
                    calls.setdefault(name, []).append(node)
                if name in {"setattr", "__setattr__"} and not _on_self(node):
                    setattr_roots.add(_setattr_root(node))
            elif isinstance(node, (cst.Import, cst.ImportFrom)):
                imported.update(_bound_by(node))
            elif isinstance(node, cst.ClassDef):
                classes.append(node)
            elif isinstance(node, cst.With):
                withs.append(node)
            stack.extend(reversed(syntax_children(node)))
        # any setattr on another object may set an instance's attribute; a module's only where
        # the object may be a module
        self._module_assigned = set(assigned)
        if setattr_roots:
            assigned.add("*")
        if any(
            root is None or root in imported or "*" in imported
            for root in setattr_roots - {"self", "cls"}
        ):
            self._module_assigned.add("*")
        self._calls, self._classes, self._assigned = calls, classes, assigned
        self._assigned_not_on_self = not_on_self
        self._withs, self._next = withs, following


_UPCASTS = frozenset({"float", "double"})
_WIDE_DTYPES = frozenset({"float32", "float64"})


def _upcast_attributes(index: ModuleIndex, cls: cst.ClassDef) -> set[str]:
    """``self.X`` widened in ``cls`` itself, or passed to a function of the module that widens
    the parameter it fills (``_log_decay(a, self.A_log)`` with ``A_log.float()`` inside)."""
    helpers = _widening_helpers(index)
    found: set[str] = set()
    for node in _calls_in(cls.body):
        receiver = _widened(index, node)
        if isinstance(receiver, cst.Attribute) and _on_self_attribute(receiver):
            found.add(receiver.attr.value)
        widened = helpers.get(node.func.value) if isinstance(node.func, cst.Name) else None
        if not widened:
            continue
        for place, arg in enumerate(node.args):
            if arg.star:
                break  # a spread: the places after it are not known
            parameter = arg.keyword.value if arg.keyword is not None else place
            value = arg.value
            if (
                parameter in widened
                and isinstance(value, cst.Attribute)
                and _on_self_attribute(value)
            ):
                found.add(value.attr.value)
    return found


def _widening_helpers(index: ModuleIndex) -> dict[str, set[str | int]]:
    """Top-level functions of the module that widen a parameter: its name and place."""
    helpers: dict[str, set[str | int]] = {}
    for statement in index.module.body:
        if not isinstance(statement, cst.FunctionDef):
            continue
        params = [
            p.name.value for p in (*statement.params.posonly_params, *statement.params.params)
        ]
        widened: set[str | int] = set()
        for node in _calls_in(statement.body):
            receiver = _widened(index, node)
            if isinstance(receiver, cst.Name) and receiver.value in params:
                widened |= {receiver.value, params.index(receiver.value)}
        if widened:
            helpers[statement.name.value] = widened
    return helpers


def _calls_in(root: cst.CSTNode) -> list[cst.Call]:
    return [node for node in descendants(root) if isinstance(node, cst.Call)]


def _widened(index: ModuleIndex, call: cst.Call) -> cst.BaseExpression | None:
    """The receiver of ``x.float()``, ``x.double()``, ``x.to(torch.float32)``: widened to float32
    or more; None for any other call."""
    if not isinstance(call.func, cst.Attribute):
        return None
    method = call.func.attr.value
    widens = (method in _UPCASTS and not call.args) or (
        method in {"to", "type"}
        and any(
            dtype_from_qualified_name(name) in _WIDE_DTYPES
            for arg in call.args
            if arg.keyword is None or arg.keyword.value == "dtype"
            for name in index.qualified_names(arg.value)
        )
    )
    return call.func.value if widens else None


def _on_self_attribute(expr: cst.Attribute) -> bool:
    return isinstance(expr.value, cst.Name) and expr.value.value == "self"


def _on_self(call: cst.Call) -> bool:
    """``setattr(self, name, x)``, ``object.__setattr__(self, name, x)``: the instance's own
    attributes."""
    args = [arg for arg in call.args if arg.keyword is None]
    first = args[0].value if args else None
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "__setattr__":
        receiver = call.func.value
        if isinstance(receiver, cst.Name) and receiver.value in {"self", "cls"}:
            return True  # `self.__setattr__(name, x)`
    return isinstance(first, cst.Name) and first.value in {"self", "cls"}


def _setattr_root(call: cst.Call) -> str | None:
    """The name at the root of the object ``setattr(obj, name, x)`` (or ``obj.__setattr__``)
    sets an attribute of: ``self`` for ``setattr(self.cache, ...)``; None when it is not a
    name or an attribute of one."""
    args = [arg for arg in call.args if arg.keyword is None]
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "__setattr__":
        receiver: cst.BaseExpression | None = call.func.value
        if isinstance(receiver, cst.Name) and receiver.value == "object":
            receiver = args[0].value if args else None  # `object.__setattr__(obj, name, x)`
    else:
        receiver = args[0].value if args else None
    while isinstance(receiver, cst.Attribute):
        receiver = receiver.value
    return receiver.value if isinstance(receiver, cst.Name) else None


def _bound_by(statement: cst.Import | cst.ImportFrom) -> set[str]:
    """The names an import binds: ``import a.b`` binds ``a``, ``from a import b as c`` binds
    ``c``."""
    if isinstance(statement.names, cst.ImportStar):
        return {"*"}
    bound: set[str] = set()
    for alias in statement.names:
        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
            bound.add(alias.asname.name.value)
        else:
            bound.add((dotted_name(alias.name) or "").partition(".")[0])
    return bound


def _call_sites(module: cst.Module) -> dict[int, Site]:
    sites: dict[int, Site] = {}
    stack: list[tuple[cst.CSTNode, tuple[ScopeNode, ...], cst.CSTNode | None]] = [
        (module, (module,), None)
    ]
    while stack:
        node, scopes, statement = stack.pop()
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            statement = node
        if isinstance(node, cst.Call):
            sites[id(node)] = Site(scopes, statement)
        # a body runs in the function's or class's scope; decorators and defaults outside it
        inner = (*scopes, node) if isinstance(node, (cst.FunctionDef, cst.ClassDef)) else None
        for child in syntax_children(node):
            if inner is not None and child is getattr(node, "body", None):
                stack.append((child, inner, None))
            else:
                stack.append((child, scopes, statement))
    return sites
