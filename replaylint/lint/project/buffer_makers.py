"""Which method of a module class makes each buffer: the constructor, or a method run later.

A cast of a module converts the buffers it holds when it is cast. A class that registers its
caches in ``setup_cache`` (or in ``__init__`` only when a flag asks for them, and otherwise in
``setup_cache``) holds none right after construction: ``Transformer(args).to(torch.bfloat16)``
followed by ``model.setup_cache(...)`` leaves the later float32 gate buffer alone. The answer is
read from the class's own text (``ast``): the constructor is ``__init__`` and the methods it
calls on ``self`` outside any ``if`` (at any depth); a registration inside an ``if`` of those
counts as construction unless another method registers the same name too (then the class makes
the buffer later unless asked, and the flag is not known).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

CONSTRUCTION = ""
"""The maker of a buffer the constructor registers."""


def buffer_makers(cls: ast.ClassDef) -> dict[str, str]:
    """Buffer name (as written, f-string fields kept) -> :data:`CONSTRUCTION` or the name of the
    first method that registers it after construction."""
    methods = _methods(cls)
    constructing = _constructing(methods)
    made: dict[str, str] = {}
    conditional: set[str] = set()
    for name, method in methods.items():
        for registered, guarded in _registrations(method):
            if name in constructing and not guarded:
                made[registered] = CONSTRUCTION
            elif name in constructing:
                conditional.add(registered)
            else:
                made.setdefault(registered, name)
    for registered in conditional - made.keys():
        made[registered] = CONSTRUCTION  # only ever made by the constructor, when asked
    return made


def constructing_methods(cls: ast.ClassDef) -> set[str]:
    """``__init__`` and the methods it runs unconditionally on ``self``: what construction runs."""
    methods = _methods(cls)
    return _constructing(methods)


def method_runners(cls: ast.ClassDef) -> dict[str, set[str]]:
    """Method name -> the methods whose run runs it on ``self`` (itself included, at any depth):
    a part ``setup_caches`` installs is also there once ``generate`` (which calls it) has run."""
    methods = _methods(cls)
    callers: dict[str, set[str]] = {name: set() for name in methods}
    for name, method in methods.items():
        for node, _ in _walk(method):
            called = _self_call(node)
            if called in callers:
                callers[called].add(name)
    runners: dict[str, set[str]] = {}
    for name in methods:
        found, stack = set(), [name]
        while stack:
            current = stack.pop()
            if current not in found:
                found.add(current)
                stack.extend(callers.get(current, ()))
        runners[name] = found
    return runners


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _self_call(node: ast.AST) -> str | None:
    """The method ``node`` calls on ``self`` (``self.setup_caches(...)``), if any."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ):
        return node.func.attr
    return None


def _constructing(methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> set[str]:
    """``__init__`` and the methods it runs unconditionally on ``self``, at any depth."""
    found: set[str] = set()
    stack = ["__init__"]
    while stack:
        name = stack.pop()
        if name in found or name not in methods:
            continue
        found.add(name)
        for node, guarded in _walk(methods[name]):
            called = None if guarded else _self_call(node)
            if called is not None:
                stack.append(called)
    return found | {"__init__"}


def _registrations(method: ast.AST) -> Iterator[tuple[str, bool]]:
    """The buffer names ``method`` registers, each with whether an ``if`` guards it."""
    for node, guarded in _walk(method):
        name: str | None = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_buffer"
            and node.args
        ):
            name = written_name(node.args[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets if called == "Buffer" else ():
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    yield target.attr, guarded
        if name is not None:
            yield name, guarded


def _walk(root: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """Every node below ``root`` with whether an ``if`` statement or expression encloses it;
    nested functions and classes are not walked (they run at another time)."""
    stack: list[tuple[ast.AST, bool]] = [(child, False) for child in ast.iter_child_nodes(root)]
    while stack:
        node, guarded = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node, guarded
        inner = guarded or isinstance(node, (ast.If, ast.IfExp))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def written_name(node: ast.expr) -> str | None:
    """A buffer or submodule name as written: a string, or an f-string with its fields kept."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                parts.append("{" + ast.unparse(part.value) + "}")
        return "".join(parts)
    return None
