"""The one walker that finds every binding of a gate cache, in every spelling, once per file.

A binding is an expression that becomes a gate cache: ``<target> = <value>`` (plain, annotated,
tuple, walrus), a dict literal entry (``{"g_cache": ...}``), a keyword argument
(``Pool(g_cache=...)``), ``register_buffer("g_cache", ...)`` and ``setattr(obj, "g_cache", ...)``.
The walker runs first in the shared traversal: it keeps the enclosing scopes and the innermost
statement (the :class:`~replaylint.lint.syntax.sites.Site` rules evaluate at) and hands each
binding to every rule that asks for bindings, in rule order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst

from replaylint.lint.gatecache.lists import ADDED_ELEMENT, list_names, maybe_list_words
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.gatecache.signatures import converted_parameters, signatures
from replaylint.lint.syntax.nodes import (
    binding_name,
    literal_string,
    method_name,
    one_line,
    positional_args,
    read_names,
    record_fields,
)
from replaylint.lint.syntax.sites import ScopeNode, Site
from replaylint.lint.syntax.traversal import Visitor


@dataclass(frozen=True)
class GateCacheBinding:
    """An expression that becomes a gate cache: ``<target> = <value>`` in one of its spellings."""

    name: str
    """The gate-cache name as matched (``g_cache``)."""
    display: str
    """How the target reads in source (``self.g_cache``, ``caches["g_cache"]``)."""
    value: cst.BaseExpression
    statement: cst.CSTNode
    site: Site
    """Where ``value`` is evaluated (for following local bindings)."""
    shared_with: tuple[str, ...] = ()
    """Other targets that receive the same value (``d_cache = g_cache = torch.zeros(...)``):
    changing the value's dtype would change theirs too."""
    element: int | None = None
    """Set when the gate cache is one element of ``value``: ``d_cache, k_cache, g_cache =
    load_rings(path)`` binds element 2."""
    written: bool = False
    """Set when ``value`` is copied into the existing gate cache (``g_cache[slot] = x``,
    ``g_cache.copy_(x)``): the cache keeps its dtype, and only how precisely ``value`` was
    computed reaches it. Such bindings go to the receivers of writes only."""
    holds_list: bool = False
    """Set when the target is a whole list of rings (``cache.g_caches = loaded``, of a class that
    appends to it): the value is a sequence of tensors, which has no ``.to``."""


BindingReceiver = Callable[[GateCacheBinding], None]


class BindingWalker(Visitor):
    """Tracks where the traversal is and reports every gate-cache binding to ``receivers``."""

    def __init__(
        self,
        module: cst.Module,
        names: GateCacheNames,
        receivers: Sequence[BindingReceiver] = (),
        source: str | None = None,
        imported_list: Callable[[str], bool] | None = None,
        write_receivers: Sequence[BindingReceiver] = (),
    ) -> None:
        super().__init__()
        self.write_receivers = tuple(write_receivers)
        """Receivers of values copied into a gate cache (:attr:`GateCacheBinding.written`)."""
        self._imported_list = imported_list
        """Whether a module this one imports from makes a name a list; asked (and so depended
        on) only when a local answer is no."""
        self._imported_lists: dict[str, bool] = {}
        self.module = module
        self.source = source
        """The module's text, when known: it rules out most list questions without a walk."""
        self.names = names
        self.receivers = tuple(receivers)
        self._scopes: list[ScopeNode] = [module]
        self._statements: list[cst.CSTNode] = []
        self._walrus_shared: dict[int, tuple[str, ...]] = {}
        self._record_fields: dict[str, list[str]] | None = None
        self._signatures: dict[str, tuple[cst.FunctionDef, list[str]] | None] | None = None
        self._converted: dict[int, set[str]] = {}
        self._lists: frozenset[str] | None = None
        self._maybe_lists: frozenset[str] | None = None

    def site(self) -> Site:
        """Where the traversal is: the enclosing scopes and the innermost statement."""
        return Site(tuple(self._scopes), self._statements[-1] if self._statements else None)

    def _found(self, binding: GateCacheBinding) -> None:
        for receive in self.receivers:
            receive(binding)

    def _written(
        self, ring: cst.BaseExpression, value: cst.BaseExpression, stmt: cst.CSTNode
    ) -> None:
        """``value`` copied into the gate cache ``ring`` (or an element of it)."""
        if not self.write_receivers:
            return
        root = ring
        while isinstance(root, cst.Subscript):
            root = root.value
        name = binding_name(root)
        if name is None or not self.names.matches(name):
            return
        display = self.module.code_for_node(ring).strip()
        binding = GateCacheBinding(name, display, value, stmt, self.site(), written=True)
        for receive in self.write_receivers:
            receive(binding)

    def _passed(self, binding: GateCacheBinding) -> None:
        """A value passed on as a gate cache (a keyword, a dict entry, a record field, a
        parameter): a name that is a gate cache itself (``g_cache=g_cache``) was checked where it
        was bound, and a parameter of that name where its function is called."""
        value = binding.value
        if not (isinstance(value, cst.Name) and self.names.matches(value.value)):
            self._found(binding)
            return
        origin = self.names.learned_from(value.value)
        if origin is not None and origin.guessed:
            # a name only guessed from its place is not checked everywhere it is bound (a
            # forward's `decay`): where it is handed on as the ring, it is (a finding made at
            # the same node for both is reported once)
            self._found(binding)

    # Our traversal only dispatches methods whose own name is visit_*/leave_*, so each statement
    # kind gets its two one-line methods.
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statements.append(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statements.pop()

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._statements.append(node)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite) -> None:
        self._statements.pop()

    def visit_If(self, node: cst.If) -> None:
        self._statements.append(node)

    def leave_If(self, original_node: cst.If) -> None:
        self._statements.pop()

    def visit_For(self, node: cst.For) -> None:
        self._statements.append(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._statements.pop()

    def visit_While(self, node: cst.While) -> None:
        self._statements.append(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._statements.pop()

    def visit_With(self, node: cst.With) -> None:
        self._statements.append(node)

    def leave_With(self, original_node: cst.With) -> None:
        self._statements.pop()

    def visit_Try(self, node: cst.Try) -> None:
        self._statements.append(node)

    def leave_Try(self, original_node: cst.Try) -> None:
        self._statements.pop()

    def visit_TryStar(self, node: cst.TryStar) -> None:
        self._statements.append(node)

    def leave_TryStar(self, original_node: cst.TryStar) -> None:
        self._statements.pop()

    def visit_Match(self, node: cst.Match) -> None:
        self._statements.append(node)

    def leave_Match(self, original_node: cst.Match) -> None:
        self._statements.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._statements.append(node)
        self._scopes.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scopes.pop()
        self._statements.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._statements.append(node)
        self._scopes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._scopes.pop()
        self._statements.pop()

    def _loop_variable_in(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` reads a variable of an enclosing ``for`` loop that may hold a name
        (a counter of ``range`` or ``enumerate`` only numbers it: ``f"g_cache_{i}"``)."""
        read = {name.value for name in read_names(node)}
        for statement in self._statements:
            if isinstance(statement, cst.For):
                variables = {name.value for name in read_names(statement.target)}
                if read & (variables - _counters(statement)):
                    return True
        return False

    # ----------------------------------------------------------------- binding spellings
    def _bind(
        self,
        target: cst.BaseExpression,
        value: cst.BaseExpression,
        stmt: cst.CSTNode,
        shared_with: tuple[str, ...] = (),
    ) -> None:
        if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
            targets = [element.value for element in target.elements]
            values = [element.value for element in value.elements]
            if len(targets) == len(values) and not any(
                isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)
            ):
                for sub_target, sub_value in zip(targets, values, strict=True):
                    self._bind(sub_target, sub_value, stmt)
            return
        if isinstance(target, (cst.Tuple, cst.List)):
            if any(isinstance(e, cst.StarredElement) for e in target.elements):
                return
            for position, element in enumerate(target.elements):
                name = binding_name(element.value)
                if name is not None and self.names.matches(name):
                    display = self.module.code_for_node(element.value).strip()
                    self._found(
                        GateCacheBinding(name, display, value, stmt, self.site(), element=position)
                    )
            return
        name = binding_name(target)
        if name is None and isinstance(target, cst.Subscript):
            name = self._formatted_key(target)  # `inputs[f"STATE_G_CACHE_{layer}"] = ...`
        if (
            name is None
            and isinstance(target, cst.Subscript)
            and (ring := binding_name(target.value)) is not None
            and (self.names.is_plural(ring) or self._is_list(ring, _held_elsewhere(target.value)))
        ):
            # `self.g_caches[layer] = ring` replaces a ring of a list of gate caches (a plural
            # name, or one the module makes a list); an element written into a tensor
            # (`g_cache[slot] = x`) is cast by the copy and is not a binding
            name = ring
        if (
            name == "data"
            and isinstance(target, cst.Attribute)
            and (inner := binding_name(target.value)) is not None
            and self.names.matches(inner)
        ):
            name = inner  # `self.g_cache.data = x` replaces the cache's contents and dtype
        if name is not None and self.names.matches(name):
            display = self.module.code_for_node(target).strip()
            whole = isinstance(target, (cst.Name, cst.Attribute)) and binding_name(target) == name
            holds_list = whole and self._is_list(name, _held_elsewhere(target))
            self._found(
                GateCacheBinding(
                    name, display, value, stmt, self.site(), shared_with, holds_list=holds_list
                )
            )
        elif name is None and isinstance(target, cst.Subscript):
            self._written(target, value, stmt)

    def _formatted_key(self, target: cst.Subscript) -> str | None:
        """The key of ``d[f"..."]`` read as a name (replacement fields as ``0``), when no loop
        over names builds it: a counter (``f"g_cache_{layer}"``) only numbers the ring."""
        if len(target.slice) != 1 or not isinstance(index := target.slice[0].slice, cst.Index):
            return None
        key = index.value
        if not isinstance(key, cst.FormattedString) or self._loop_variable_in(key):
            return None
        return static_name(key)

    def _is_list(self, name: str, held_elsewhere: bool) -> bool:
        """Whether the module binds the gate-cache name ``name`` to a list or appends to it: a
        list of rings; for an attribute of another object (``held_elsewhere``), also whether a
        class of a module this one imports from does."""
        if self.source is None or name in self._maybe_list_words():
            if self._lists is None:
                self._lists = list_names(self.module, self.names)
            if name in self._lists:
                return True
        if not held_elsewhere:
            return False
        if self._imported_list is None or not self.names.matches(name):
            return False
        known = self._imported_lists.get(name)
        if known is None:
            known = self._imported_lists[name] = self._imported_list(name)
        return known

    def _maybe_list_words(self) -> frozenset[str]:
        if self._maybe_lists is None:
            assert self.source is not None
            self._maybe_lists = maybe_list_words(self.source)
        return self._maybe_lists

    def visit_Assign(self, node: cst.Assign) -> None:
        targets = [target.target for target in node.targets]
        for target in targets:
            self._bind(target, node.value, node, self._other_caches(targets, target))
        if isinstance(node.value, cst.NamedExpr):  # d_cache = (g_cache := torch.zeros(...))
            self._walrus_shared[id(node.value)] = self._other_caches(targets, None)

    def _other_caches(
        self, targets: Sequence[cst.BaseExpression], target: cst.BaseExpression | None
    ) -> tuple[str, ...]:
        """The targets other than ``target`` that are not gate caches, as written."""
        return tuple(
            self.module.code_for_node(other).strip()
            for other in targets
            if other is not target
            and not ((name := binding_name(other)) is not None and self.names.matches(name))
        )

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value, node)

    def visit_Param(self, node: cst.Param) -> None:
        # `def __init__(self, g_cache=torch.zeros(...))`: the default is evaluated where the
        # function is defined
        if node.default is None or not self.names.matches(node.name.value):
            return
        function = self._scopes[-1]
        statement = self._statements[-1] if self._statements else None
        if isinstance(function, cst.FunctionDef) and statement is function:
            site = Site(tuple(self._scopes[:-1]), function)
            name = node.name.value
            self._found(GateCacheBinding(name, name, node.default, function, site))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        # `self.g_caches += [ring, ...]` adds rings to a list of gate caches; `g_cache += x` on a
        # tensor is in place and keeps its dtype
        if isinstance(node.operator, cst.AddAssign) and isinstance(node.value, _SEQUENCES):
            self._bind(node.target, node.value, node)

    def visit_Return(self, node: cst.Return) -> None:
        # `@property def g_cache(self): return self._ring.half()`
        function = self._scopes[-1]
        if (
            node.value is not None
            and isinstance(function, cst.FunctionDef)
            and self.names.matches(function.name.value)
            and any(_is_property(d.decorator) for d in function.decorators)
        ):
            name = function.name.value
            self._found(GateCacheBinding(name, name, node.value, node, self.site()))
            return
        # `return state, delta.to(kv), log_decay.to(kv)`: the caller gets the gate cache cast
        value = node.value
        returned = value.elements if isinstance(value, (cst.Tuple, cst.List)) else ()
        for element in [value] if isinstance(value, cst.Call) else [e.value for e in returned]:
            cast = _cast_gate_cache(element, self.names)
            if cast is not None:
                self._found(GateCacheBinding(cast, cast, element, node, self.site()))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target, node.value, node, self._walrus_shared.pop(id(node), ()))

    def visit_Dict(self, node: cst.Dict) -> None:
        saved = self._saved_payload(node)
        for element in node.elements:
            if isinstance(element, cst.DictElement):
                key = literal_string(element.key)
                if saved and _made_afresh(element.value):
                    # data made for a file (`torch.save({"g_cache": torch.full(...)}, path)`):
                    # the file's format, not a ring; its load is checked where it is loaded
                    continue
                if key is not None and self.names.matches(key):
                    display = self.module.code_for_node(element.key)
                    self._passed(GateCacheBinding(key, display, element.value, node, self.site()))

    def visit_Call(self, node: cst.Call) -> None:
        for arg in node.args:
            if arg.keyword is not None and self.names.matches(arg.keyword.value):
                text = one_line(self.module, arg.value, 40)
                display = f"{arg.keyword.value}={text}"
                self._passed(
                    GateCacheBinding(arg.keyword.value, display, arg.value, node, self.site())
                )
        positional = positional_args(node)
        fields = self._fields_of(node.func)
        if fields is not None and not any(arg.star for arg in node.args):
            # `KDALayerState(d, k, g)`: a NamedTuple or dataclass of the module, built in order
            for field, arg in zip(fields, positional, strict=False):
                if self.names.matches(field):
                    display = f"{field}={one_line(self.module, arg.value, 40)}"
                    self._passed(GateCacheBinding(field, display, arg.value, node, self.site()))
        parameters = self._gate_parameters_of(node.func)
        if parameters:
            # `ReplayCache.from_tensors(state, d, k, g, cursor)` with a parameter `log_alpha`:
            # the argument a function of the module takes as its gate cache is one
            for position, parameter in parameters:
                if position < len(positional) and not any(
                    arg.star for arg in node.args[: position + 1]
                ):
                    arg = positional[position]
                    display = f"{parameter}={one_line(self.module, arg.value, 40)}"
                    self._passed(GateCacheBinding(parameter, display, arg.value, node, self.site()))
        method = method_name(node)
        if method in _COPIES and len(positional) == _COPIES[method] + 1:
            assert isinstance(node.func, cst.Attribute)
            self._written(node.func.value, positional[-1].value, node)
        if method in ADDED_ELEMENT and len(positional) == ADDED_ELEMENT[method] + 1:
            # `self.g_caches.append(ring)`: the element becomes a gate cache
            assert isinstance(node.func, cst.Attribute)
            name = binding_name(node.func.value)
            if name is not None and self.names.matches(name):
                display = self.module.code_for_node(node.func.value).strip()
                value = positional[-1].value
                self._found(GateCacheBinding(name, display, value, node, self.site()))
            return
        if _is_setattr(node.func) and len(positional) == 3:
            written, value = positional[1].value, positional[2].value
        elif method in _KEYED and len(positional) >= 2:
            written, value = positional[0].value, positional[1].value
        else:
            return
        key = static_name(written)
        if isinstance(written, cst.FormattedString) and self._loop_variable_in(written):
            return  # a name made per iteration of a loop: RL006 evaluates each iteration
        if key is not None and self.names.matches(key):
            display = (
                repr(key)
                if isinstance(written, cst.SimpleString)
                else one_line(self.module, written, 40)
            )
            self._found(GateCacheBinding(key, display, value, node, self.site()))

    def _saved_payload(self, node: cst.Dict) -> bool:
        """Whether ``node`` is what a statement ``torch.save(node, path)`` (``np.savez``,
        ``pickle.dump``, ``save_file``) writes."""
        statement = self._statements[-1] if self._statements else None
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        expr = statement.body[0]
        if not isinstance(expr, cst.Expr) or not isinstance(expr.value, cst.Call):
            return False
        call = expr.value
        return method_name(call) in _SAVES and any(
            arg.value is node for arg in positional_args(call)[:1]
        )

    def _gate_parameters_of(self, func: cst.BaseExpression) -> list[tuple[int, str]]:
        """(position, name) of the gate-cache parameters of the module's function, method or
        class (its ``__init__``) that ``func`` calls, among the arguments the call writes; a
        parameter the function converts rather than keeps (``def as_fp32(g_cache): return
        g_cache.float()`` takes any dtype) is none."""
        if self._signatures is None:
            self._signatures = signatures(self.module)
        if isinstance(func, cst.Name):
            key = func.value
        elif isinstance(func, cst.Attribute):
            key = f".{func.attr.value}"
        else:
            return []
        signature = self._signatures.get(key)
        if signature is None:
            return []
        function, parameters = signature
        gate = [(i, name) for i, name in enumerate(parameters) if self.names.matches(name)]
        if not gate:
            return []
        converted = self._converted.get(id(function))
        if converted is None:
            converted = self._converted[id(function)] = converted_parameters(function)
        return [(i, name) for i, name in gate if name not in converted]

    def _fields_of(self, func: cst.BaseExpression) -> list[str] | None:
        """The fields, in order, of the module-level record class ``func`` names."""
        if not isinstance(func, cst.Name):
            return None
        if self._record_fields is None:
            self._record_fields = {}
            for statement in self.module.body:
                if isinstance(statement, cst.ClassDef):
                    fields = record_fields(statement)
                    if fields is not None:
                        self._record_fields[statement.name.value] = [name for name, _ in fields]
        return self._record_fields.get(func.value)


# tensor methods that copy their last argument into the receiver, and that argument's index
_COPIES = {"copy_": 0, "index_copy_": 2}
# methods that bind their first argument's name to their second: `super().__setattr__(name, x)`
_KEYED = frozenset({"register_buffer", "setdefault", "__setattr__"})
_SEQUENCES = (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp)
# list methods that add an element, and the index of the element among their arguments


def _held_elsewhere(ring: cst.BaseExpression) -> bool:
    """``cache.g_cache``: an attribute of an object other than ``self``, whose class may be
    defined in another module (``self.g_cache`` and bare names are this module's own)."""
    return isinstance(ring, cst.Attribute) and not (
        isinstance(ring.value, cst.Name) and ring.value.value in {"self", "cls"}
    )


def static_name(node: cst.BaseExpression) -> str | None:
    """A string literal's value; for an f-string, its text with ``0`` for each replacement field
    (``f"layer{i}_g_cache"`` -> ``layer0_g_cache``), which is what a name pattern can match."""
    if isinstance(node, cst.FormattedString):
        parts: list[str] = []
        for part in node.parts:
            parts.append(part.value if isinstance(part, cst.FormattedStringText) else "0")
        return "".join(parts)
    return literal_string(node)


def _counters(loop: cst.For) -> set[str]:
    """The loop variables that hold integers: ``for i in range(n)``, ``for i, x in
    enumerate(xs)``."""
    iterable, target = loop.iter, loop.target
    if not isinstance(iterable, cst.Call) or not isinstance(iterable.func, cst.Name):
        return set()
    if iterable.func.value == "range" and isinstance(target, cst.Name):
        return {target.value}
    if (
        iterable.func.value == "enumerate"
        and isinstance(target, cst.Tuple)
        and target.elements
        and isinstance(target.elements[0].value, cst.Name)
    ):
        return {target.elements[0].value.value}
    return set()


def _is_setattr(func: cst.BaseExpression) -> bool:
    """``setattr`` or ``object.__setattr__``."""
    if isinstance(func, cst.Name):
        return func.value == "setattr"
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value == "__setattr__"
        and isinstance(func.value, cst.Name)
        and func.value.value == "object"
    )


_CASTS = frozenset({"to", "half", "bfloat16", "type", "type_as"})


def _cast_gate_cache(expr: cst.BaseExpression, names: GateCacheNames) -> str | None:
    """The gate cache ``expr`` casts (``log_decay.to(kv)``, ``self.g_cache.half()``)."""
    if not (isinstance(expr, cst.Call) and method_name(expr) in _CASTS):
        return None
    assert isinstance(expr.func, cst.Attribute)
    name = binding_name(expr.func.value)
    return name if name is not None and names.matches(name) else None


def _is_property(decorator: cst.BaseExpression) -> bool:
    """``@property``, ``@functools.cached_property``, ``@cached_property``."""
    name = decorator.attr.value if isinstance(decorator, cst.Attribute) else None
    if isinstance(decorator, cst.Name):
        name = decorator.value
    return name in {"property", "cached_property"}


_SAVES = frozenset({"save", "savez", "savez_compressed", "dump", "save_file"})
_FACTORY_MODULES = frozenset({"torch", "np", "numpy"})


def _made_afresh(value: cst.BaseExpression) -> bool:
    """A call of a factory (``torch.full(...)``, ``np.zeros(...)``, a local ``full(...)``), not
    a method of a tensor (``ring.half()``): data made on the spot."""
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Name):
        return True
    return (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Name)
        and func.value.value in _FACTORY_MODULES
    )
