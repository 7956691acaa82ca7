"""``require_dtypes``: the general dtype guard, and the slow path every guard shares."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, overload

import torch

from replaylint.guards._cast import (
    CastCopy,
    close_quietly,
    copy_back,
    make_copy,
    metadata_refusal,
    narrowing_refusal,
    runs_later,
)
from replaylint.guards._codegen import FastCheck, build_wrapper
from replaylint.guards._errors import DtypeGuardError
from replaylint.guards._policy import Policy, effective_policy, parse_policy
from replaylint.guards._warn_once import emit_once
from replaylint.guards._wording import GENERIC, Wording

__all__ = ["DtypeGuard", "require_dtypes"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_serials = itertools.count(1)
_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)


def require_dtypes(
    *, policy: Policy = "reject", **dtypes: torch.dtype | tuple[torch.dtype, ...]
) -> DtypeGuard:
    """Guard the dtypes of named tensor parameters of a function, method or static method.

    ``@require_dtypes(ssm_state_indices=torch.int32, a=(torch.bfloat16, torch.float32))`` checks
    on every call that each named argument is a tensor of one of its dtypes. What happens when one
    is not depends on the policy (``"reject"``, ``"cast"``, ``"warn"`` or ``"off"``; see
    :mod:`replaylint.guards`); ``"cast"`` converts to the first dtype listed. The name ``policy``
    is this function's own option, so a parameter called ``policy`` cannot be guarded with it.
    """
    if isinstance(policy, (torch.dtype, tuple)):
        raise TypeError(
            f"require_dtypes(policy={policy!r}): 'policy' is the guard's own option and must be "
            "one of 'reject', 'cast', 'warn' or 'off'; a parameter named 'policy' cannot be "
            "guarded with require_dtypes."
        )
    chosen = parse_policy(policy, where="require_dtypes(policy=...)")
    if not dtypes:
        raise TypeError(
            "require_dtypes() needs at least one parameter=dtype pair, "
            "e.g. require_dtypes(ssm_state_indices=torch.int32)."
        )
    allowed = {name: _dtype_tuple(name, spec) for name, spec in dtypes.items()}
    return DtypeGuard(allowed, chosen, GENERIC, "require_dtypes")


def _dtype_tuple(name: str, spec: object) -> tuple[torch.dtype, ...]:
    if isinstance(spec, torch.dtype):
        return (spec,)
    if isinstance(spec, tuple) and spec and all(isinstance(item, torch.dtype) for item in spec):
        return tuple(dict.fromkeys(spec))
    raise TypeError(
        f"require_dtypes({name}=...) takes a torch.dtype or a non-empty tuple of them "
        f"(e.g. torch.float32); got {type(spec).__name__} {spec!r}."
    )


class DtypeGuard:
    """A configured guard; apply it to functions, methods, static and class methods."""

    def __init__(
        self,
        allowed: Mapping[str, tuple[torch.dtype, ...]],
        policy: Policy,
        wording: Wording,
        decorator: str,
        missing_hint: str = "",
    ) -> None:
        self._allowed = dict(allowed)
        self._policy = policy
        self._wording = wording
        self._decorator = decorator
        self._missing_hint = missing_hint

    @overload
    def __call__(self, fn: staticmethod[P, R], /) -> staticmethod[P, R]: ...
    @overload
    def __call__(self, fn: classmethod[T, P, R], /) -> classmethod[T, P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...
    def __call__(self, fn: Any, /) -> Any:
        # Applied over @staticmethod/@classmethod: guard the function inside, then re-wrap it.
        if isinstance(fn, staticmethod):
            return staticmethod(self._guard(fn.__func__))
        if isinstance(fn, classmethod):
            return classmethod(self._guard(fn.__func__))
        return self._guard(fn)

    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise TypeError(
                f"@{self._decorator} decorates functions and methods; got "
                f"{type(fn).__name__} {fn!r}. Options go by keyword: "
                f"@{self._decorator}(policy='cast')."
            )
        name = _function_name(fn)
        if _body_runs_later(fn):
            raise TypeError(
                f"@{self._decorator} cannot guard {name}(): it is a coroutine or generator "
                "function, whose body runs after the call returns, so the 'cast' policy could "
                "not copy its writes back. Guard the plain function that receives the tensor."
            )
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"@{self._decorator} cannot read the signature of {fn!r} ({error}); "
                "guard a Python function with a readable signature."
            ) from error
        located = [
            self._locate(name, signature, param, dtypes) for param, dtypes in self._allowed.items()
        ]
        slow_path = _SlowPath(fn, name, located, self._policy, self._wording)
        fast_checks = [FastCheck(check.name, check.allowed, check.none_ok) for check in located]
        wrapper = build_wrapper(fn, signature, fast_checks, slow_path)
        functools.update_wrapper(wrapper, fn)
        # torch.jit.script follows __wrapped__ to the undecorated source and would compile the
        # function without its check; it calls this hook first, for functions too.
        wrapper.__prepare_scriptable__ = functools.partial(  # type: ignore[attr-defined]
            _refuse_scripting, self._decorator, name
        )
        return wrapper

    def _locate(
        self,
        function: str,
        signature: inspect.Signature,
        param: str,
        allowed: tuple[torch.dtype, ...],
    ) -> _Located:
        params = signature.parameters
        found = params.get(param)
        if found is None:
            raise TypeError(
                f"@{self._decorator}: {function}() has no parameter {param!r} to guard; its "
                f"parameters are ({', '.join(params)}).{self._missing_hint}"
            )
        if found.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
            stars = "*" if found.kind is _P.VAR_POSITIONAL else "**"
            raise TypeError(
                f"@{self._decorator}: cannot guard {stars}{param} of {function}(); name a single "
                "parameter that receives one tensor."
            )
        index = None
        if found.kind in _POSITIONAL:
            positional = [p.name for p in params.values() if p.kind in _POSITIONAL]
            index = positional.index(param)
        return _Located(param, index, allowed, found.default is None)


@dataclass(frozen=True)
class _Located:
    """A guarded parameter, located once at decoration time."""

    name: str
    index: int | None
    """Position among the positional parameters; None for a keyword-only parameter."""
    allowed: tuple[torch.dtype, ...]
    none_ok: bool
    """The parameter's default is None, so None is a valid value."""


class _SlowPath:
    """Everything except the all-correct case: policy, errors, warnings and the cast."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        checks: list[_Located],
        policy: Policy,
        wording: Wording,
    ) -> None:
        self.fn = fn
        self.name = name
        self.checks = checks
        self.policy = policy
        self.wording = wording
        # A string: torch.compile(dynamic=True) may trace int attributes as symbolic values.
        self.serial = str(next(_serials))

    def __call__(self, positional: tuple[Any, ...], keyword: dict[str, Any]) -> Any:
        policy = effective_policy(self.policy)
        if policy == "off":
            return self.fn(*positional, **keyword)
        wrong: list[tuple[_Located, torch.Tensor]] = []
        for check in self.checks:
            value = positional[check.index] if check.index is not None else keyword[check.name]
            if value is None and check.none_ok:
                continue
            if not isinstance(value, torch.Tensor):
                raise self.wording.error(
                    self.wording.not_tensor(self.name, check.name, value, check.allowed)
                )
            if value.dtype not in check.allowed:
                wrong.append((check, value))
        if not wrong:
            return self.fn(*positional, **keyword)
        if policy == "reject":
            check, value = wrong[0]
            raise self.wording.error(
                self.wording.reject(self.name, check.name, value.dtype, check.allowed)
            )
        if policy == "warn":
            for check, value in wrong:
                # Frames: emit_once <- here <- generated wrapper <- the caller.
                self._warn("warn", check, value.dtype, stacklevel=3)
            return self.fn(*positional, **keyword)
        return self._call_on_copies(list(positional), dict(keyword), wrong)

    def _call_on_copies(
        self,
        positional: list[Any],
        keyword: dict[str, Any],
        wrong: list[tuple[_Located, torch.Tensor]],
    ) -> Any:
        for check, original in wrong:
            reason = metadata_refusal(original, check.allowed[0])
            if reason is not None:
                raise self._cast_refused(check, original, reason)
        copies: list[CastCopy] = []
        for check, original in wrong:
            target = check.allowed[0]
            copy = None
            for seen in copies:
                if seen.original is original and seen.converted.dtype == target:
                    copy = seen
            if copy is None:
                copy = make_copy(original, target)
                reason = narrowing_refusal(copy.base, copy.converted)
                if reason is not None:
                    raise self._cast_refused(check, original, reason)
                copies.append(copy)
            # Frames: emit_once <- here <- __call__ <- generated wrapper <- the caller.
            self._warn("cast", check, original.dtype, stacklevel=4)
            if check.index is not None:
                positional[check.index] = copy.given
            else:
                keyword[check.name] = copy.given
        try:
            result = self.fn(*positional, **keyword)
        except BaseException as error:
            # Without the guard the caller's tensor would hold whatever was written before the
            # error, so keep those writes too.
            _copy_back_after_failure(copies, error)
            raise
        late = runs_later(result)
        if late is not None:
            close_quietly(result)
            copy_back(copies)  # what the call itself wrote before returning
            check, original = wrong[0]
            raise self.wording.error(
                self.wording.late_result(
                    self.name, check.name, original.dtype, check.allowed[0], late
                )
            )
        copy_back(copies)
        return _caller_tensors_in(result, copies)

    def _cast_refused(
        self, check: _Located, original: torch.Tensor, reason: str
    ) -> DtypeGuardError:
        return self.wording.error(
            self.wording.cast_refused(
                self.name, check.name, original.dtype, check.allowed[0], reason
            )
        )

    def _warn(self, kind: str, check: _Located, got: torch.dtype, stacklevel: int) -> None:
        key = (self.serial, kind, self.wording.name, self.name, check.name, got, check.allowed)
        emit_once(key, stacklevel=stacklevel + 1)


def _copy_back_after_failure(copies: list[CastCopy], error: BaseException) -> None:
    try:
        copy_back(copies)
    except Exception as copy_error:
        if hasattr(error, "add_note"):  # Python >= 3.11
            error.add_note(
                "replaylint.guards could not copy the writes made before this error back into "
                f"the caller's tensor: {copy_error!r}"
            )


def _caller_tensors_in(result: Any, copies: list[CastCopy]) -> Any:
    """Hand back the caller's tensor where the function returned the copy it was given."""
    for copy in copies:
        if result is copy.given:
            return copy.original
    if type(result) is tuple or type(result) is list:
        items = list(result)
        replaced = False
        for position, item in enumerate(items):
            for copy in copies:
                if item is copy.given:
                    items[position] = copy.original
                    replaced = True
        if replaced:
            return type(result)(items)
    return result


def _body_runs_later(fn: object) -> bool:
    """A coroutine or generator function, also behind partials and a callable's ``__call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    candidates = [fn]
    if not (inspect.isroutine(fn) or isinstance(fn, type)):
        candidates.append(type(fn).__call__)
    return any(
        inspect.iscoroutinefunction(candidate)
        or inspect.isgeneratorfunction(candidate)
        or inspect.isasyncgenfunction(candidate)
        for candidate in candidates
    )


def _refuse_scripting(decorator: str, name: str) -> None:
    raise TypeError(
        f"torch.jit.script cannot keep the dtype guard of {name}() (@{decorator}): TorchScript "
        "compiles the undecorated function and would silently drop the check. Use "
        f"torch.compile instead (the guard compiles into the graph), or script "
        f"{name}.__wrapped__ and check the dtype before calling it."
    )


def _function_name(fn: Callable[..., Any]) -> str:
    """How messages name the guarded function: its qualified name, as users wrote it."""
    if isinstance(fn, functools.partial):
        return f"functools.partial({_function_name(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if isinstance(name, str):
        return name
    return type(fn).__qualname__  # a callable object
