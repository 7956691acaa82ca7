"""Torch's global dtype state where an allocation runs: who set the default dtype, to what.

An allocation without ``dtype=`` takes torch's default dtype, and code sets that default in two
ways: ``torch.set_default_dtype(torch.bfloat16)`` earlier in the function or at module level, and
a context manager around the allocation that sets and restores it (vLLM's
``set_default_torch_dtype(dtype)``, or any ``@contextmanager`` of the module that calls
``torch.set_default_dtype``). :func:`default_dtype_setting` finds the nearest such setting, so a
finding can say which line made the allocation bf16.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.facts import AddDtypeArgument, Allocation, DtypeFact, Kind, TensorFact
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.dataflow.torch_api import FLOAT32
from replaylint.lint.syntax.nodes import dotted_name, one_line, positional_args
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import syntax_children

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

SET_DEFAULT_DTYPE = "torch.set_default_dtype"


@dataclass(frozen=True)
class DefaultDtypeSetting:
    """A call that sets torch's default dtype before an allocation runs."""

    call: cst.Call
    dtypes: tuple[DtypeFact, ...]
    """What the call sets the default to (unknown facts when it cannot be read)."""
    context_manager: bool
    """``with <call>:`` around the allocation, rather than a call that ran before it."""


def default_dtype_setting(prov: Provenance, site: Site, env: Env) -> DefaultDtypeSetting | None:
    """The nearest setting of the default dtype that the statement at ``site`` runs under."""
    statement = site.statement
    if statement is None:
        return None
    for scope in reversed(site.scopes):
        if isinstance(scope, cst.ClassDef):
            continue
        for with_item in _enclosing_with_items(prov, scope, statement):
            if _sets_default_dtype(prov, with_item):
                return _setting(prov, with_item, site, env, context_manager=True)
        inner = scope is site.scopes[-1]
        for call in _calls_before(scope, statement if inner else None):
            if SET_DEFAULT_DTYPE in prov.index.qualified_names(call.func):
                return _setting(prov, call, site, env, context_manager=False)
    return None


_PLAIN = "torch's default dtype (model loaders set it to the model dtype)"


def default_dtype_fact(
    prov: Provenance, allocation: Allocation, site: Site, env: Env
) -> TensorFact:
    """The fact of an allocation without a dtype at ``site``: inherited where the default may
    be another dtype than float32, float32 (torch's own default) elsewhere."""
    call = allocation.call
    if not may_differ(prov, site, env):
        return TensorFact(Kind.FLOAT32, call, allocation=allocation, detail="torch's default dtype")
    return TensorFact(
        Kind.INHERITED,
        call,
        allocation=allocation,
        call=call,
        detail=default_dtype_detail(prov, site, env),
        target=AddDtypeArgument(call),
    )


def may_differ(prov: Provenance, site: Site, env: Env) -> bool:
    """Whether torch's default dtype may be other than float32 where ``site`` runs: under a
    setting not provably float32, in a class's code (model loaders build modules under the
    model dtype: ``from_pretrained(torch_dtype=...)``, vLLM's ``set_default_torch_dtype``), or
    in a function of the module that such code calls."""
    setting = default_dtype_setting(prov, site, env)
    if setting is not None and not all(f.is_float32 for f in setting.dtypes):
        return True
    function = next((s for s in reversed(site.scopes) if isinstance(s, cst.FunctionDef)), None)
    if function is not None and setting is None and _scopes_its_default(prov, function):
        return False  # the function sets the default only around other allocations
    if any(isinstance(scope, cst.ClassDef) for scope in site.scopes):
        return True
    if function is None:
        return False
    return any(
        _under_model_dtype(prov, call, env) for call in prov.index.calls_named(function.name.value)
    )


def _scopes_its_default(prov: Provenance, function: cst.FunctionDef) -> bool:
    """Whether ``function`` itself sets torch's default dtype for a ``with`` block (and the
    allocation asked about lies outside it): what it leaves outside runs under the default it
    restores."""
    return any(
        prov.within(node, function)
        and any(
            isinstance(item.item, cst.Call) and _sets_default_dtype(prov, item.item)
            for item in node.items
        )
        for node in prov.index.withs()
    )


def _under_model_dtype(prov: Provenance, call: cst.Call, env: Env) -> bool:
    """Whether ``call`` is in a class's code, after a ``torch.set_default_dtype`` in its
    function, or in the body of a ``with``, that sets the default dtype to one not provably
    float32."""
    if any(prov.within(call, cls) for cls in prov.index.classes()):
        return True
    if _non_float32_setting_at(prov, call, env) is not None:
        return True  # `torch.set_default_dtype(dtype)` earlier in the caller
    return any(
        prov.within(call, node.body)
        and any(
            isinstance(item.item, cst.Call)
            and _sets_default_dtype(prov, item.item)
            and not _sets_float32(prov, item.item)
            for item in node.items
        )
        for node in prov.index.withs()
    )


def _sets_float32(prov: Provenance, call: cst.Call) -> bool:
    args = positional_args(call)
    if not args:
        return False
    site = Site((prov.index.module,), None)
    return all(f.is_float32 for f in prov.dtype_facts(args[0].value, site))


def default_dtype_detail(prov: Provenance, site: Site, env: Env) -> str:
    """How a finding names the default dtype an allocation at ``site`` takes."""
    setting = default_dtype_setting(prov, site, env)
    suffix = ""
    if setting is None:
        caller = _caller_setting(prov, site, env)
        if caller is None:
            return _PLAIN
        setting, call = caller
        suffix = f" before it calls `{one_line(prov.index.module, call)}`"
    text = one_line(prov.index.module, setting.call)
    spelled = f"`with {text}`" if setting.context_manager else f"`{text}`"
    literals = sorted({f.dtype for f in setting.dtypes if f.dtype is not None})
    if literals and all(f.dtype is not None for f in setting.dtypes):
        if literals == [FLOAT32]:
            return _PLAIN  # float32 here, but another caller or loader may set it otherwise
        named = " or ".join(f"torch.{d}" for d in literals)
        return f"torch's default dtype, which {spelled} sets to {named}{suffix}"
    return (
        f"torch's default dtype, which {spelled} sets to a dtype that is not provably "
        f"float32{suffix}"
    )


def _caller_setting(
    prov: Provenance, site: Site, env: Env
) -> tuple[DefaultDtypeSetting, cst.Call] | None:
    """A call of the function around ``site``, after a setting of the default dtype in its
    own function, and that setting: the dtype the allocation takes when that call runs it."""
    function = next((s for s in reversed(site.scopes) if isinstance(s, cst.FunctionDef)), None)
    if function is None:
        return None
    for call in prov.index.calls_named(function.name.value):
        setting = _non_float32_setting_at(prov, call, env)
        if setting is not None:
            return setting, call
    return None


def _non_float32_setting_at(
    prov: Provenance, call: cst.Call, env: Env
) -> DefaultDtypeSetting | None:
    """The setting of the default dtype that ``call`` runs under, when it is not provably
    float32."""
    at = prov.index.call_sites().get(id(call))
    setting = None if at is None else default_dtype_setting(prov, at, env)
    return None if setting is None or all(f.is_float32 for f in setting.dtypes) else setting


def _setting(
    prov: Provenance, call: cst.Call, site: Site, env: Env, *, context_manager: bool
) -> DefaultDtypeSetting:
    args = positional_args(call)
    dtypes = prov.dtype_facts(args[0].value, site, env) if args else (DtypeFact(None, call),)
    return DefaultDtypeSetting(call, dtypes, context_manager)


def _enclosing_with_items(
    prov: Provenance, scope: cst.CSTNode, statement: cst.CSTNode
) -> Iterator[cst.Call]:
    """The calls of ``with`` items whose body holds ``statement``, innermost first."""
    found: list[cst.Call] = []
    stack: list[cst.CSTNode] = []
    if isinstance(scope, cst.Module):
        stack.extend(scope.body)
    elif isinstance(scope, cst.FunctionDef):
        stack.append(scope.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.BaseExpression)):
            continue
        if isinstance(node, cst.With) and prov.within(statement, node.body):
            found.extend(item.item for item in node.items if isinstance(item.item, cst.Call))
        stack.extend(syntax_children(node))
    yield from reversed(found)


def _sets_default_dtype(prov: Provenance, call: cst.Call) -> bool:
    """Whether ``with call:`` sets the default dtype: a name that says so, or a function of the
    module that calls ``torch.set_default_dtype``."""
    name = dotted_name(call.func) or ""
    last = name.rpartition(".")[2].lower()
    if "default" in last and "dtype" in last:
        return True
    if isinstance(call.func, cst.Name):
        for binding, _ in prov.lookup(call.func.value, Site((prov.index.module,), None)) or ():
            if binding.kind == "definition" and isinstance(binding.node, cst.FunctionDef):
                return any(
                    SET_DEFAULT_DTYPE in prov.index.qualified_names(inner.func)
                    for inner in _calls_before(binding.node, None)
                )
    return False


def _calls_before(scope: cst.CSTNode, statement: cst.CSTNode | None) -> Iterator[cst.Call]:
    """Calls of ``scope``'s own code in source order, up to ``statement`` (all when None),
    nearest first."""
    calls: list[cst.Call] = []

    def walk(node: cst.CSTNode) -> bool:
        if node is statement:
            return True
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and node is not scope:
            return False
        if isinstance(node, cst.Call):
            calls.append(node)
        return any(walk(child) for child in syntax_children(node))

    walk(scope)
    yield from reversed(calls)
