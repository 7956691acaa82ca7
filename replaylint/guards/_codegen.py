"""Generate a guard wrapper that has the decorated function's own parameter list.

A ``*args, **kwargs`` wrapper must fish the guarded argument out of ``args``/``kwargs`` and then
forward both, so a keyword call pays CPython's keyword matching twice. A wrapper declared with the
same parameters lets Python's own argument binding put the guarded tensor in a local variable,
and forwards everything positionally. Its hot path is one ``isinstance`` and one ``dtype is``
per guarded argument; any other case goes to the slow path with the bound arguments.
"""

from __future__ import annotations

import inspect
import itertools
import keyword
import linecache
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FastCheck", "SlowPath", "build_wrapper"]

SlowPath = Callable[[tuple[Any, ...], dict[str, Any]], Any]
"""Called with (positional values including ``*args``, keyword-only values and ``**kwargs``)."""


@dataclass(frozen=True)
class FastCheck:
    """What the hot path accepts for one parameter without calling the slow path."""

    name: str
    allowed: tuple[torch.dtype, ...]
    none_ok: bool


_P = inspect.Parameter
_files = itertools.count(1)


def build_wrapper(
    fn: Callable[..., Any],
    signature: inspect.Signature,
    checks: Sequence[FastCheck],
    slow_path: SlowPath,
) -> Callable[..., Any]:
    """Return a function with ``signature`` that calls ``fn`` when every check passes."""
    params = list(signature.parameters.values())
    for param in params:
        if not param.name.isidentifier() or keyword.iskeyword(param.name):
            raise TypeError(
                f"cannot guard {fn!r}: its signature has a parameter named {param.name!r}, "
                "which is not a Python identifier."
            )
    prefix = "_rl_"
    while any(param.name.startswith(prefix) for param in params):
        prefix = "_" + prefix

    def_name = getattr(fn, "__name__", "")
    if not def_name.isidentifier() or keyword.iskeyword(def_name) or def_name.startswith(prefix):
        def_name = "guarded"

    conditions = []
    constants: dict[str, Any] = {}
    for number, check in enumerate(checks):
        allowed_name = f"{prefix}ok{number}"
        if len(check.allowed) == 1:
            constants[allowed_name] = check.allowed[0]
            dtype_test = f"{check.name}.dtype is {allowed_name}"
        else:
            constants[allowed_name] = check.allowed
            dtype_test = f"{check.name}.dtype in {allowed_name}"
        test = f"{prefix}isinstance({check.name}, {prefix}Tensor) and {dtype_test}"
        if check.none_ok:
            test = f"{check.name} is None or ({test})"
        conditions.append(f"({test})")

    source = "\n".join(
        [
            f"def {prefix}make({prefix}fn, {prefix}slow, {prefix}isinstance, {prefix}Tensor, "
            f"{''.join(name + ', ' for name in constants)}):",
            f"    def {def_name}({_declaration(params)}):",
            f"        if {' and '.join(conditions)}:",
            f"            return {prefix}fn({_forwarding(params)})",
            f"        return {prefix}slow({_bound_positional(params)}, {_bound_keyword(params)})",
            f"    return {def_name}",
            "",
        ]
    )
    filename = f"<replaylint.guards wrapper {next(_files)} of {_describe(fn)}>"
    # Registered so that tracebacks and torch.compile's messages can show the generated lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), {"__builtins__": __builtins__}, namespace)
    wrapper: Callable[..., Any] = namespace[f"{prefix}make"](
        fn, slow_path, isinstance, torch.Tensor, *constants.values()
    )

    positional_defaults = tuple(
        param.default
        for param in params
        if param.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
        and param.default is not _P.empty
    )
    keyword_defaults = {
        param.name: param.default
        for param in params
        if param.kind is _P.KEYWORD_ONLY and param.default is not _P.empty
    }
    wrapper.__defaults__ = positional_defaults or None
    wrapper.__kwdefaults__ = keyword_defaults or None
    return wrapper


def _declaration(params: Sequence[inspect.Parameter]) -> str:
    parts: list[str] = []
    for index, param in enumerate(params):
        if param.kind is _P.KEYWORD_ONLY and not any(
            earlier.kind in (_P.KEYWORD_ONLY, _P.VAR_POSITIONAL) for earlier in params[:index]
        ):
            parts.append("*")
        if param.kind is _P.VAR_POSITIONAL:
            parts.append(f"*{param.name}")
        elif param.kind is _P.VAR_KEYWORD:
            parts.append(f"**{param.name}")
        else:
            parts.append(param.name)
        if param.kind is _P.POSITIONAL_ONLY and (
            index + 1 == len(params) or params[index + 1].kind is not _P.POSITIONAL_ONLY
        ):
            parts.append("/")
    return ", ".join(parts)


def _forwarding(params: Sequence[inspect.Parameter]) -> str:
    parts: list[str] = []
    for param in params:
        if param.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
            parts.append(param.name)
        elif param.kind is _P.VAR_POSITIONAL:
            parts.append(f"*{param.name}")
        elif param.kind is _P.KEYWORD_ONLY:
            parts.append(f"{param.name}={param.name}")
        else:
            parts.append(f"**{param.name}")
    return ", ".join(parts)


def _bound_positional(params: Sequence[inspect.Parameter]) -> str:
    parts = [
        param.name if param.kind is not _P.VAR_POSITIONAL else f"*{param.name}"
        for param in params
        if param.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD, _P.VAR_POSITIONAL)
    ]
    if not parts:
        return "()"
    return "(" + ", ".join(parts) + ",)"


def _bound_keyword(params: Sequence[inspect.Parameter]) -> str:
    parts = [
        f"{param.name!r}: {param.name}" if param.kind is _P.KEYWORD_ONLY else f"**{param.name}"
        for param in params
        if param.kind in (_P.KEYWORD_ONLY, _P.VAR_KEYWORD)
    ]
    return "{" + ", ".join(parts) + "}"


def _describe(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{name}"
