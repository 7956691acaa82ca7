"""What a class of a project module tells importers about module casts: its buffers and parts.

A model class defined in ``modeling.py`` and cast in ``loader.py`` (``model.half()``) converts
every floating buffer it holds, gate caches included. For the importer to see that, the summary
of a class with base classes records, from the class's own text (``ast``, no evaluation):

``buffers``
    ``[[name, line, maker], ...]``: buffers its methods register (``register_buffer("g_cache", ...)``,
    ``register_buffer(f"g_cache_{i}", ...)`` named as written, ``self.g_cache = nn.Buffer(...)``)
    whose value may be a floating tensor (not ``None``, not an integer or bool dtype, not already
    another floating dtype than float32, which the defining module reports where it registers it);
    ``maker`` is ``""`` when the constructor registers it, else the method that does
    (:mod:`.buffer_makers`): an instance holds it once that method has run;
``holds``
    ``[[attribute, [callee, ...]], ...]``: what its constructor builds into attributes of ``self``
    (``self.layers = nn.ModuleList([Layer(...) for ...])``, ``add_module(f"layer{i}", Layer())``,
    ``self.blocks.append(Block())``, ``self.model.layers = ...`` of a container module); every callee is kept as a summary value, and the importer
    keeps only those that resolve to classes of the project;
``installs``
    ``[[attribute, [callee, ...], method], ...]``: what ``method``, run after construction, builds
    into attributes of the instance or of its parts (``self.static_cache = Cache(...)`` in
    ``setup_static_cache``, ``for block in self.layers: block.attention.kv_cache = Cache(...)``),
    listed once for it and once for each method that runs it: an instance holds them only once
    one of those has been called on it;
``bases``
    the base classes as summary values;
``keeps``
    whether the class keeps its gate buffers float32 through casts: decorated with
    ``keep_fp32_gate_caches``, mixing in ``KeepFp32GateCaches``, or overriding ``_apply``, ``to``,
    ``half``, ``bfloat16`` or ``type`` with a body that mentions float32 (``.float()``,
    ``torch.float32``) or the guard;
``guarded``
    decorated with the guard or mixing it in (which also keeps state-dict loads float32);
``restores``
    the attributes such an override sets (``self.g_cache = kept``, ``register_buffer(...)``): an
    override that puts a gate cache back keeps it too.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from replaylint.lint.project.buffer_makers import (
    buffer_makers,
    constructing_methods,
    method_runners,
    written_name,
)

Value = list[Any]

_KEEPING_METHODS = frozenset({"_apply", "to", "half", "bfloat16", "type"})
_NOT_FLOAT32 = frozenset(
    {"int8", "int16", "int32", "int64", "uint8", "long", "int", "short", "bool"}
    | {"bfloat16", "float16", "half", "float64", "double", "complex64", "complex128"}
)
_ADDING = frozenset({"append", "extend", "insert"})
_MAX_CALLEES = 32  # per attribute: a longer list is no model's structure


def module_facts(
    cls: ast.ClassDef,
    value_of: Callable[[ast.expr], Value],
    factories: dict[str, list[ast.expr]] | None = None,
) -> dict[str, Any]:
    """The module-cast facts of ``cls`` (see the module docstring); ``value_of`` turns an
    expression of the module into a summary value; ``factories`` are the module's functions
    and methods that make an instance of one class (:func:`factory_classes`)."""
    buffers: list[list[Any]] = []
    holds: dict[str, list[Value]] = {}
    installs: dict[tuple[str, str], list[Value]] = {}

    nodes = list(ast.walk(cls))
    makers = buffer_makers(cls)
    aliases = _class_aliases(nodes)
    flags = _alias_flags(nodes)

    def hold(attribute: str, expr: ast.expr, into: list[Value] | None = None) -> None:
        callees = holds.setdefault(attribute, []) if into is None else into
        for node in ast.walk(expr):
            if len(callees) >= _MAX_CALLEES:
                return
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                callees.append(value_of(node.func))
                called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                for made in (factories or {}).get(called, ()):  # `attn.build_kv_cache(...)`
                    callees.append(value_of(made))
                choices = aliases.get(node.func.id, ()) if isinstance(node.func, ast.Name) else ()
                if choices:  # `cache_cls(...)` of `cache_cls = A if c else B`: one of them
                    either: Value = ["either", [value_of(choice) for choice in choices], False]
                    flag = flags.get(node.func.id) if isinstance(node.func, ast.Name) else None
                    if flag is not None:
                        either.append(flag)
                    callees.append(either)

    parts = _parts_of_self(nodes)
    method_of = {
        id(node): statement.name
        for statement in cls.body
        if isinstance(statement, ast.FunctionDef)
        for node in ast.walk(statement)
    }
    constructing = constructing_methods(cls)
    runners = method_runners(cls)

    def hold_self(attribute: str, node: ast.AST, expr: ast.expr) -> None:
        """A part of ``self``: held from construction, or installed by a method run later
        (``self.static_cache = Cache(...)`` in ``setup_static_cache``), and by its callers."""
        method = method_of.get(id(node), "")
        if method in constructing or method not in runners:
            hold(attribute, expr)
            return
        for runner in sorted(runners[method]):
            hold(attribute, expr, installs.setdefault((attribute, runner), []))

    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, args = node.func.attr, node.args
            if method == "register_buffer" and len(args) >= 2:
                name = written_name(args[0])
                if name is not None and _may_be_float32(args[1]):
                    buffers.append([name, node.lineno, makers.get(name, "")])
            elif method == "add_module" and len(args) == 2:
                name = written_name(args[0])
                if name is not None:
                    hold_self(name, node, args[1])
            elif method in _ADDING and args and _self_attribute(node.func.value) is not None:
                hold_self(str(_self_attribute(node.func.value)), node, args[-1])
        elif isinstance(node, ast.Call) and _is_name(node.func, "setattr") and len(node.args) == 3:
            name = written_name(node.args[1])
            if _self_attribute_base(node.args[0]) and name is not None:
                hold_self(name, node, node.args[2])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                attribute = _self_attribute(target)
                nested = dotted(target) if isinstance(target, ast.Attribute) else ""
                if attribute is None and nested.startswith("self."):
                    hold(nested.removeprefix("self."), node.value)  # `self.model.layers = ...`
                    continue
                if attribute is None:
                    part = _part_attribute(target, parts)
                    if part is not None:
                        hold_self(part, node, node.value)
                    continue
                value = node.value
                if (
                    isinstance(value, ast.Call)
                    and dotted(value.func).rpartition(".")[2] == "Buffer"
                    and value.args
                    and _may_be_float32(value.args[0])
                ):
                    buffers.append([attribute, node.lineno, makers.get(attribute, "")])
                else:
                    hold_self(attribute, node, value)
    keeps, restores = _keeps(cls)
    return {
        "buffers": buffers,
        "holds": [[attribute, callees] for attribute, callees in holds.items() if callees],
        "installs": [
            [attribute, callees, method]
            for (attribute, method), callees in installs.items()
            if callees
        ],
        "bases": [value_of(base) for base in cls.bases],
        "keeps": keeps,
        "guarded": _guarded(cls),
        "restores": restores,
    }


def factory_classes(tree: ast.Module) -> dict[str, list[ast.expr]]:
    """Functions and methods of the module (by name) every ``return`` of which returns a call of
    a name (``return KVCache(batch, config)``): those names, the classes they may make."""
    found: dict[str, list[ast.expr]] = {}
    spoiled: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
            continue
        returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return)]
        made: list[ast.expr] = [
            value.func
            for value in returns
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
        ]
        if not returns or len(made) != len(returns) or node.name in found:
            spoiled.add(node.name)
            continue
        found[node.name] = made
    return {name: made for name, made in found.items() if name not in spoiled}


def _guarded(cls: ast.ClassDef) -> bool:
    """Decorated with ``keep_fp32_gate_caches`` or mixing in ``KeepFp32GateCaches``: its gate
    buffers stay float32 through casts and state-dict loads alike."""
    return any(
        "keep_fp32_gate_caches" in dotted(d.func if isinstance(d, ast.Call) else d)
        for d in cls.decorator_list
    ) or any(dotted(base).endswith("KeepFp32GateCaches") for base in cls.bases)


def _keeps(cls: ast.ClassDef) -> tuple[bool, list[str]]:
    """Whether the class is guarded or overrides a cast method with a body that mentions
    float32 (``.float()``, ``torch.float32``) or the guard; and the attributes such an override
    sets (``self.g_cache = kept``): a gate cache among them is put back too."""
    restores = False
    attributes: list[str] = []
    for statement in cls.body:
        if not (isinstance(statement, ast.FunctionDef) and statement.name in _KEEPING_METHODS):
            continue
        for node in ast.walk(statement):
            if (isinstance(node, ast.Attribute) and node.attr == "float32") or (
                isinstance(node, ast.Call)
                and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "float")
                    or dotted(node.func).endswith("keep_fp32_gate_caches")
                )
            ):
                restores = True
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"update", "setdefault", "__setitem__"}
                and _module_table(node.func.value)
            ):
                restores = True  # `self._buffers.update(kept)`: puts back what it saved
            elif (
                isinstance(node, ast.Call)
                and _is_name(node.func, "setattr")
                and len(node.args) == 3
                and _is_name(node.args[0], "self")
                and written_name(node.args[1]) is None
            ):
                restores = True  # `setattr(self, name, kept)` of each name saved before the cast
            elif isinstance(node, ast.Call) and dotted(node.func).endswith("register_buffer"):
                name = written_name(node.args[0]) if node.args else None
                attributes += [name] if name is not None else []
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                attributes += [a for t in targets if (a := _self_attribute(t)) is not None]
                # `self._buffers[name] = kept`: puts back what it saved before the cast
                restores = restores or any(_module_table_entry(t) for t in targets)
    return _guarded(cls) or restores, attributes


def _module_table(expr: ast.expr) -> bool:
    """``self._buffers`` or ``self._parameters``."""
    return (
        isinstance(expr, ast.Attribute)
        and expr.attr in {"_buffers", "_parameters"}
        and _self_attribute_base(expr.value)
    )


def _module_table_entry(target: ast.expr) -> bool:
    """``self._buffers[...]`` or ``self._parameters[...]``."""
    return (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Attribute)
        and target.value.attr in {"_buffers", "_parameters"}
        and isinstance(target.value.value, ast.Name)
        and target.value.value.id == "self"
    )


def _may_be_float32(value: ast.expr) -> bool:
    """Whether a registered value may be a float32 tensor: not ``None``, and not allocated with
    a dtype that is an integer, bool or another floating type."""
    if isinstance(value, ast.Constant) and value.value is None:
        return False
    if isinstance(value, ast.Call):
        for keyword in value.keywords:
            if keyword.arg == "dtype":
                return dotted(keyword.value).rpartition(".")[2] not in _NOT_FLOAT32
    return True


def _alias_flags(nodes: list[ast.AST]) -> dict[str, list[Any]]:
    """``["flag", parameter, value]`` for a local bound once to ``A if <parameter> else B`` or
    ``A if <parameter> == <literal> else B`` (``value`` true, or the literal): the first choice
    is the one made when the method's caller passes that value. A local bound more than once
    has no flag."""
    flags: dict[str, list[Any]] = {}
    bound: dict[str, int] = {}
    for node in nodes:
        if not isinstance(node, ast.FunctionDef):
            continue
        parameters = {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
        for statement in ast.walk(node):
            if not (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
            ):
                continue
            name = statement.targets[0].id
            bound[name] = bound.get(name, 0) + 1
            value = statement.value
            if not isinstance(value, ast.IfExp):
                continue
            test = value.test
            if isinstance(test, ast.Name) and test.id in parameters:
                flags[name] = ["flag", test.id, True]
            elif (
                isinstance(test, ast.Compare)
                and isinstance(test.left, ast.Name)
                and test.left.id in parameters
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq)
                and isinstance(test.comparators[0], ast.Constant)
                and isinstance(test.comparators[0].value, (str, int, bool))
            ):
                flags[name] = ["flag", test.left.id, test.comparators[0].value]
    return {name: flag for name, flag in flags.items() if bound.get(name) == 1}


def _class_aliases(nodes: list[ast.AST]) -> dict[str, list[ast.expr]]:
    """Locals of the class's methods bound to a class name or a choice of them (``cache_cls =
    StaticCache if static else Cache``, ``cache_cls = cache_cls or Cache``), and parameters
    whose default is one (``cache_cls=Cache``): what a call of the local may build."""
    aliases: dict[str, list[ast.expr]] = {}
    for node in nodes:
        if isinstance(node, ast.FunctionDef):
            for parameter, default in _defaults(node.args):
                # `cache_cls: Type[Cache] = Cache`: what a call that passes none builds
                if isinstance(default, (ast.Name, ast.Attribute)):
                    aliases.setdefault(parameter.arg, []).append(default)
            continue
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            continue
        choices = [node.value]
        while choices and isinstance(choices[-1], (ast.IfExp, ast.BoolOp)):
            last = choices.pop()
            if isinstance(last, ast.IfExp):
                choices += [last.body, last.orelse]
            elif isinstance(last, ast.BoolOp) and isinstance(last.op, ast.Or):
                # `cache_cls = cache_cls or Cache`
                choices += last.values
            else:
                choices.append(last)
                break
        if choices and all(isinstance(c, (ast.Name, ast.Attribute)) for c in choices):
            aliases.setdefault(node.targets[0].id, []).extend(choices)
    return aliases


def _defaults(args: ast.arguments) -> list[tuple[ast.arg, ast.expr]]:
    """Each parameter with a default, and the default."""
    positional = [*args.posonlyargs, *args.args]
    pairs = list(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    pairs += [
        (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    ]
    return pairs


def _parts_of_self(nodes: list[ast.AST]) -> frozenset[str]:
    """Local names of the class's methods bound to parts of ``self`` (``for block in
    self.layers``, ``attention = block.attention``), followed to a fixed point."""
    bindings: list[tuple[ast.expr, ast.expr]] = []
    for node in nodes:
        if isinstance(node, (ast.For, ast.comprehension)):
            target, source = node.target, node.iter
            if (  # `for i, block in enumerate(self.layers)`
                isinstance(target, ast.Tuple)
                and len(target.elts) == 2
                and isinstance(source, ast.Call)
                and _is_name(source.func, "enumerate")
                and source.args
            ):
                target, source = target.elts[1], source.args[0]
            bindings.append((target, source))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            bindings.append((node.targets[0], node.value))
    parts: set[str] = set()
    changed = True
    while changed:
        changed = False
        for target, source in bindings:
            if isinstance(target, ast.Name) and target.id not in parts and _reaches(source, parts):
                parts.add(target.id)
                changed = True
    return frozenset(parts)


def _reaches(source: ast.expr, parts: set[str]) -> bool:
    """Whether ``source`` is ``self`` or a part, or an attribute, item or call of one
    (``self.layers``, ``block.attention``, ``self.layers[i]``, ``self.layers.children()``)."""
    node = source
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        else:
            break
    return isinstance(node, ast.Name) and (node.id == "self" or node.id in parts)


def _part_attribute(target: ast.expr, parts: frozenset[str]) -> str | None:
    """``block.attention.cache`` for an assignment to an attribute of a part of ``self``."""
    if not isinstance(target, ast.Attribute):
        return None
    written = dotted(target)
    return written if written.partition(".")[0] in parts else None


def _self_attribute(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute) and _self_attribute_base(node.value):
        return node.attr
    return None


def _self_attribute_base(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def dotted(node: ast.expr) -> str:
    """``a.b.c`` for a chain of names, ``""`` for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return ""


def constructors(cls: ast.ClassDef) -> list[str]:
    """The class's classmethods that return an instance of it: ``return cls(config)``, or
    annotated to return the class (``def from_name(cls, name) -> "Transformer"``)."""
    found: list[str] = []
    for statement in cls.body:
        if not isinstance(statement, ast.FunctionDef) or not any(
            dotted(d) == "classmethod" for d in statement.decorator_list
        ):
            continue
        returns = statement.returns
        if isinstance(returns, ast.Constant):
            annotated = str(returns.value)
        else:
            annotated = dotted(returns) if returns is not None else ""
        first = statement.args.args[0].arg if statement.args.args else "cls"
        made = any(
            isinstance(node, ast.Return)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == first
            for node in ast.walk(statement)
        )
        if made or annotated in {cls.name, "Self", "typing.Self", "typing_extensions.Self"}:
            found.append(statement.name)
    return found


def restorers(tree: ast.Module) -> dict[str, list[str]]:
    """Functions and methods (``"for_inference"``, ``"FastModel.for_inference"``) of the module
    that put attributes back to float32 (``module.g_cache = module.g_cache.float()``), with
    those attributes: a module cast whose result goes straight into one is undone for them."""
    found: dict[str, list[str]] = {}
    functions: list[tuple[str, ast.FunctionDef]] = []
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef):
            functions.append((statement.name, statement))
        elif isinstance(statement, ast.ClassDef):
            functions += [
                (f"{statement.name}.{member.name}", member)
                for member in statement.body
                if isinstance(member, ast.FunctionDef)
            ]
    for name, function in functions:
        restored = sorted(
            {
                target.attr
                for node in ast.walk(function)
                if isinstance(node, ast.Assign) and _makes_float32(node.value)
                for target in node.targets
                if isinstance(target, ast.Attribute)
            }
            | {  # `module._buffers[name] = buffer.float()`: each buffer a module lists
                "*"
                for node in ast.walk(function)
                if isinstance(node, ast.Assign) and _makes_float32(node.value)
                for target in node.targets
                if isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Attribute)
                and target.value.attr == "_buffers"
            }
        )
        if restored:
            found[name] = restored
    return found


def _makes_float32(value: ast.expr) -> bool:
    """``x.float()``, ``x.to(torch.float32)``, ``x.to(dtype=torch.float32)``."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)):
        return False
    if value.func.attr == "float" and not value.args:
        return True
    written = [*value.args, *(keyword.value for keyword in value.keywords)]
    return value.func.attr == "to" and any(dotted(arg).endswith("float32") for arg in written)
