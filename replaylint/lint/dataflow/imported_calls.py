"""Calls of allocation helpers, partials and lambdas that another module of the project defines.

``g_cache = alloc_ring(shape, torch.bfloat16)`` with ``alloc_ring`` imported: the helper's summary
says what it returns (``torch.zeros(shape, dtype=dtype, ...)``), and the call is evaluated with
its arguments bound (:mod:`.imported`). The fix stays at the call: the call's own dtype argument
(when the helper reads it once, as the allocation's dtype), ``dtype=torch.float32`` added for a
partial or a lambda whose ``dtype`` the call may pass, or a cast of the fresh tensor a helper with
a fixed dtype inside returns; the helper itself is never edited.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.facts import (
    AddDtypeArgument,
    CastValue,
    DtypeFact,
    Float32Target,
    Kind,
    SetDtype,
    TensorFact,
    decided,
)
from replaylint.lint.dataflow.imported import (
    MALFORMED,
    Context,
    Evaluation,
    Unknown,
    describe_origins,
)
from replaylint.lint.dataflow.strings import Env
from replaylint.lint.dataflow.summary_values import Here, as_value
from replaylint.lint.dataflow.torch_api import (
    CAST_METHODS,
    DTYPE_KEEPING_COPIES,
    NEW_METHODS,
    NON_FLOATING_DTYPES,
    PARTIALS,
    POSITIONAL_DTYPE,
    TORCH_FACTORIES,
    TORCH_LIKE_FACTORIES,
)
from replaylint.lint.project.index import External, Found, Origin
from replaylint.lint.project.summaries import Value
from replaylint.lint.syntax.nodes import keyword_arg, one_line
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def tensor_facts(
    prov: Provenance, call: cst.Call, site: Site, env: Env
) -> tuple[TensorFact, ...] | None:
    """What a call of a project's allocation helper, partial or lambda makes; None when the
    index does not say."""
    if prov.project is None:
        return None
    evaluation = Evaluation(prov, call)
    context = Context(prov.project.module)
    try:
        value = as_value(prov, call, site, env)
        if value is None:
            return None
        callee = evaluation.target(value[1], context)
        if not isinstance(callee, Found):
            return None
        return _made(evaluation, callee, value, context, call, site, env)
    except (Unknown, *MALFORMED):
        return None


def _made(
    evaluation: Evaluation,
    callee: Found,
    value: Value,
    context: Context,
    call: cst.Call,
    site: Site,
    env: Env,
) -> tuple[TensorFact, ...]:
    """An allocation helper's result, or a cast helper's: ``return tensor.to(dtype)``, also as
    ``tensor if tensor.dtype == dtype else tensor.to(dtype)`` (either branch may be taken), or a
    layout helper's: the tensor it rearranges."""
    definition = callee.definition
    if definition[0] != "function":
        return (_allocation(evaluation, callee, value, context, call, site, env),)
    result: Value = definition[3]
    if result[0] == "layout":  # `rearrange(t, "b n h d -> b h n d")`: the dtype of `t`
        _, inner = evaluation.called(callee, value[2], value[3], context)
        bound = inner.params.get(str(result[1]))
        if not isinstance(bound, Here):
            raise Unknown
        return tuple(evaluation.prov.tensor_facts(bound.expr, bound.site, bound.env))
    branches = [_kept(b) for b in (result[1] if result[0] == "either" else [result])]
    if not any(_is_cast(branch) for branch in branches):
        return (_allocation(evaluation, callee, value, context, call, site, env),)
    _, inner = evaluation.called(callee, value[2], value[3], context)
    if result[0] == "either":  # `if dtype is None: return t` of a call passing a dtype
        branches = [_kept(b) for b in evaluation.possible(result, inner)]
    if result[0] == "either" and len(result) > 2 and result[2]:
        # `t if t.dtype == dtype else t.to(dtype)`: the tensor is returned as it is only when
        # it has the dtype already, so the result has the cast's dtype either way
        branches = [branch for branch in branches if branch[0] != "param"]
    facts: list[TensorFact] = []
    for branch in branches:
        if branch[0] == "param":  # the tensor passed, as it is
            bound = inner.params.get(str(branch[1]))
            if not isinstance(bound, Here):
                raise Unknown
            facts += evaluation.prov.tensor_facts(bound.expr, bound.site, bound.env)
        elif _is_cast(branch):
            facts.append(_cast(evaluation, callee, branch, inner, call))
        else:
            raise Unknown
    return tuple(dict.fromkeys(facts))


# the floating casts of `CAST_METHODS` (`.half()`, `.float()` ...): what a cast helper may return
_CAST_METHODS = {m: d for m, d in CAST_METHODS.items() if d not in NON_FLOATING_DTYPES}


def _kept(value: Value) -> Value:
    """``value`` less the dtype-keeping methods called on it (``param.detach().clone()`` is
    ``param``; ``param.detach().to(dtype)`` is ``param.to(dtype)``)."""
    if value[0] != "call" or value[1][0] != "attr":
        return value
    receiver, method = value[1][1], value[1][2]
    if method in DTYPE_KEEPING_COPIES and not any(k == "dtype" for k, _ in value[3]):
        return _kept(receiver)
    inner = _kept(receiver)
    return value if inner is receiver else ["call", ["attr", inner, method], value[2], value[3]]


def _is_cast(value: Value) -> bool:
    """``<param>.to(...)``, ``<param>.half()`` and the like, in a summary."""
    return (
        value[0] == "call"
        and value[1][0] == "attr"
        and value[1][1][0] == "param"
        and (value[1][2] == "to" or value[1][2] in _CAST_METHODS)
    )


def _cast(
    evaluation: Evaluation, callee: Found, cast: Value, inner: Context, call: cst.Call
) -> TensorFact:
    """The fact of a cast helper's cast: its dtype is the caller's argument (fixed there, by
    passing float32) or the helper's own."""
    prov = evaluation.prov
    method = str(cast[1][2])
    helper = one_line(prov.index.module, call.func)
    detail = f"`{helper}(...)` ({describe_origins(callee.origins)[5:]})"
    if method in _CAST_METHODS:
        dtypes = (DtypeFact(_CAST_METHODS[method], call),)
        kind = Kind.FLOAT32 if method == "float" else Kind.CAST
        return TensorFact(kind, call, dtypes=dtypes, call=call, detail=detail)
    arguments = [*cast[2], *(v for k, v in cast[3] if k == "dtype")]
    dtype = next((a for a in arguments if a[0] == "param"), arguments[0] if arguments else None)
    if dtype is None:
        raise Unknown
    if dtype[0] == "param":
        bound = inner.params.get(str(dtype[1]))
        if not isinstance(bound, Here):
            raise Unknown
        facts = prov.dtype_facts(bound.expr, bound.site, bound.env)
        if facts and all(f.is_float32 for f in facts):
            return TensorFact(Kind.FLOAT32, call, dtypes=facts)
        # the helper's one result is the cast: float32 passed here makes it float32
        target = SetDtype(bound.expr)
        return TensorFact(Kind.CAST, call, dtypes=facts, call=call, detail=detail, target=target)
    facts = tuple(evaluation.dtypes(dtype, inner))
    if facts and all(f.is_float32 for f in facts):
        return TensorFact(Kind.FLOAT32, call, dtypes=facts)
    return TensorFact(Kind.CAST, call, dtypes=facts, call=call, detail=detail)


def _allocation(
    evaluation: Evaluation,
    callee: Found,
    value: Value,
    context: Context,
    call: cst.Call,
    site: Site,
    env: Env,
) -> TensorFact:
    prov = evaluation.prov
    definition = callee.definition
    made = definition[2] if definition[0] == "value" else None
    if made is not None and made[0] == "call":  # `alloc = functools.partial(torch.zeros, ...)`
        maker = evaluation.target(made[1], Context(callee.module))
        if not (isinstance(maker, External) and maker.name in PARTIALS) or not made[2]:
            raise Unknown
        _factory(evaluation, made[2][0], Context(callee.module))
        own = keyword_arg(call, "dtype")
        if own is not None:  # the call's own dtype wins
            facts = prov.dtype_facts(own.value, site, env)
            return _decided(facts, own.value, SetDtype(own.value), here=True)
        dtype = dict((str(k), v) for k, v in made[3]).get("dtype")
        if dtype is None:
            return _inherited(prov, call, site, env, AddDtypeArgument(call), callee.origins)
        facts = tuple(evaluation.dtypes(dtype, Context(callee.module, origins=callee.origins)))
        return _decided(facts, call, AddDtypeArgument(call), here=False)
    result, inner = evaluation.called(callee, value[2], value[3], context)
    if result[0] != "call":
        raise Unknown
    dtype = dict((str(k), v) for k, v in result[3]).get("dtype")
    method = result[1]
    if (  # `return ref.new_zeros(shape)`: the tensor passed gives the dtype
        dtype is None
        and method[0] == "attr"
        and method[1][0] == "param"
        and method[2] in NEW_METHODS
    ):
        bound = inner.params.get(str(method[1][1]))
        if not isinstance(bound, Here):
            raise Unknown
        return _like(prov, call, bound)
    factory = _factory(evaluation, result[1], inner, like=True)
    reference = _reference(factory, result, dtype)
    if reference is not None:
        bound = inner.params.get(reference)
        if not isinstance(bound, Here):
            raise Unknown
        return _like(prov, call, bound)
    if dtype is None and factory in POSITIONAL_DTYPE and len(result[2]) > POSITIONAL_DTYPE[factory]:
        dtype = result[2][POSITIONAL_DTYPE[factory]]
    if dtype is None:
        return _inherited(prov, call, site, env, CastValue(call), callee.origins)
    if dtype[0] == "param":
        bound = inner.params.get(str(dtype[1]))
        if isinstance(bound, Here):  # the caller's own argument decides
            facts = prov.dtype_facts(bound.expr, bound.site, bound.env)
            once = _occurrences(result, str(dtype[1])) == 1
            return _decided(facts, bound.expr, SetDtype(bound.expr) if once else None, here=True)
        if bound is not None and dtype[1] == "dtype" and _keyword_parameter(callee, "dtype"):
            facts = tuple(evaluation.dtypes(dtype, inner))
            return _decided(facts, call, AddDtypeArgument(call), here=False)
    facts = tuple(evaluation.dtypes(dtype, inner))
    return _decided(facts, call, CastValue(call), here=False)


def _factory(evaluation: Evaluation, value: Value, context: Context, *, like: bool = False) -> str:
    """The torch factory a project value names (``torch.zeros``), or :class:`Unknown`."""
    target = evaluation.target(value, context)
    if not (
        isinstance(target, External)
        and (target.name in TORCH_FACTORIES or (like and target.name in TORCH_LIKE_FACTORIES))
    ):
        raise Unknown
    return target.name


def _decided(
    facts: tuple[DtypeFact, ...],
    node: cst.BaseExpression,
    target: Float32Target | None,
    *,
    here: bool,
) -> TensorFact:
    """The fact of an allocation whose dtype is one of ``facts``: a dtype written in the module
    under analysis (``here``) may stay unknown (RL002's question); one read from the project
    must be certain."""
    if not facts:
        raise Unknown
    fact = decided(facts, node, target)
    uncertain = any(f.dtype is None for f in facts)
    if uncertain and not here and fact.kind in {Kind.EXPLICIT, Kind.VARIABLE}:
        raise Unknown
    return fact


def _inherited(
    prov: Provenance,
    call: cst.Call,
    site: Site,
    env: Env,
    target: Float32Target,
    origins: tuple[Origin, ...] = (),
) -> TensorFact:
    from replaylint.lint.dataflow.defaults import default_dtype_detail

    detail = default_dtype_detail(prov, site, env)
    if origins:
        detail = f"made by {describe_origins(origins)[5:]} without a dtype, so it has {detail}"
    return TensorFact(Kind.INHERITED, call, call=call, detail=detail, target=target)


def _reference(factory: str, result: Value, dtype: Value | None) -> str | None:
    """The parameter whose tensor gives the helper's result its dtype: ``dtype=ref.dtype``,
    ``torch.zeros_like(ref)`` without a dtype; None otherwise."""
    if dtype is not None:
        if dtype[0] == "attr" and dtype[2] == "dtype" and dtype[1][0] == "param":
            return str(dtype[1][1])
        return None
    if factory.endswith("_like") and result[2] and result[2][0][0] == "param":
        return str(result[2][0][1])
    return None


def _like(prov: Provenance, call: cst.Call, bound: Here) -> TensorFact:
    """A helper's result in the dtype of the tensor the call passes (``bound``): what that
    tensor is when it is float32 or not floating; inherited from it otherwise. The helper takes
    no dtype to set, so the fix casts the result."""
    source = prov.tensor_facts(bound.expr, bound.site, bound.env)
    if prov.all_float32(source):
        return TensorFact(Kind.FLOAT32, call)
    if source and all(f.kind is Kind.NOT_FLOATING for f in source):
        return TensorFact(Kind.NOT_FLOATING, call)
    helper = one_line(prov.index.module, call.func)
    described = one_line(prov.index.module, bound.expr)
    return TensorFact(
        Kind.INHERITED,
        call,
        call=call,
        detail=f"allocated by `{helper}` in the dtype of `{described}`",
        target=CastValue(call),
    )


def _occurrences(value: object, param: str) -> int:
    """How often ``["param", param]`` is read in a summary value."""
    if isinstance(value, list):
        if len(value) == 2 and value[0] == "param" and value[1] == param:
            return 1
        return sum(_occurrences(item, param) for item in value)
    return 0


def _keyword_parameter(callee: Found, name: str) -> bool:
    """Whether the function or lambda takes ``name`` by keyword (``dtype=`` can be added)."""
    definition = callee.definition
    params = definition[2] if definition[0] == "function" else definition[2][1]
    return any(p[0] == name and p[1] in {"pos", "kw"} for p in params)


def layout_argument(prov: Provenance, call: cst.Call, site: Site) -> cst.BaseExpression | None:
    """The argument a project function that only rearranges one parameter (``rearrange(t,
    pattern)`` of ``.utils``, :mod:`replaylint.lint.project.layout_functions`) is called with
    for it: what the call's result has the dtype of; None for any other call."""
    if prov.project is None:
        return None
    try:
        value = as_value(prov, call, site, {})
        if value is None:
            return None
        callee = Evaluation(prov, call).target(value[1], Context(prov.project.module))
    except (Unknown, *MALFORMED):
        return None
    if not isinstance(callee, Found) or callee.definition[0] != "function":
        return None
    result = callee.definition[3]
    if result[0] != "layout":
        return None
    params = [str(p[0]) for p in callee.definition[2]]
    wanted = str(result[1])
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == wanted:
            return arg.value
    position = params.index(wanted) if wanted in params else None
    positional = [a for a in call.args if a.keyword is None]
    if position is None or any(a.star for a in positional[: position + 1]):
        return None
    return positional[position].value if position < len(positional) else None
