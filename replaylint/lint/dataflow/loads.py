"""Loads: tensors read from a checkpoint or a file, and numpy arrays that came from one.

A tensor read from disk has the dtype it was saved in, whatever the model runs in now: a gate
cache restored from a bf16 snapshot is bf16 unless it is cast on the way in.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow import callers
from replaylint.lint.dataflow.allocations import literal_dtype, method_receiver
from replaylint.lint.dataflow.facts import CastValue, Kind, TensorFact, all_not_floating
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.dataflow.scopes import Binding
from replaylint.lint.dataflow.strings import NO_ENV, Env
from replaylint.lint.dataflow.torch_api import (
    CHECKPOINT_SUFFIXES,
    FLOAT32,
    NUMPY_ARRAY_WRAPPERS,
    NUMPY_FLOAT32_NAMES,
    NUMPY_FLOAT32_STRINGS,
    NUMPY_LOADERS,
    NUMPY_ORIGIN_PRESERVING_METHODS,
    TORCH_BUFFER_READERS,
    TORCH_LOADERS,
)
from replaylint.lint.project.index import External, Found
from replaylint.lint.syntax.nodes import (
    keyword_arg,
    literal_string,
    method_name,
    one_line,
    positional_args,
)
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


def from_numpy_facts(
    prov: Provenance, call: cst.Call, site: Site, env: Env
) -> Iterator[TensorFact]:
    args = positional_args(call)
    if not args:
        yield TensorFact(Kind.UNKNOWN, call)
        return
    array = args[0].value
    numpy = _numpy_origin(prov, array, site, env)
    if numpy is None and is_loaded(prov, array, site, env):
        numpy = "loaded"  # an array of a pickled or saved payload: the dtype it was saved with
    if numpy == "float32":
        yield TensorFact(Kind.FLOAT32, call)
    elif numpy == "loaded":
        yield TensorFact(
            Kind.LOADED,
            call,
            call=call,
            detail="a numpy array read from a file",
            target=CastValue(call),
        )
    else:
        yield TensorFact(Kind.UNKNOWN, call)


def frombuffer_facts(
    prov: Provenance, call: cst.Call, site: Site, env: Env
) -> Iterator[TensorFact]:
    """``torch.frombuffer(raw, dtype=...)``, ``torch.from_file(path, size=n, dtype=...)``: raw
    bytes read as ``dtype``, which a fix must not change (the same bytes read as float32 are
    other numbers): cast the result instead."""
    dtype_arg = keyword_arg(call, "dtype")
    facts = prov.dtype_facts(dtype_arg.value, site, env) if dtype_arg is not None else ()
    if facts and all(f.is_float32 for f in facts):
        yield TensorFact(Kind.FLOAT32, call, dtypes=facts)
        return
    if facts and all_not_floating(facts):
        yield TensorFact(Kind.NOT_FLOATING, call, dtypes=facts)
        return
    read_as = (
        f"`{one_line(prov.index.module, dtype_arg.value)}`"
        if dtype_arg is not None
        else "torch's default dtype"
    )
    yield TensorFact(
        Kind.LOADED,
        call,
        call=call,
        dtypes=facts,
        detail=f"`{one_line(prov.index.module, call.func)}(...)`, raw bytes read as {read_as}",
        target=CastValue(call),
    )


def _numpy_origin(prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env) -> str | None:
    if isinstance(expr, cst.Subscript):
        return _numpy_origin(prov, expr.value, site, env)
    if isinstance(expr, cst.Call):
        names = prov.index.qualified_names(expr.func)
        if names & NUMPY_ARRAY_WRAPPERS:
            dtype = keyword_arg(expr, "dtype")
            if dtype is not None:
                return "float32" if _numpy_float32(prov, dtype.value) else None
            args = positional_args(expr)
            return _numpy_origin(prov, args[0].value, site, env) if args else None
        if names & NUMPY_LOADERS:
            dtype = keyword_arg(expr, "dtype")
            if dtype is not None and _numpy_float32(prov, dtype.value):
                return "float32"
            return "loaded"
        method = method_name(expr)
        if method == "astype" and expr.args:
            if _numpy_float32(prov, expr.args[0].value):
                return "float32"
            # an array read from a file, cast to a dtype not provably float32, is no better
            receiver = method_receiver(prov.index, expr)
            return _numpy_origin(prov, receiver, site, env) if receiver is not None else None
        receiver = method_receiver(prov.index, expr)
        if method in NUMPY_ORIGIN_PRESERVING_METHODS and receiver is not None:
            return _numpy_origin(prov, receiver, site, env)
        return None
    if isinstance(expr, cst.Name) and prov.enter():
        try:
            found = prov.lookup(expr.value, site, env) or []
            origins = {  # `with np.load(path) as dump:` binds the archive too
                _numpy_origin(prov, b.value, s, env)
                for b, s in found
                if b.kind in {"assign", "with"} and b.value is not None
            } | {  # `for name, array in np.load(path).items():` an entry of the archive
                _numpy_origin(prov, iterated, s, env)
                for b, s in found
                if b.kind == "loop" and (iterated := _iterated(b.statement, b.node)) is not None
            }
            if "loaded" in origins:
                return "loaded"
            if origins == {"float32"}:
                return "float32"
        finally:
            prov.leave()
    return None


def _numpy_float32(prov: Provenance, expr: cst.BaseExpression) -> bool:
    if literal_string(expr) in NUMPY_FLOAT32_STRINGS:
        return True
    return (
        bool(NUMPY_FLOAT32_NAMES & prov.index.qualified_names(expr))
        or literal_dtype(prov.index, expr) == FLOAT32
    )


_ALL_READERS = TORCH_LOADERS | NUMPY_LOADERS | TORCH_BUFFER_READERS


def is_loaded(prov: Provenance, expr: cst.BaseExpression, site: Site, env: Env = NO_ENV) -> bool:
    """Whether ``expr`` is (part of) a checkpoint read from disk."""
    if isinstance(expr, cst.Call):
        names = prov.index.qualified_names(expr.func)
        if names & (TORCH_LOADERS | NUMPY_LOADERS | TORCH_BUFFER_READERS):
            return True
        method = method_name(expr)
        receiver = method_receiver(prov.index, expr)
        if method in {"get", "pop"} and receiver is not None:
            return is_loaded(prov, receiver, site, env)
        return _module_loader(prov, expr, site) or _project_loader(prov, expr, site, env)
    if isinstance(expr, cst.Subscript):
        return is_loaded(prov, expr.value, site, env)
    if isinstance(expr, cst.Attribute):
        return checkpoint_name(expr.attr.value)
    if isinstance(expr, cst.Name):
        if not prov.enter():
            return False
        try:
            found = prov.lookup(expr.value, site, env)
            if not found:
                return checkpoint_name(expr.value)
            for binding, binding_site in found:
                if binding.kind == "param" and (
                    checkpoint_name(binding.name) or _passed_a_load(prov, binding)
                ):
                    return True
                if binding.value is not None and is_loaded(prov, binding.value, binding_site, env):
                    return True
                iterated = _iterated(binding.statement, binding.node)
                if iterated is not None and is_loaded(prov, iterated, binding_site, env):
                    return True  # `for name, entry in state["layers"].items():`
            return False
        finally:
            prov.leave()
    return False


def _passed_a_load(prov: Provenance, binding: Binding) -> bool:
    """Whether a call of the module passes a checkpoint for the parameter ``binding``."""
    values = callers.passed_values(prov, binding)
    return any(is_loaded(prov, value, where) for value, where in values or ())


def _module_loader(prov: Provenance, call: cst.Call, site: Site) -> bool:
    """``load_reference(path)`` with ``load_reference`` a function of the module that returns
    what it reads (``return torch.load(path, mmap=True)``)."""
    found = called_function(prov.index, prov, call, site)
    if found is None:
        return False
    function, scopes, _ = found
    returns = prov.index.scope(function).returns
    return bool(returns) and all(
        r.value is not None and is_loaded(prov, r.value, Site(scopes, statement))
        for r, statement in returns
    )


def _project_loader(prov: Provenance, call: cst.Call, site: Site, env: Env) -> bool:
    """``load_tensors(blob)`` with ``load_tensors`` a function of another project module that
    reads tensors (``torch.frombuffer``, ``torch.load`` ...) and casts none of them."""
    if prov.project is None:
        return False
    from replaylint.lint.dataflow.imported import MALFORMED
    from replaylint.lint.dataflow.summary_values import as_value

    try:
        value = as_value(prov, call, site, env)
        if value is None or value[1][0] != "ref":
            return False
        found = prov.project.resolve(str(value[1][2]))
        if not isinstance(found, Found) or found.definition[0] != "function":
            return False
        index = prov.project.index
        summary = index.summary(found.module)
        readers = (summary or {}).get("loaders", {}).get(found.name, ())
        for reader in readers:
            target = index.value_target(found.module, reader, (), 0)
            if isinstance(target, External) and target.name in _ALL_READERS:
                return True
    except MALFORMED:
        return False
    return False


def loaded_entry(
    prov: Provenance, found: Sequence[tuple[Binding, Site]], name: cst.Name, env: Env
) -> TensorFact | None:
    """``name`` bound (``found``) only by a loop over a checkpoint's entries (``for key, t in
    torch.load(path).items():``, ``state`` of ``state = torch.load(path)``): loaded."""
    if len(found) != 1 or found[0][0].kind != "loop":
        return None
    container = _iterated(found[0][0].statement, found[0][0].node)
    if container is None or not is_loaded(prov, container, found[0][1], env):
        return None
    detail = describe_load(prov.index, container)
    return TensorFact(Kind.LOADED, name, detail=detail, target=CastValue(name))


def _iterated(statement: cst.CSTNode, target: cst.CSTNode) -> cst.BaseExpression | None:
    """What a ``for`` loop's ``target`` takes its values from: the container for ``for v in c``
    and ``for v in c.values()``, and for the second name of ``for k, v in c.items()``."""
    if not isinstance(statement, cst.For):
        return None
    iterable = statement.iter
    if (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Attribute)
        and iterable.func.attr.value in {"values", "items", "keys"}
    ):
        method, container = iterable.func.attr.value, iterable.func.value
        if method == "values" and statement.target is target:
            return container
        if method == "items" and isinstance(statement.target, cst.Tuple):
            elements = statement.target.elements
            if len(elements) == 2 and elements[1].value is target:
                return container
        return None
    # `for layer in entry.pop("layers")`, `for t in blob`: the elements of what is iterated
    return iterable if statement.target is target else None


def checkpoint_name(name: str) -> bool:
    lowered = name.lower().lstrip("_")
    return lowered.endswith(CHECKPOINT_SUFFIXES)


def loader_name(names: set[str]) -> str:
    for name in sorted(names & TORCH_LOADERS):
        if name.endswith("from_dlpack"):
            return f"`{name}(...)`, a tensor another library or process made"
        return f"`{name}(...)`"
    return "a checkpoint"


def describe_load(index: ModuleIndex, container: cst.BaseExpression) -> str:
    return f"`{one_line(index.module, container)}` (a checkpoint)"
