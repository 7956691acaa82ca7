"""What one module of a project tells other modules about dtypes: a small summary, made with ``ast``.

A summary is plain data (lists, strings, numbers: it is stored in the result cache as JSON) that
keeps, per top-level name, only what an importer may ask: the value of a constant
(``WIRE_DTYPE = torch.bfloat16``, a table ``{"bfloat16": torch.bfloat16}``, an alias of an import),
what a function returns (``return torch.float32``, ``return torch.zeros(shape, dtype=dtype)``), and
a class's constants, field defaults and properties. Values are expressions of a tiny language:

``["const", x]`` a Python literal; ``["name", n]`` a top-level name of the same module;
``["ref", module, n]`` a name imported from ``module`` (relative modules keep their dots);
``["module", module]`` a module bound by ``import``; ``["attr", v, a]``; ``["item", v, key]``;
``["table", [[key, v], ...]]`` a dict with literal keys; ``["values", [v, ...]]`` a dict with
other keys (enum members, names), of which only the values are kept; ``["tuple", [v, ...]]``
(a tuple or list); ``["set", [v, ...]]``;
``["call", f, [v, ...], [[keyword, v], ...]]``; ``["lambda", params, v]``; ``["param", n]``;
``["either", [v, ...], dtype_test]`` one of several values (a conditional expression, or the
``return`` statements of a function; ``dtype_test``: its test compares a tensor's dtype), with,
for a function whose returns test its parameters (or a conditional expression whose test is
on a parameter, ``torch.float32 if ring in FP32_RINGS else dtype``), a fourth element: per value,
the guards of the returns that give it (:mod:`.return_guards`);
``["self", a]`` an attribute of ``self`` inside a class; ``["per_key", mapping, v]`` a dict
comprehension with one value per key of ``mapping`` (``{name: torch.zeros(shape, dtype=dtype) for
name, shape in shapes.items()}``), where ``v`` reads the key as ``["loop", "key"]`` and the entry
as ``["loop", "value"]``; ``["layout", p]`` what a function that only rearranges its parameter
``p`` returns (:mod:`.layout_functions`); ``["unknown"]``.

Only what is certain is kept: a name bound more than once, bound under a condition (``if``,
``try``, a loop), declared ``global``, deleted or mutated in place (``TABLE[k] = v``) is
``unknown``. A straight-line function body (locals bound once, one ``return``) is summarised by
what it returns, one with several ``return`` statements by what they may return (a local bound by
one plain assignment and nowhere else keeps its value there).
"""

from __future__ import annotations

import ast
from typing import Any

from replaylint.lint.project import namespace_writes as nw
from replaylint.lint.project.field_casters import field_casters
from replaylint.lint.project.filled_mappings import filled_mapping
from replaylint.lint.project.import_values import imported_values, module_spec
from replaylint.lint.project.layout_functions import kept_parameter
from replaylint.lint.project.module_casters import casters_and_forwards
from replaylint.lint.project.module_facts import (
    constructors,
    dotted,
    factory_classes,
    module_facts,
    restorers,
)
from replaylint.lint.project.namespace_writes import imports_module, is_instance, may_be_module
from replaylint.lint.project.raw_reads import raw_reads
from replaylint.lint.project.records import CONDITIONAL, field_default, frozen, positional_fields
from replaylint.lint.project.return_annotations import returned_annotation
from replaylint.lint.project.return_guards import negated, return_guards, test_condition
from replaylint.lint.project.self_attributes import list_attribute, self_attributes
from replaylint.lint.project.widening import widened_parameters
from replaylint.lint.project.yielded import is_generator, yielded
from replaylint.lint.project.zipped_mappings import per_key_parts, zipped_values

Value = list[Any]
"""A summary value (see the module docstring)."""
Definition = list[Any]
"""``["value", line, v]``, ``["function", line, params, v, extras]``, ``["class", line, members,
flags]`` (``extras["annotated"]``: what the return annotation names, :mod:`.return_annotations`)
(a member ``["method", line, v, params]``: what a plain method returns)
(``flags["module"]``: :func:`~replaylint.lint.project.module_facts.module_facts`)
or ``["unknown", line]``."""
Summary = dict[str, Any]
"""``{"names": {name: Definition}, "assigned": [attribute, ...], "writes_names": bool,
"lists": [attribute, ...],
"imports": [[module, name], ...], "loaders": {function: [reader, ...]}}`` (every import of the
module, at any depth; ``name`` is None for ``import module``; ``writes_names``: whether a
``setattr`` of something other than ``self``/``cls`` may rebind the module's own names; ``lists``: attributes of ``self``
that hold lists; ``loaders``: top-level functions that read tensors and cast nothing, with the
callees that may read them; ``restorers``: functions and methods that put attributes back to
float32, with those attributes; ``widens``: functions that widen a parameter to float32, with
those parameters, :mod:`~replaylint.lint.project.widening`)."""

UNKNOWN: Value = ["unknown"]
_MUTATORS = frozenset(
    {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "add", "discard", "remove"}
)
# calls that rebind a module's names behind the analysis's back
_DYNAMIC_NAMESPACE = frozenset({"globals", "vars", "exec"})
_MAX_VALUE_NODES = 200  # a constant larger than this is no dtype policy
_MAX_RETURNS = 8  # a function with more returns is no dtype policy


def summarise(text: str) -> Summary | None:
    """The summary of a module's text; None when it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return _Summariser(tree).summary()


class _Summariser:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.names: dict[str, Definition] = {}
        self.spoiled: set[str] = set()
        self.assigned: set[str] = set()
        self.writes_names = False
        self.lists: set[str] = set()
        """Attributes of ``self`` the module binds to a list or adds elements to."""
        self.imports: set[tuple[str, str | None]] = set()
        self.loaders: dict[str, list[Value]] = {}
        """Functions that read tensors from bytes or files and cast nothing: their readers."""
        self.dynamic = False
        """The module rebinds names in ways not followed (a star import, ``globals()``)."""
        self.factories: dict[str, list[ast.expr]] | None = None

    def summary(self) -> Summary:
        for statement in self.tree.body:
            self._top_level(statement)
        self._scan_everything()
        names = {
            name: (
                ["unknown", definition[1]] if self.dynamic or name in self.spoiled else definition
            )
            for name, definition in self.names.items()
        }
        for name in self.spoiled - names.keys():
            names[name] = ["unknown", 0]
        casters, forwards = casters_and_forwards(self.tree)
        return {
            "names": names,
            "assigned": sorted(self.assigned),
            "writes_names": self.writes_names,
            "lists": sorted(self.lists),
            "imports": [list(item) for item in sorted(self.imports, key=str)],
            "loaders": self.loaders,
            "restorers": restorers(self.tree),
            "widens": widened_parameters(self.tree),
            "module_casters": casters,
            "module_forwards": forwards,
        }

    # ------------------------------------------------------------------ top-level statements
    def _define(self, name: str, definition: Definition) -> None:
        if name in self.names:
            self.spoiled.add(name)  # bound twice: which one an importer sees is not certain
        self.names[name] = definition

    def _top_level(self, statement: ast.stmt) -> None:
        line = statement.lineno
        if isinstance(statement, ast.Assign):
            value = _Values(self, {}).value(statement.value)
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    self._define(target.id, ["value", line, value])
                else:
                    self._spoil_targets(target)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if statement.value is not None:
                value = _Values(self, {}).value(statement.value)
                self._define(statement.target.id, ["value", line, value])
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            if isinstance(statement, ast.ImportFrom) and any(
                a.name == "*" for a in statement.names
            ):
                self.dynamic = True  # any name may be rebound by what a star import brings
            for name, value in imported_values(statement):
                self._define(name, ["value", line, value])
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._define(statement.name, self._function(statement))
            reads = raw_reads(statement, lambda node: _Values(self, {}).value(node))
            if reads:
                self.loaders[statement.name] = reads
        elif isinstance(statement, ast.ClassDef):
            self._define(statement.name, self._class(statement))
        elif isinstance(statement, CONDITIONAL):
            for node in ast.walk(statement):  # bound under a condition: not certain
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    self.spoiled.add(node.id)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.spoiled.add(node.name)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    for alias in node.names:
                        self.spoiled.add((alias.asname or alias.name).partition(".")[0])
        elif isinstance(statement, (ast.AugAssign, ast.Delete)):
            targets = statement.targets if isinstance(statement, ast.Delete) else [statement.target]
            for target in targets:
                self._spoil_targets(target)

    def _spoil_targets(self, target: ast.expr) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                self.spoiled.add(node.id)

    def _scan_everything(self) -> None:
        """Rebindings and mutations anywhere in the module, and every module it imports."""
        set_on: list[ast.expr] = []  # `setattr(x, ...)`: a name of a module when `x` is one
        modules: set[str] = set()  # names that may hold a module object
        for node in ast.walk(self.tree):
            if (listed := list_attribute(node)) is not None:
                self.lists.add(listed)
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                self.spoiled.update(node.names)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = (
                    node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                )
                if isinstance(node, ast.Assign) and imports_module(node.value):
                    modules.update(t.id for t in targets if isinstance(t, ast.Name))
                for target in targets:
                    if isinstance(target, ast.Attribute):
                        self.assigned.add(target.attr)
                    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                        self.spoiled.add(target.value.id)
            elif isinstance(node, ast.NamedExpr):
                self.spoiled.add(node.target.id)  # a walrus may rebind a module name
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in {"setattr", "delattr"}:
                    self.assigned.add("*")
                    if node.args and not is_instance(node.args[0]):
                        set_on.append(node.args[0])
                    elif not node.args:
                        self.writes_names = True
                elif isinstance(func, ast.Name) and func.id in _DYNAMIC_NAMESPACE:
                    # `vars(obj)` reads an object's attributes, not the module's names
                    self.dynamic = self.dynamic or not (func.id == "vars" and node.args)
                elif isinstance(func, ast.Attribute):
                    if func.attr == "__setattr__" and not nw.instance_setattr(func.value, node):
                        self.assigned.add("*")
                        self.writes_names = True
                    elif func.attr in _MUTATORS and isinstance(func.value, ast.Name):
                        self.spoiled.add(func.value.id)
            elif isinstance(node, ast.ImportFrom):
                spec = module_spec(node)
                for alias in node.names:
                    self.imports.add((spec, None if alias.name == "*" else alias.name))
                    modules.add(alias.asname or alias.name)  # `from pkg import submodule`
            elif isinstance(node, ast.Import):
                self.imports.update((alias.name, None) for alias in node.names)
                modules.update(alias.asname or alias.name.partition(".")[0] for alias in node.names)
        # a loop variable or a local object (`setattr(rings, name, t)`) is no module
        self.writes_names = self.writes_names or any(may_be_module(t, modules) for t in set_on)

    # ------------------------------------------------------------------ functions and classes
    def _function(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> Definition:
        params = _params(self, function.args)
        extras: dict[str, Any] = {}
        annotated = returned_annotation(function.returns, _Values(self, {}).value)
        if annotated is not None:
            extras["annotated"] = annotated
        if params is None or isinstance(function, ast.AsyncFunctionDef):
            return ["function", function.lineno, [], UNKNOWN, extras]
        if any(
            _decorator_name(d)
            not in {"staticmethod", "functools.cache", "cache", "lru_cache", "functools.lru_cache"}
            for d in function.decorator_list
        ):
            return ["function", function.lineno, params, UNKNOWN, extras]
        result = self._result(function, params)
        if _partly_unknown(result) and (kept := kept_parameter(function)) is not None:
            # `def rearrange(t, pattern)`, its tensor rebound on the way: a tensor of t's dtype
            # (a result read in full, `return dtypes["g"]`, stays what it is)
            result = ["layout", kept]
        return ["function", function.lineno, params, result, extras]

    def _result(self, function: ast.FunctionDef | ast.AsyncFunctionDef, params: list[Any]) -> Value:
        """What a straight-line body returns, its locals substituted; unknown otherwise."""
        body = list(function.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
            return self._branching_result(function, params)
        locals_: dict[str, Value] = {str(p[0]): ["param", p[0]] for p in params}
        if (filled := filled_mapping(body)) is not None:  # a dict filled in a loop
            return _Values(self, locals_).value(filled)
        for statement in body[:-1]:
            if isinstance(statement, ast.Assert):
                continue  # `assert ret is not None, ...`: the value returned is the same
            if isinstance(statement, ast.Import | ast.ImportFrom):
                for name, value in imported_values(statement):
                    locals_[name] = value
                continue
            if not (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
            ):
                return self._branching_result(function, params)
            name = statement.targets[0].id
            if name in locals_ and locals_[name][0] != "ref":
                # rebound (or a parameter rebound): unknown, as in a body with branches
                return self._branching_result(function, params)
            locals_[name] = _Values(self, locals_).value(statement.value)
        return _Values(self, locals_).value(body[-1].value)

    def _branching_result(
        self, function: ast.FunctionDef | ast.AsyncFunctionDef, params: list[Any]
    ) -> Value:
        """What a body with several ``return`` statements (under ``if``, ``try``) may return:
        ``["either", [v, ...], False]``, one value per return. A parameter or local bound
        anywhere in the body is unknown in them (which binding reaches a return is not
        followed); a generator, or a body that may end without a return, is unknown."""
        returns: list[ast.Return] = []
        stored: set[str] = set()
        stores: dict[str, int] = {}
        assigned: dict[str, ast.Assign] = {}
        stack: list[ast.AST] = list(function.body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.Yield, ast.YieldFrom)):
                return UNKNOWN
            if isinstance(node, ast.Return):
                returns.append(node)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                stored.add(node.id)
                stores[node.id] = stores.get(node.id, 0) + 1
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                return UNKNOWN
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                assigned[node.targets[0].id] = node
            if not isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
            ):
                stack.extend(ast.iter_child_nodes(node))
        last = function.body[-1] if function.body else None
        if (
            not returns
            or len(returns) > _MAX_RETURNS
            or not isinstance(last, (ast.Return, ast.Raise))
        ):
            return UNKNOWN
        locals_: dict[str, Value] = {str(p[0]): ["param", p[0]] for p in params}
        for name in stored:
            locals_[name] = UNKNOWN
        # A local bound by one plain assignment and nowhere else holds that value wherever a
        # return reads it (any read before the binding would raise): `compute = TABLE[mode]`.
        named = {str(p[0]) for p in params}
        single = [(a.lineno, a.col_offset, n, a) for n, a in assigned.items() if stores[n] == 1]
        for _, _, name, statement in sorted(single):
            if name not in named:
                locals_[name] = _Values(self, locals_).value(statement.value)
        value_of = _Values(self, locals_).value
        guards = return_guards(function.body, {str(p[0]) for p in params}, stored, value_of)
        values: list[Value] = []
        alternatives: list[list[Any]] = []  # per value: the guards of the returns that give it
        for node in sorted(returns, key=lambda r: (r.lineno, r.col_offset)):
            value = (
                ["const", None] if node.value is None else _Values(self, locals_).value(node.value)
            )
            if value not in values:
                values.append(value)
                alternatives.append([])
            alternatives[values.index(value)].append(guards.get(id(node), []))
        if len(values) == 1:
            return values[0]
        if all(not guard for alternative in alternatives for guard in alternative):
            return ["either", values, False]
        return ["either", values, False, alternatives]

    def _class(self, cls: ast.ClassDef) -> Definition:
        members: dict[str, list[Any]] = {}
        spoiled: set[str] = set()
        flags: dict[str, Any] = {
            "record": any("dataclass" in _decorator_name(d) for d in cls.decorator_list)
            or any(dotted(base).endswith("NamedTuple") for base in cls.bases),
            "frozen": any(frozen(d) for d in cls.decorator_list),
            "init": False,
            "bases": bool(cls.bases) or bool(cls.keywords),
        }
        for statement in cls.body:
            entry: list[Any] | None = None
            name: str | None = None
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                target = statement.targets[0]
                if isinstance(target, ast.Name):
                    name = target.id
                    entry = ["const", statement.lineno, self._member_value(statement.value)]
            elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                name = statement.target.id
                classvar = "ClassVar" in dotted(statement.annotation) or (
                    isinstance(statement.annotation, ast.Subscript)
                    and "ClassVar" in dotted(statement.annotation.value)
                )
                kind = "const" if classvar or not flags["record"] else "field"
                value = field_default(statement.value)
                entry = [
                    kind,
                    statement.lineno,
                    UNKNOWN if value is None else self._member_value(value),
                ]
                if value is None and kind == "field":
                    entry = ["field", statement.lineno, ["required"]]
            elif isinstance(statement, ast.FunctionDef):
                name = statement.name
                if name in {"__init__", "__post_init__", "__new__", "__setattr__", "__getattr__"}:
                    flags["init"] = True
                if any(_decorator_name(d) == "property" for d in statement.decorator_list):
                    entry = [
                        "property",
                        statement.lineno,
                        self._result(statement, [["self", "pos", None]]),
                    ]
                else:
                    entry = ["method", statement.lineno, *self._method(statement, cls)]
            elif isinstance(statement, CONDITIONAL):
                for node in ast.walk(statement):
                    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                        spoiled.add(node.id)
            if name is not None and entry is not None:
                if name in members:
                    spoiled.add(name)
                members[name] = entry
        for name in spoiled:
            members[name] = ["unknown", cls.lineno, UNKNOWN]
        flags["attributes"] = self_attributes(cls)
        flags["fields"] = positional_fields(cls) if flags["record"] else None
        flags["constructors"] = constructors(cls)
        casting = field_casters(cls) if flags["record"] else {}
        if casting:  # `state.to(device, dtype)` casts every floating tensor the record holds
            flags["field_casters"] = casting
        if cls.bases:  # maybe an nn.Module: what a module cast of it converts
            if self.factories is None:
                self.factories = factory_classes(self.tree)
            flags["module"] = module_facts(
                cls, lambda node: _Values(self, {}).value(node), self.factories
            )
        return ["class", cls.lineno, members, flags]

    def _method(self, method: ast.FunctionDef, cls: ast.ClassDef) -> tuple[Value, list[Any]]:
        """What a plain method returns (``self`` its first parameter), and its parameters:
        ``def ring_shapes(self, batch): return {"d_cache": ..., "g_cache": ...}``; what a
        generator method yields (:mod:`.yielded`)."""
        params = _params(self, method.args)
        plain = all(
            _decorator_name(d) in {"functools.cache", "cache", "lru_cache", "functools.lru_cache"}
            for d in method.decorator_list
        )
        if params is None or not params or params[0][1] != "pos" or not plain:
            return UNKNOWN, []
        if is_generator(method):
            return yielded(method, cls, self._member_value) or UNKNOWN, params
        return self._result(method, params), params

    def _member_value(self, node: ast.expr) -> Value:
        return _Values(self, {}, in_class=True).value(node)


def _partly_unknown(value: object) -> bool:
    """Whether the summary value ``value`` has an unknown part anywhere."""
    if value == UNKNOWN:
        return True
    return isinstance(value, list) and any(_partly_unknown(part) for part in value)


def _compares_dtype(test: ast.expr) -> bool:
    """``t.dtype == dtype``, ``x.dtype is torch.float32``: a test of a tensor's dtype."""
    if not isinstance(test, ast.Compare):
        return False
    operands = [test.left, *test.comparators]
    return any(isinstance(o, ast.Attribute) and o.attr == "dtype" for o in operands)


def _params(summariser: _Summariser, args: ast.arguments) -> list[Any] | None:
    """``[[name, kind, default], ...]`` with kind ``pos``, ``kw`` (keyword-only), ``star`` or
    ``starstar``; defaults are summary values (or None)."""
    values = _Values(summariser, {})
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    params: list[Any] = [
        [arg.arg, "pos", None if default is None else values.value(default)]
        for arg, default in zip(positional, defaults, strict=True)
    ]
    if args.vararg is not None:
        params.append([args.vararg.arg, "star", None])
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append([arg.arg, "kw", None if kw_default is None else values.value(kw_default)])
    if args.kwarg is not None:
        params.append([args.kwarg.arg, "starstar", None])
    return params


class _Values:
    """Expressions -> summary values, with a function's locals (and parameters) substituted."""

    def __init__(
        self, summariser: _Summariser, locals_: dict[str, Value], *, in_class: bool = False
    ) -> None:
        self.summariser = summariser
        self.locals = locals_
        self.in_class = in_class
        self.budget = _MAX_VALUE_NODES

    def value(self, node: ast.expr) -> Value:
        self.budget -= 1
        if self.budget < 0:
            return UNKNOWN
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (str, int, float, bool)) or node.value is None:
                return ["const", node.value]
            return UNKNOWN
        if isinstance(node, ast.Name):
            if node.id in self.locals:
                return self.locals[node.id]
            return ["name", node.id]
        if isinstance(node, ast.Attribute):
            if (
                isinstance(node.value, ast.Name)
                and node.value.id in {"self", "cls"}
                and (self.in_class or node.value.id in self.locals)
            ):
                return ["self", node.attr]
            return ["attr", self.value(node.value), node.attr]
        if isinstance(node, ast.Subscript):
            return ["item", self.value(node.value), self.value(node.slice)]
        if isinstance(node, ast.Dict):
            if any(key is None for key in node.keys):
                return UNKNOWN  # a `**spread`: not a table we read
            keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
            if not all(isinstance(key, (str, int)) for key in keys):
                # `{Precision.FP32: torch.float32, ...}`: which key is which is not read
                return ["values", [self.value(item) for item in node.values]]
            return ["table", [[k, self.value(v)] for k, v in zip(keys, node.values, strict=True)]]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            if any(isinstance(e, ast.Starred) for e in node.elts):
                return UNKNOWN
            kind = "set" if isinstance(node, ast.Set) else "tuple"
            return [kind, [self.value(e) for e in node.elts]]
        zipped = zipped_values(node)  # `dict(zip(P, (<call> for v in P.values())))`
        if zipped is not None:
            source, entry, made = zipped
            inner = dict(self.locals)
            inner[entry] = ["loop", "value"]
            element = _Values(self.summariser, inner, in_class=self.in_class).value(made)
            return ["per_key", self.value(source), element]
        if isinstance(node, ast.Call):
            named = {k.arg for k in node.keywords}
            if any(isinstance(a, ast.Starred) for a in node.args) or (
                None in named and "dtype" not in named  # an explicit dtype: `**` holds none
            ):
                return UNKNOWN
            if isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
                # `dict(float16=torch.float16, ...)`: a table as a literal would be
                return ["table", [[k.arg, self.value(k.value)] for k in node.keywords]]
            return [
                "call",
                self.value(node.func),
                [self.value(a) for a in node.args],
                [[k.arg, self.value(k.value)] for k in node.keywords if k.arg is not None],
            ]
        if isinstance(node, ast.IfExp):  # either branch: a test on a parameter is kept
            branches = [self.value(node.body), self.value(node.orelse)]
            tested = {name for name, value in self.locals.items() if value == ["param", name]}
            condition = test_condition(node.test, tested, self.value)
            if condition is None:
                return ["either", branches, _compares_dtype(node.test)]
            guards = [[[condition]], [[negated(condition)]]]
            return ["either", branches, _compares_dtype(node.test), guards]
        if isinstance(node, ast.DictComp):
            return self._per_key(node)
        if isinstance(node, ast.Lambda):
            params = _params(self.summariser, node.args)
            if params is None:
                return UNKNOWN
            inner = dict(self.locals)
            inner.update({str(p[0]): ["param", p[0]] for p in params})
            return ["lambda", params, _Values(self.summariser, inner).value(node.body)]
        return UNKNOWN

    def _per_key(self, node: ast.DictComp) -> Value:
        """``{k: v for k, v in mapping.items()}`` or ``{k: v for k in mapping}``, unfiltered."""
        parts = per_key_parts(node)
        if parts is None:
            return UNKNOWN
        source, key, entry, made = parts
        inner = dict(self.locals)
        inner[key] = ["loop", "key"]
        if entry is not None:
            inner[entry] = ["loop", "value"]
        element = _Values(self.summariser, inner, in_class=self.in_class).value(made)
        return ["per_key", self.value(source), element]


def _decorator_name(node: ast.expr) -> str:
    return dotted(node.func if isinstance(node, ast.Call) else node)
