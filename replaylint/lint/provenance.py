"""What dtype an expression provably has, and which line made it so.

Two questions, asked at a :class:`~replaylint.lint.scopes.Site`:

* :meth:`Provenance.dtype_facts` — for an expression used as a dtype (``dtype=ring_dtype``): the
  literal dtypes it may be, or that it is not known, following local bindings
  (``ring_dtype = torch.bfloat16``), conditionals and ``x.dtype`` of tensors whose dtype is known.
* :meth:`Provenance.tensor_facts` — for an expression whose value is a tensor: how its dtype was
  decided. Each :class:`TensorFact` is one way it may have been made (a conditional gives two):
  allocated with a literal dtype (``EXPLICIT``) or a non-literal one (``VARIABLE``), allocated
  without a dtype so it inherits one (``INHERITED``), cast (``CAST``), loaded from a checkpoint
  (``LOADED``), provably float32, or unknown.

Tensors named like gate caches that are not bound in the function (parameters, attributes such as
``self.g_cache``, ``caches["g_cache"]``) count as float32: each is checked where it is bound, so a
copy or ``zeros_like`` of one is not reported a second time.

``env`` maps loop variables to the string they hold in one iteration (RL006 evaluates the body of
``for name in ("d_cache", "g_cache")`` once per gate-cache name); conditions on them
(``torch.float32 if name == "g_cache" else dtype``) are then decided statically.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import libcst as cst

from replaylint.lint.analysis import (
    Allocation,
    as_allocation,
    binding_name,
    call_names,
    keyword_arg,
    literal_dtype,
    literal_string,
    method_name,
    method_receiver,
    positional_args,
    string_key,
)
from replaylint.lint.context import FileContext
from replaylint.lint.dtypes import CAST_METHODS, FLOAT32
from replaylint.lint.scopes import Binding, GuardEvaluator, Site

__all__ = ["DtypeFact", "Kind", "Provenance", "Rewrite", "TensorFact"]

Env = Mapping[str, str]
_NO_ENV: Env = {}
_MAX_DEPTH = 12

_DTYPE_PRESERVING_WRAPPERS = frozenset(
    {"torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Buffer"}
)
_DTYPE_PRESERVING_METHODS = frozenset(
    {
        "contiguous", "cpu", "cuda", "detach", "detach_", "expand", "expand_as", "fill_",
        "flatten", "narrow", "permute", "pin_memory", "repeat", "requires_grad_", "reshape",
        "share_memory_", "squeeze", "t", "transpose", "unsqueeze", "view", "view_as", "zero_",
        "normal_", "uniform_", "copy_", "unflatten", "movedim", "select", "index_select",
        "split", "chunk", "unbind", "roll", "flip", "masked_fill", "masked_fill_", "index_fill_",
    }
)  # fmt: skip
_DTYPE_PRESERVING_ATTRIBUTES = frozenset({"data", "T", "mT", "H", "mH"})
_TORCH_LOADERS = frozenset(
    {
        "torch.load",
        "torch.serialization.load",
        "safetensors.torch.load_file",
        "safetensors.torch.load",
    }
)
_NUMPY_LOADERS = frozenset(
    {
        "numpy.load",
        "numpy.fromfile",
        "numpy.frombuffer",
        "numpy.memmap",
        "numpy.lib.format.open_memmap",
    }
)
# Names of parameters and attributes that hold a checkpoint's contents.
_CHECKPOINT_SUFFIXES = ("state_dict", "checkpoint", "ckpt")
# Legacy tensor type names (``x.type("torch.cuda.HalfTensor")``) and the dtype they mean.
_TENSOR_TYPE_DTYPES = {
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "DoubleTensor": "float64",
    "ByteTensor": "uint8",
    "CharTensor": "int8",
    "ShortTensor": "int16",
    "IntTensor": "int32",
    "LongTensor": "int64",
    "BoolTensor": "bool",
}
_TENSOR_ANNOTATIONS = frozenset({"torch.Tensor", "Tensor", "torch.nn.Parameter", "nn.Parameter"})
_DEVICE_ANNOTATIONS = frozenset({"torch.device", "device", "str", "int"})
_DTYPE_ANNOTATIONS = frozenset({"torch.dtype", "dtype"})


@dataclass(frozen=True)
class DtypeFact:
    """One dtype an expression may denote: a literal one, or ``dtype=None`` when not known."""

    dtype: str | None
    node: cst.BaseExpression
    """The expression the dtype was read from (the literal, or the unknown expression)."""
    binding: Binding | None = None
    """The local binding the dtype came through, if any (``ring_dtype = ...``)."""
    parameter: str | None = None
    """Set when the dtype is a parameter of the function being analysed."""

    @property
    def is_float32(self) -> bool:
        return self.dtype == FLOAT32


class Kind(enum.Enum):
    FLOAT32 = "float32"
    EXPLICIT = "explicit"
    """Allocated with a dtype that is (or may be) a literal other than float32."""
    VARIABLE = "variable"
    """Allocated with a dtype expression that is not provably float32."""
    INHERITED = "inherited"
    """Allocated without a dtype: torch's default dtype, or another tensor's dtype."""
    CAST = "cast"
    """Cast to a dtype that is not provably float32."""
    LOADED = "loaded"
    """Loaded from a checkpoint or file without a cast."""
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Rewrite:
    """The edit that makes a fact float32: replace ``node`` by float32 spelled a certain way."""

    node: cst.CSTNode
    style: str
    """``dtype`` (``torch.float32``), ``method`` (``float``), ``device_and_dtype``
    (``other.device, torch.float32``), ``text`` (``text`` verbatim), ``kwargs``
    (``{**kw, "dtype": torch.float32}``)."""
    text: str = ""


@dataclass(frozen=True)
class TensorFact:
    kind: Kind
    node: cst.CSTNode
    """What a finding about this fact points at."""
    dtypes: tuple[DtypeFact, ...] = ()
    allocation: Allocation | None = None
    call: cst.Call | None = None
    """The cast, clone or load call."""
    detail: str = ""
    rewrite: Rewrite | None = None
    via: tuple[Binding, ...] = ()
    """Local tensor bindings followed to reach the fact, nearest first."""
    uses: tuple[cst.Name, ...] = ()
    """The name read at each step of ``via`` (``ring`` in ``self.g_cache = ring``)."""

    @property
    def literal_dtypes(self) -> tuple[str, ...]:
        return tuple(sorted({d.dtype for d in self.dtypes if d.dtype is not None}))

    @property
    def non_float32_literals(self) -> tuple[str, ...]:
        return tuple(d for d in self.literal_dtypes if d != FLOAT32)

    def followed(self, binding: Binding, use: cst.Name) -> TensorFact:
        return replace(self, via=(binding, *self.via), uses=(use, *self.uses))


@dataclass
class Provenance:
    """Answers dtype questions about the expressions of one file."""

    context: FileContext
    _depth: int = field(default=0)
    _memo: dict[tuple[int, int, tuple[tuple[str, str], ...]], tuple[TensorFact, ...]] = field(
        default_factory=dict
    )

    # ----------------------------------------------------------------------------- lookups
    def lookup(
        self, name: str, site: Site, env: Env = _NO_ENV
    ) -> list[tuple[Binding, Site]] | None:
        """Bindings of ``name`` that may reach ``site``, each with the site of its statement."""
        guard = self._guard_evaluator(site, env)
        scopes = site.scopes
        found = self.context.scope(scopes[-1]).reaching(name, site.statement, guard)
        if found is not None:
            return [(b, Site(scopes, b.statement)) for b in found]
        for index in range(len(scopes) - 2, -1, -1):
            outer = scopes[index]
            if isinstance(outer, cst.ClassDef):
                continue  # class bodies are not visible from their methods
            found = self.context.scope(outer).reaching(name, None, guard)
            if found is not None:
                return [(b, Site(scopes[: index + 1], b.statement)) for b in found]
        return None

    def _guard_evaluator(self, site: Site, env: Env) -> GuardEvaluator | None:
        if not env:
            return None

        def evaluate(test: cst.BaseExpression) -> bool | None:
            return self.condition(test, site, env)

        return evaluate

    # ----------------------------------------------------------------------------- strings
    def string_value(self, expr: cst.BaseExpression, site: Site, env: Env = _NO_ENV) -> str | None:
        """The string ``expr`` provably holds (literals, loop variables, f-strings, constants)."""
        if isinstance(expr, cst.SimpleString):
            return literal_string(expr)
        if isinstance(expr, cst.Name):
            if expr.value in env:
                return env[expr.value]
            # Looked up without ``env``: pruning branches by conditions would evaluate more
            # strings, and a condition on the name itself would never end.
            found = self.lookup(expr.value, site)
            if found and len(found) == 1 and found[0][0].value is not None:
                binding, binding_site = found[0]
                if binding.kind == "assign" and self._enter():
                    try:
                        assert binding.value is not None
                        return self.string_value(binding.value, binding_site, env)
                    finally:
                        self._leave()
            return None
        if isinstance(expr, cst.FormattedString):
            parts: list[str] = []
            for part in expr.parts:
                if isinstance(part, cst.FormattedStringText):
                    parts.append(part.value)
                elif isinstance(part, cst.FormattedStringExpression) and (
                    part.format_spec is None and part.conversion is None
                ):
                    value = self.string_value(part.expression, site, env)
                    if value is None:
                        return None
                    parts.append(value)
                else:
                    return None
            return "".join(parts)
        if isinstance(expr, cst.ConcatenatedString):
            left = self.string_value(expr.left, site, env)
            right = self.string_value(expr.right, site, env)
            return None if left is None or right is None else left + right
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            left = self.string_value(expr.left, site, env)
            right = self.string_value(expr.right, site, env)
            return None if left is None or right is None else left + right
        return None

    def condition(self, test: cst.BaseExpression, site: Site, env: Env) -> bool | None:
        """The value of a condition on loop-variable strings, when it is decided by ``env``."""
        if not env or not self._enter():
            return None
        try:
            return self._condition(test, site, env)
        finally:
            self._leave()

    def _condition(self, test: cst.BaseExpression, site: Site, env: Env) -> bool | None:
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            inner = self.condition(test.expression, site, env)
            return None if inner is None else not inner
        if isinstance(test, cst.BooleanOperation):
            first = self.condition(test.left, site, env)
            second = self.condition(test.right, site, env)
            if isinstance(test.operator, cst.And):
                if first is False or second is False:
                    return False
                return True if first and second else None
            if first is True or second is True:
                return True
            return False if first is False and second is False else None
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            comparison = test.comparisons[0]
            left = self.string_value(test.left, site, env)
            operator = comparison.operator
            if isinstance(operator, (cst.In, cst.NotIn)):
                if left is None:
                    return None
                options = self._string_options(comparison.comparator, site, env)
                if options is None:
                    right = self.string_value(comparison.comparator, site, env)
                    if right is None:
                        return None
                    contained = left in right
                else:
                    contained = left in options
                return contained if isinstance(operator, cst.In) else not contained
            right = self.string_value(comparison.comparator, site, env)
            if left is None or right is None:
                return None
            if isinstance(operator, cst.Equal):
                return left == right
            if isinstance(operator, cst.NotEqual):
                return left != right
            return None
        if isinstance(test, cst.Call) and isinstance(test.func, cst.Attribute):
            method = test.func.attr.value
            args = positional_args(test)
            if method in {"startswith", "endswith"} and len(args) == 1:
                subject = self.string_value(test.func.value, site, env)
                options = self._string_options(args[0].value, site, env)
                if options is None:
                    single = self.string_value(args[0].value, site, env)
                    options = None if single is None else (single,)
                if subject is None or options is None:
                    return None
                check = subject.startswith if method == "startswith" else subject.endswith
                return check(tuple(options))
        return None

    def _string_options(
        self, expr: cst.BaseExpression, site: Site, env: Env
    ) -> tuple[str, ...] | None:
        if isinstance(expr, (cst.Tuple, cst.List, cst.Set)):
            values = [self.string_value(e.value, site, env) for e in expr.elements]
            if any(v is None for v in values):
                return None
            return tuple(v for v in values if v is not None)
        return None

    # ------------------------------------------------------------------------------ dtypes
    def dtype_facts(
        self, expr: cst.BaseExpression, site: Site, env: Env = _NO_ENV
    ) -> tuple[DtypeFact, ...]:
        """The dtypes ``expr`` may denote (one unknown fact when it cannot be decided)."""
        literal = literal_dtype(self.context, expr)
        if literal is not None:
            return (DtypeFact(literal, expr),)
        if not self._enter():
            return (DtypeFact(None, expr),)
        try:
            return self._dtype_facts(expr, site, env)
        finally:
            self._leave()

    def _dtype_facts(self, expr: cst.BaseExpression, site: Site, env: Env) -> tuple[DtypeFact, ...]:
        if isinstance(expr, cst.IfExp):
            decided = self.condition(expr.test, site, env)
            if decided is True:
                return self.dtype_facts(expr.body, site, env)
            if decided is False:
                return self.dtype_facts(expr.orelse, site, env)
            return self.dtype_facts(expr.body, site, env) + self.dtype_facts(expr.orelse, site, env)
        if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.Or):
            # `dtype or self.dtype`: either operand
            return self.dtype_facts(expr.left, site, env) + self.dtype_facts(expr.right, site, env)
        if isinstance(expr, cst.Name) and expr.value not in env:
            found = self.lookup(expr.value, site, env)
            if not found:
                return (DtypeFact(None, expr),)
            facts: list[DtypeFact] = []
            for binding, binding_site in found:
                if binding.kind == "param":
                    facts.append(DtypeFact(None, expr, binding, parameter=binding.name))
                elif binding.kind == "assign" and binding.value is not None:
                    for fact in self.dtype_facts(binding.value, binding_site, env):
                        facts.append(DtypeFact(fact.dtype, fact.node, binding, fact.parameter))
                else:
                    facts.append(DtypeFact(None, expr, binding))
            return tuple(facts)
        if isinstance(expr, cst.Attribute) and expr.attr.value == "dtype":
            tensor = self.tensor_facts(expr.value, site, env)
            dtypes = [_definite_dtype(fact) for fact in tensor]
            if tensor and all(d is not None for d in dtypes):
                return tuple(DtypeFact(d, expr) for d in dtypes)
            return (DtypeFact(None, expr),)
        if isinstance(expr, cst.Subscript):
            mapping, mapping_site = self._dict_literal(expr.value, site, env)
            if mapping is not None:
                entry = self._dict_entry(mapping, expr, site, env)
                if entry is not None:
                    return self.dtype_facts(entry, mapping_site, env)
        return (DtypeFact(None, expr),)

    def _dict_literal(
        self, expr: cst.BaseExpression, site: Site, env: Env
    ) -> tuple[cst.Dict | None, Site]:
        """A dict literal, directly or through a local or module constant bound once."""
        if isinstance(expr, cst.Dict):
            return expr, site
        if isinstance(expr, cst.Name):
            found = self.lookup(expr.value, site, env)
            if found and len(found) == 1 and isinstance(found[0][0].value, cst.Dict):
                return found[0][0].value, found[0][1]
        return None, site

    def _dict_entry(
        self, mapping: cst.Dict, subscript: cst.Subscript, site: Site, env: Env
    ) -> cst.BaseExpression | None:
        """``{"g_cache": torch.float32, ...}[name]`` with ``name`` known from ``env``."""
        if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
            return None
        key = self.string_value(subscript.slice[0].slice.value, site, env)
        if key is None:
            return None
        for element in mapping.elements:
            if isinstance(element, cst.DictElement) and literal_string(element.key) == key:
                return element.value
        return None

    # ----------------------------------------------------------------------------- tensors
    def tensor_facts(
        self, expr: cst.BaseExpression, site: Site, env: Env = _NO_ENV
    ) -> tuple[TensorFact, ...]:
        """How ``expr``'s dtype was decided, one fact per way it may have been made."""
        key = (id(expr), id(site.statement), tuple(sorted(env.items())))
        if self._depth == 0 and key in self._memo:
            return self._memo[key]
        if not self._enter():
            return (TensorFact(Kind.UNKNOWN, expr),)
        try:
            facts = tuple(self._tensor_facts(expr, site, env))
        finally:
            self._leave()
        if self._depth == 0:
            self._memo[key] = facts
        return facts

    def _tensor_facts(self, expr: cst.BaseExpression, site: Site, env: Env) -> Iterator[TensorFact]:
        context = self.context
        if isinstance(expr, cst.IfExp):
            decided = self.condition(expr.test, site, env)
            if decided is not False:
                yield from self.tensor_facts(expr.body, site, env)
            if decided is not True:
                yield from self.tensor_facts(expr.orelse, site, env)
            return
        if isinstance(expr, cst.Name):
            if expr.value == "None":
                return
            yield from self._name_facts(expr, site, env)
            return
        if isinstance(expr, cst.Attribute):
            if expr.attr.value in _DTYPE_PRESERVING_ATTRIBUTES:
                yield from self.tensor_facts(expr.value, site, env)
            elif context.gate_caches.matches(expr.attr.value):
                yield TensorFact(Kind.FLOAT32, expr, detail="a gate cache")
            else:
                yield TensorFact(Kind.UNKNOWN, expr)
            return
        if isinstance(expr, cst.Subscript):
            yield from self._subscript_facts(expr, site, env)
            return
        if isinstance(expr, cst.Call):
            yield from self._call_facts(expr, site, env)
            return
        # Per-layer rings: `g_caches = [torch.zeros(...) for _ in range(layers)]`.
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp)):
            yield from self.tensor_facts(expr.elt, site, env)
            return
        if isinstance(expr, cst.DictComp):
            yield from self.tensor_facts(expr.value, site, env)
            return
        if isinstance(expr, (cst.List, cst.Tuple)) and expr.elements:
            for element in expr.elements:
                if not isinstance(element, cst.StarredElement):
                    yield from self.tensor_facts(element.value, site, env)
            return
        yield TensorFact(Kind.UNKNOWN, expr)

    def _name_facts(self, expr: cst.Name, site: Site, env: Env) -> Iterator[TensorFact]:
        found = self.lookup(expr.value, site, env)
        assigned = [
            (b, s) for b, s in (found or ()) if b.kind in {"assign", "with"} and b.value is not None
        ]
        if found and len(assigned) == len(found):
            for binding, binding_site in assigned:
                assert binding.value is not None
                for fact in self.tensor_facts(binding.value, binding_site, env):
                    yield fact.followed(binding, expr)
            return
        if self.context.gate_caches.matches(expr.value):
            yield TensorFact(Kind.FLOAT32, expr, detail="a gate cache")
            return
        for binding, binding_site in assigned:
            assert binding.value is not None
            for fact in self.tensor_facts(binding.value, binding_site, env):
                yield fact.followed(binding, expr)
        yield TensorFact(Kind.UNKNOWN, expr)

    def _subscript_facts(self, expr: cst.Subscript, site: Site, env: Env) -> Iterator[TensorFact]:
        key = self._subscript_key(expr, site, env)
        if self.is_loaded(expr.value, site, env):
            yield TensorFact(Kind.LOADED, expr, detail=_describe_load(self.context, expr.value))
            return
        if key is not None:
            if self.context.gate_caches.matches(key):
                yield TensorFact(Kind.FLOAT32, expr, detail="a gate cache")
            else:
                yield TensorFact(Kind.UNKNOWN, expr)
            return
        # Indexing or slicing a tensor keeps its dtype.
        yield from self.tensor_facts(expr.value, site, env)

    def _subscript_key(self, expr: cst.Subscript, site: Site, env: Env) -> str | None:
        key = string_key(expr)
        if key is not None or len(expr.slice) != 1:
            return key
        index = expr.slice[0].slice
        if isinstance(index, cst.Index) and env:
            return self.string_value(index.value, site, env)
        return None

    def _call_facts(self, call: cst.Call, site: Site, env: Env) -> Iterator[TensorFact]:
        context = self.context
        names = call_names(context, call)
        if names & _DTYPE_PRESERVING_WRAPPERS:
            positional = positional_args(call)
            data = positional[0] if positional else keyword_arg(call, "data")
            if data is not None:
                yield from self.tensor_facts(data.value, site, env)
                return
        if names & _TORCH_LOADERS:
            yield TensorFact(Kind.LOADED, call, call=call, detail=_loader_name(names))
            return
        if "torch.from_numpy" in names:
            yield from self._from_numpy(call, site, env)
            return
        if "getattr" in names or (isinstance(call.func, cst.Name) and call.func.value == "getattr"):
            args = positional_args(call)
            if len(args) >= 2:
                attribute = self.string_value(args[1].value, site, env)
                if attribute is not None and context.gate_caches.matches(attribute):
                    yield TensorFact(Kind.FLOAT32, call, detail="a gate cache")
                    return
            yield TensorFact(Kind.UNKNOWN, call)
            return
        allocation = as_allocation(context, call)
        if allocation is not None:
            yield from self._allocation_facts(allocation, site, env)
            return
        method = method_name(call)
        receiver = method_receiver(context, call)
        if method is None or receiver is None:
            yield TensorFact(Kind.UNKNOWN, call)
            return
        if method in CAST_METHODS:
            dtype = CAST_METHODS[method]
            assert isinstance(call.func, cst.Attribute)
            if dtype == FLOAT32:
                yield TensorFact(Kind.FLOAT32, call, detail="`.float()`")
            else:
                yield TensorFact(
                    Kind.CAST,
                    call.func.attr,
                    call=call,
                    dtypes=(DtypeFact(dtype, call.func.attr),),
                    detail=f"`.{method}()`",
                    rewrite=Rewrite(call.func.attr, "method", "float"),
                )
            return
        if method == "to":
            yield from self._to_facts(call, receiver, site, env)
            return
        if method == "type":
            yield from self._type_facts(call, site, env)
            return
        if method == "type_as":
            args = positional_args(call)
            if args and self._all_float32(self.tensor_facts(args[0].value, site, env)):
                yield TensorFact(Kind.FLOAT32, call)
            else:
                yield TensorFact(Kind.CAST, call, call=call, detail="`.type_as(...)`")
            return
        if method == "clone":
            for fact in self.tensor_facts(receiver, site, env):
                if fact.kind is Kind.UNKNOWN:
                    yield TensorFact(
                        Kind.INHERITED,
                        call,
                        call=call,
                        detail=f"a clone of `{_code(self.context, receiver)}`",
                        rewrite=Rewrite(call, "append"),
                    )
                else:
                    yield fact
            return
        if method == "get_tensor":
            yield TensorFact(Kind.LOADED, call, call=call, detail="`get_tensor(...)` (safetensors)")
            return
        if method == "get" and positional_args(call):
            if self.is_loaded(receiver, site, env):
                detail = _describe_load(self.context, receiver)
                yield TensorFact(Kind.LOADED, call, call=call, detail=detail)
                return
            key = self.string_value(positional_args(call)[0].value, site, env)
            if key is not None and context.gate_caches.matches(key):
                yield TensorFact(Kind.FLOAT32, call, detail="a gate cache")
                return
            yield TensorFact(Kind.UNKNOWN, call)
            return
        if method in _DTYPE_PRESERVING_METHODS:
            yield from self.tensor_facts(receiver, site, env)
            return
        yield TensorFact(Kind.UNKNOWN, call)

    def _allocation_facts(
        self, allocation: Allocation, site: Site, env: Env
    ) -> Iterator[TensorFact]:
        call = allocation.call
        dtype_arg = allocation.dtype_arg
        if dtype_arg is not None:
            yield self._dtype_decided(allocation, dtype_arg.value, site, env, via_kwargs=None)
            return
        kwargs = [arg for arg in call.args if arg.star == "**"]
        if kwargs:
            resolved = self._kwargs_dtype(kwargs[-1].value, site, env)
            if resolved is None:
                yield TensorFact(
                    Kind.VARIABLE,
                    kwargs[-1].value,
                    allocation=allocation,
                    dtypes=(DtypeFact(None, kwargs[-1].value),),
                    detail="`**` keyword arguments",
                )
                return
            if isinstance(resolved, cst.BaseExpression):
                yield self._dtype_decided(allocation, resolved, site, env, kwargs[-1].value)
                return
        if allocation.kind == "factory":
            yield TensorFact(
                Kind.INHERITED,
                call,
                allocation=allocation,
                call=call,
                detail="torch's default dtype (model loaders set it to the model dtype)",
                rewrite=Rewrite(call, "add_dtype"),
            )
            return
        if allocation.kind == "like":
            positional = positional_args(call)
            source = positional[0].value if positional else None
        else:  # new_*: the receiver's dtype
            source = method_receiver(self.context, call)
        if source is not None and self._all_float32(self.tensor_facts(source, site, env)):
            yield TensorFact(Kind.FLOAT32, call)
            return
        described = "another tensor" if source is None else f"`{_code(self.context, source)}`"
        yield TensorFact(
            Kind.INHERITED,
            call,
            allocation=allocation,
            call=call,
            detail=f"the dtype of {described}",
            rewrite=Rewrite(call, "add_dtype"),
        )

    def _dtype_decided(
        self,
        allocation: Allocation,
        dtype_expr: cst.BaseExpression,
        site: Site,
        env: Env,
        via_kwargs: cst.BaseExpression | None,
    ) -> TensorFact:
        facts = self.dtype_facts(dtype_expr, site, env)
        node: cst.BaseExpression = via_kwargs if via_kwargs is not None else dtype_expr
        rewrite = (
            Rewrite(node, "kwargs", _code(self.context, node))
            if via_kwargs is not None
            else Rewrite(node, "dtype")
        )
        if all(f.is_float32 for f in facts):
            return TensorFact(Kind.FLOAT32, node, allocation=allocation, dtypes=facts)
        kind = (
            Kind.EXPLICIT if any(f.dtype not in {None, FLOAT32} for f in facts) else Kind.VARIABLE
        )
        return TensorFact(kind, node, allocation=allocation, dtypes=facts, rewrite=rewrite)

    def _kwargs_dtype(
        self, expr: cst.BaseExpression, site: Site, env: Env
    ) -> cst.BaseExpression | Literal[False] | None:
        """The ``dtype`` entry of a ``**kwargs`` dict: the expression, False if absent, None if
        the dict cannot be read."""
        mapping: cst.BaseExpression | None = expr
        if isinstance(expr, cst.Name):
            found = self.lookup(expr.value, site, env)
            if not found or len(found) != 1 or found[0][0].kind != "assign":
                return None
            mapping = found[0][0].value
        if isinstance(mapping, cst.Dict):
            for element in mapping.elements:
                if not isinstance(element, cst.DictElement):
                    return None
                if literal_string(element.key) == "dtype":
                    return element.value
            return False
        if (
            isinstance(mapping, cst.Call)
            and isinstance(mapping.func, cst.Name)
            and mapping.func.value == "dict"
        ):
            if any(arg.keyword is None for arg in mapping.args):
                return None
            dtype = keyword_arg(mapping, "dtype")
            return dtype.value if dtype is not None else False
        return None

    def _to_facts(
        self, call: cst.Call, receiver: cst.BaseExpression, site: Site, env: Env
    ) -> Iterator[TensorFact]:
        dtype_arg = keyword_arg(call, "dtype")
        positional = positional_args(call)
        dtype_expr: cst.BaseExpression | None = dtype_arg.value if dtype_arg is not None else None
        other: cst.BaseExpression | None = None
        if dtype_expr is None and positional:
            first = positional[0].value
            role = self.to_argument_role(first, site, env)
            if role == "dtype":
                dtype_expr = first
            elif role == "tensor":
                other = first
            elif role == "device" and len(positional) > 1:
                second = positional[1].value
                if self.to_argument_role(second, site, env) == "dtype":
                    dtype_expr = second
            elif role == "unknown":
                yield TensorFact(Kind.UNKNOWN, call)
                return
        if dtype_expr is not None:
            facts = self.dtype_facts(dtype_expr, site, env)
            if all(f.is_float32 for f in facts):
                yield TensorFact(Kind.FLOAT32, call, dtypes=facts)
            else:
                yield TensorFact(
                    Kind.CAST,
                    dtype_expr,
                    call=call,
                    dtypes=facts,
                    detail=f"`.to({_code(self.context, dtype_expr)})`",
                    rewrite=Rewrite(dtype_expr, "dtype"),
                )
            return
        if other is not None:
            other_facts = self.tensor_facts(other, site, env)
            if self._all_float32(other_facts):
                yield TensorFact(Kind.FLOAT32, call)
                return
            literal = [_definite_dtype(f) for f in other_facts]
            dtypes = tuple(DtypeFact(d, other) for d in literal)
            yield TensorFact(
                Kind.CAST,
                other,
                call=call,
                dtypes=dtypes,
                detail=f"`.to({_code(self.context, other)})`, which takes that tensor's dtype",
                rewrite=Rewrite(
                    positional[0], "device_and_dtype", self.context.module.code_for_node(other)
                ),
            )
            return
        # Only a device (or nothing that changes the dtype): the receiver's dtype.
        yield from self.tensor_facts(receiver, site, env)

    def _type_facts(self, call: cst.Call, site: Site, env: Env) -> Iterator[TensorFact]:
        args = positional_args(call)
        dtype_arg = keyword_arg(call, "dtype")
        target = dtype_arg.value if dtype_arg is not None else (args[0].value if args else None)
        if target is None:
            yield TensorFact(Kind.UNKNOWN, call)  # x.type() returns a string
            return
        if isinstance(target, cst.Attribute) and target.attr.value.endswith("Tensor"):
            # x.type(torch.cuda.HalfTensor): a tensor type object, not a dtype
            tensor_type = target.attr.value
            if tensor_type == "FloatTensor":
                yield TensorFact(Kind.FLOAT32, call)
                return
            yield TensorFact(
                Kind.CAST,
                target.attr,
                call=call,
                dtypes=(DtypeFact(_TENSOR_TYPE_DTYPES.get(tensor_type), target),),
                detail=f"`.type({_code(self.context, target)})`",
                rewrite=Rewrite(target.attr, "text", "FloatTensor"),
            )
            return
        name = literal_string(target)
        if name is not None:
            if name.endswith(("FloatTensor", "float32")):
                yield TensorFact(Kind.FLOAT32, call)
                return
            quote = target.value[0] if isinstance(target, cst.SimpleString) else '"'
            replacement = _float_tensor_type(name)
            yield TensorFact(
                Kind.CAST,
                target,
                call=call,
                dtypes=(DtypeFact(_TENSOR_TYPE_DTYPES.get(name.rpartition(".")[2]), target),),
                detail=f"`.type({name!r})`",
                rewrite=None
                if replacement is None
                else Rewrite(target, "text", f"{quote}{replacement}{quote}"),
            )
            return
        facts = self.dtype_facts(target, site, env)
        if all(f.is_float32 for f in facts):
            yield TensorFact(Kind.FLOAT32, call, dtypes=facts)
            return
        yield TensorFact(
            Kind.CAST,
            target,
            call=call,
            dtypes=facts,
            detail=f"`.type({_code(self.context, target)})`",
            rewrite=Rewrite(target, "dtype"),
        )

    def _from_numpy(self, call: cst.Call, site: Site, env: Env) -> Iterator[TensorFact]:
        args = positional_args(call)
        if not args:
            yield TensorFact(Kind.UNKNOWN, call)
            return
        array = args[0].value
        numpy = self._numpy_origin(array, site, env)
        if numpy == "float32":
            yield TensorFact(Kind.FLOAT32, call)
        elif numpy == "loaded":
            yield TensorFact(Kind.LOADED, call, call=call, detail="a numpy array read from a file")
        else:
            yield TensorFact(Kind.UNKNOWN, call)

    def _numpy_origin(self, expr: cst.BaseExpression, site: Site, env: Env) -> str | None:
        if isinstance(expr, cst.Subscript):
            return self._numpy_origin(expr.value, site, env)
        if isinstance(expr, cst.Call):
            names = call_names(self.context, expr)
            if names & _NUMPY_LOADERS:
                dtype = keyword_arg(expr, "dtype")
                if dtype is not None and self._numpy_float32(dtype.value):
                    return "float32"
                return "loaded"
            method = method_name(expr)
            if method == "astype" and expr.args:
                return "float32" if self._numpy_float32(expr.args[0].value) else None
            receiver = method_receiver(self.context, expr)
            if method in {"copy", "reshape", "squeeze", "transpose"} and receiver is not None:
                return self._numpy_origin(receiver, site, env)
            return None
        if isinstance(expr, cst.Name) and self._enter():
            try:
                found = self.lookup(expr.value, site, env) or []
                origins = {
                    self._numpy_origin(b.value, s, env)
                    for b, s in found
                    if b.kind == "assign" and b.value is not None
                }
                if "loaded" in origins:
                    return "loaded"
                if origins == {"float32"}:
                    return "float32"
            finally:
                self._leave()
        return None

    def _numpy_float32(self, expr: cst.BaseExpression) -> bool:
        if literal_string(expr) in {"float32", "f4", "<f4"}:
            return True
        return (
            bool({"numpy.float32", "numpy.single"} & self.context.qualified_names(expr))
            or literal_dtype(self.context, expr) == FLOAT32
        )

    # ---------------------------------------------------------------------------- loops
    def iterations(
        self, target: cst.BaseExpression, iterable: cst.BaseExpression, site: Site
    ) -> list[dict[str, str]] | None:
        """For ``for <target> in <iterable>`` over a literal collection (directly, through a
        constant, ``.items()``, ``zip``, ``enumerate``): per iteration, the loop variables that
        hold a known string. None when the iterable is not a literal collection."""
        items = self._literal_items(iterable, site, 0)
        if items is None:
            return None
        result: list[dict[str, str]] = []
        for item, item_site in items:
            env: dict[str, str] = {}
            self._match(target, item, item_site, env)
            result.append(env)
        return result

    def _literal_items(
        self, expr: cst.BaseExpression, site: Site, depth: int
    ) -> list[tuple[cst.BaseExpression, Site]] | None:
        if depth > 4:
            return None
        if isinstance(expr, (cst.Tuple, cst.List, cst.Set)):
            if any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return None
            return [(e.value, site) for e in expr.elements]
        if isinstance(expr, cst.Dict):
            keys = [e.key for e in expr.elements if isinstance(e, cst.DictElement)]
            return None if len(keys) != len(expr.elements) else [(k, site) for k in keys]
        if isinstance(expr, cst.Name):
            found = self.lookup(expr.value, site)
            if not found or len(found) != 1:
                return None
            binding, binding_site = found[0]
            if binding.value is None:
                return None
            return self._literal_items(binding.value, binding_site, depth + 1)
        if not isinstance(expr, cst.Call):
            return None
        args = positional_args(expr)
        if isinstance(expr.func, cst.Name) and len(args) == len(expr.args):
            function = expr.func.value
            if function in {"list", "tuple"} and len(args) == 1:
                return self._literal_items(args[0].value, site, depth + 1)
            if function == "enumerate" and len(args) == 1:
                items = self._literal_items(args[0].value, site, depth + 1)
                if items is None:
                    return None
                return [
                    (_pair(cst.Integer(str(i)), item), item_site)
                    for i, (item, item_site) in enumerate(items)
                ]
            if function == "zip" and args:
                columns = [self._literal_items(a.value, site, depth + 1) for a in args]
                if any(c is None for c in columns):
                    return None
                rows = zip(*[c for c in columns if c is not None], strict=False)
                return [(cst.Tuple([cst.Element(item) for item, _ in row]), site) for row in rows]
        method = method_name(expr)
        if method in {"items", "keys", "values"} and not args:
            assert isinstance(expr.func, cst.Attribute)
            mapping: cst.BaseExpression | None = expr.func.value
            mapping_site = site
            if isinstance(mapping, cst.Name):
                found = self.lookup(mapping.value, site)
                if not found or len(found) != 1:
                    return None
                mapping, mapping_site = found[0][0].value, found[0][1]
            if not isinstance(mapping, cst.Dict):
                return None
            elements = [e for e in mapping.elements if isinstance(e, cst.DictElement)]
            if len(elements) != len(mapping.elements):
                return None
            if method == "keys":
                return [(e.key, mapping_site) for e in elements]
            if method == "values":
                return [(e.value, mapping_site) for e in elements]
            return [(_pair(e.key, e.value), mapping_site) for e in elements]
        return None

    def _match(
        self, target: cst.BaseExpression, item: cst.BaseExpression, site: Site, env: dict[str, str]
    ) -> None:
        if isinstance(target, cst.Name):
            value = self.string_value(item, site)
            if value is not None:
                env[target.value] = value
        elif (
            isinstance(target, (cst.Tuple, cst.List))
            and isinstance(item, (cst.Tuple, cst.List))
            and len(target.elements) == len(item.elements)
        ):
            for sub_target, sub_item in zip(target.elements, item.elements, strict=True):
                self._match(sub_target.value, sub_item.value, site, env)

    # ----------------------------------------------------------------------- containers
    def is_loaded(self, expr: cst.BaseExpression, site: Site, env: Env = _NO_ENV) -> bool:
        """Whether ``expr`` is (part of) a checkpoint read from disk."""
        if isinstance(expr, cst.Call):
            names = call_names(self.context, expr)
            if names & (_TORCH_LOADERS | _NUMPY_LOADERS):
                return True
            method = method_name(expr)
            receiver = method_receiver(self.context, expr)
            if method in {"get", "pop"} and receiver is not None:
                return self.is_loaded(receiver, site, env)
            return False
        if isinstance(expr, cst.Subscript):
            return self.is_loaded(expr.value, site, env)
        if isinstance(expr, cst.Attribute):
            return _checkpoint_name(expr.attr.value)
        if isinstance(expr, cst.Name):
            if not self._enter():
                return False
            try:
                found = self.lookup(expr.value, site, env)
                if not found:
                    return _checkpoint_name(expr.value)
                for binding, binding_site in found:
                    if binding.kind == "param" and _checkpoint_name(binding.name):
                        return True
                    if binding.value is not None and self.is_loaded(
                        binding.value, binding_site, env
                    ):
                        return True
                return False
            finally:
                self._leave()
        return False

    # ---------------------------------------------------------------------------- helpers
    def to_argument_role(self, expr: cst.BaseExpression, site: Site, env: Env = _NO_ENV) -> str:
        """What the first argument of ``x.to(arg)`` is: dtype, device, tensor or unknown."""
        if literal_dtype(self.context, expr) is not None:
            return "dtype"
        if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.Integer)):
            return "device"
        if isinstance(expr, cst.Call):
            names = call_names(self.context, expr)
            if "torch.device" in names:
                return "device"
            if as_allocation(self.context, expr) is not None:
                return "tensor"
            return "unknown"
        name = binding_name(expr)
        if name is not None:
            lowered = name.lower()
            if "dtype" in lowered:
                return "dtype"
            if "device" in lowered or lowered in {"dev", "cuda", "cpu", "place"}:
                return "device"
            if self.context.gate_caches.matches(name):
                return "tensor"
        if isinstance(expr, cst.Name):
            found = self.lookup(expr.value, site, env) or []
            for binding, binding_site in found:
                if binding.kind == "param":
                    return _annotation_role(self.context, binding.node)
                if binding.kind == "assign" and binding.value is not None and self._enter():
                    try:
                        role = self.to_argument_role(binding.value, binding_site, env)
                    finally:
                        self._leave()
                    if role != "unknown":
                        return role
            return "unknown"
        return "unknown"

    def _all_float32(self, facts: Sequence[TensorFact]) -> bool:
        return bool(facts) and all(f.kind is Kind.FLOAT32 for f in facts)

    def _enter(self) -> bool:
        if self._depth >= _MAX_DEPTH:
            return False
        self._depth += 1
        return True

    def _leave(self) -> None:
        self._depth -= 1


def _pair(first: cst.BaseExpression, second: cst.BaseExpression) -> cst.Tuple:
    return cst.Tuple([cst.Element(first), cst.Element(second)])


def _definite_dtype(fact: TensorFact) -> str | None:
    if fact.kind is Kind.FLOAT32:
        return FLOAT32
    if fact.kind in {Kind.EXPLICIT, Kind.CAST}:
        literals = {d.dtype for d in fact.dtypes}
        if len(literals) == 1 and None not in literals:
            return next(iter(literals))
    return None


def _checkpoint_name(name: str) -> bool:
    lowered = name.lower().lstrip("_")
    return lowered.endswith(_CHECKPOINT_SUFFIXES)


def _annotation_role(context: FileContext, node: cst.CSTNode) -> str:
    if not isinstance(node, cst.Param) or node.annotation is None:
        return "unknown"
    annotation = node.annotation.annotation
    spellings = {context.module.code_for_node(annotation).strip()}
    if isinstance(annotation, cst.BinaryOperation):  # torch.device | str
        spellings = {
            context.module.code_for_node(part).strip()
            for part in (annotation.left, annotation.right)
        }
    if spellings <= _DEVICE_ANNOTATIONS:
        return "device"
    if spellings & _DTYPE_ANNOTATIONS:
        return "dtype"
    if spellings & _TENSOR_ANNOTATIONS:
        return "tensor"
    return "unknown"


def _loader_name(names: set[str]) -> str:
    for name in sorted(names & _TORCH_LOADERS):
        return f"`{name}(...)`"
    return "a checkpoint"


def _describe_load(context: FileContext, container: cst.BaseExpression) -> str:
    return f"`{_code(context, container)}` (a checkpoint)"


def _code(context: FileContext, node: cst.CSTNode) -> str:
    text = " ".join(context.module.code_for_node(node).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _float_tensor_type(name: str) -> str | None:
    """``"torch.cuda.HalfTensor"`` -> ``"torch.cuda.FloatTensor"``."""
    head, dot, tail = name.rpartition(".")
    if tail.endswith("Tensor") and head.startswith("torch"):
        return f"{head}{dot}FloatTensor"
    return None
