"""RL002's gate-dtype settings that are decided where a class declares them.

``spec.gate_dtype`` read at an allocation is only as float32 as the field it names. When the
module declares that field only as class fields with a literal torch dtype default
(``gate_dtype: torch.dtype = torch.bfloat16``) and never assigns it, the declaration decides the
ring's dtype: RL001 reports it there when it is not float32, and RL002 stays quiet at the use.
The same holds for the gate field of a record of ring dtypes (a NamedTuple or dataclass of this
module or of the project, the field declared a dtype without a default) that a parameter is
annotated with: ``dtypes.logdecay`` of ``dtypes: RingDtypes`` is whatever each construction
gives it, and the constructions are judged.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.dtype_tables import is_dtype_annotation
from replaylint.lint.dataflow.facts import TensorFact
from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.dataflow.record_names import imported_record_requires
from replaylint.lint.dataflow.torch_api import dtype_from_qualified_name
from replaylint.lint.gatecache.names import GATE_FIELD_WORDS
from replaylint.lint.syntax.nodes import (
    binding_name,
    is_none_literal,
    record_fields,
    self_attribute,
)
from replaylint.lint.syntax.traversal import descendants, syntax_children


def declared_setting(context: FileContext, index: ModuleIndex, dtype: cst.CSTNode) -> bool:
    """Whether ``dtype`` reads a gate-dtype setting that this module declares only as class
    fields with a literal torch dtype default and never assigns (a ``setattr`` that swaps
    submodules is not counted)."""
    if not isinstance(dtype, cst.Attribute):
        return False
    name, names = dtype.attr.value, context.gate_caches
    gate_field = name.lower() in GATE_FIELD_WORDS or names.names_gate_dtype(name)
    # a field named like the gate cache itself counts where it is declared a dtype
    typed = not names.names_gate_dtype(name)
    if not gate_field and typed and not names.matches(name):
        return False
    annotation = _parameter_annotation(index.module, dtype.value)  # one walk for both uses
    if gate_field and _record_gate_field(context, index, annotation, name):
        return True  # `dtypes.logdecay` of `dtypes: RingDtypes`: judged where it is built
    if typed and not names.matches(name):
        return False
    declaring: set[str] = set()
    defaults: list[cst.BaseExpression] = []
    for cls in index.classes():
        if not isinstance(cls.body, cst.IndentedBlock):
            continue
        for line in cls.body.body:
            if isinstance(line, cst.SimpleStatementLine):
                for small in line.body:
                    found = _class_field_value(small, name, typed=typed)
                    defaults += found
                    if found:
                        declaring.add(cls.name.value)
    if _annotated_otherwise(dtype.value, annotation, declaring):
        return False  # `spec: ReplayCacheSpec`: another class's setting of that name
    return (
        bool(defaults)
        and all(_literal_torch_dtype(index.qualified_names(value)) for value in defaults)
        # `self.decay_ring = ...` of a field named like the ring is the ring, not the field
        and (typed or not index.assigns_attribute(name, by_setattr=False))
    )


def keyword_only_setting(
    context: FileContext, fact: TensorFact, scope: cst.CSTNode | None = None
) -> bool:
    """Whether every dtype of ``fact`` that is not float32 is a keyword-only parameter named
    for the gate cache's dtype (``*, log_decay_dtype=None``): a call can set it only as
    ``log_decay_dtype=...``, which is judged as a setting where it is written. With ``scope``
    (the function of a loop over cache names), also when every such dtype is what the calls
    pass for a keyword-only gate-dtype parameter of that function."""
    open_dtypes = [d for d in fact.dtypes if not d.is_float32]
    names = context.gate_caches
    if bool(open_dtypes) and all(
        d.dtype is None
        and d.binding is not None
        and d.binding.kind == "param"
        and names.names_gate_dtype(d.binding.name)
        and isinstance(function := d.binding.scope, cst.FunctionDef)
        and any(p is d.binding.node for p in function.params.kwonly_params)
        for d in open_dtypes
    ):
        return True
    if not open_dtypes or not isinstance(scope, cst.FunctionDef):
        return False
    keyword_only = {p.name.value for p in scope.params.kwonly_params}
    return all(
        d.parameter in keyword_only and names.names_gate_dtype(d.parameter) for d in open_dtypes
    )


def _annotated_otherwise(
    receiver: cst.BaseExpression, annotation: cst.BaseExpression | None, declaring: set[str]
) -> bool:
    """Whether ``receiver`` is a parameter of its function (its ``annotation``) annotated with a
    class other than the ``declaring`` ones."""
    if not isinstance(receiver, cst.Name) or receiver.value in {"self", "cls"}:
        return False
    named = annotation.attr.value if isinstance(annotation, cst.Attribute) else None
    named = annotation.value if isinstance(annotation, cst.Name) else named
    return named is not None and named[:1].isupper() and named not in declaring


def _record_gate_field(
    context: FileContext,
    index: ModuleIndex,
    annotation: cst.BaseExpression | None,
    field: str,
) -> bool:
    """Whether a parameter's ``annotation`` names a record class of the module or of the
    project (a NamedTuple or dataclass of ring dtypes) that declares ``field`` as a dtype
    without a default, or with a literal torch dtype: every construction of the record gives
    the field its value or that literal, and RL001 and RL002 judge them there
    (``RingDtypes(delta=d, key=d, logdecay=torch.bfloat16)``)."""
    if not isinstance(annotation, cst.Name):
        return False
    for cls in index.classes():
        if cls.name.value == annotation.value:
            fields = record_fields(cls)
            return fields is not None and any(
                n == field
                and (
                    d is None
                    or (is_none_literal(d) and _filled_later(cls, field))
                    or _literal_torch_dtype(index.qualified_names(d))
                )
                for n, d in fields
            )
    imported = sorted(index.qualified_names(annotation))
    return len(imported) == 1 and imported_record_requires(context.provenance, imported[0], field)


def _filled_later(cls: cst.ClassDef, field: str) -> bool:
    """Whether the record's ``__post_init__`` assigns ``self.<field>`` (a None default it
    replaces, judged there)."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    for statement in body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "__post_init__":
            return any(
                isinstance(node, cst.Assign)
                and any(
                    self_attribute(t.target) and binding_name(t.target) == field
                    for t in node.targets
                )
                for node in descendants(statement)
            )
    return False


def _parameter_annotation(
    module: cst.Module, receiver: cst.BaseExpression
) -> cst.BaseExpression | None:
    """The annotation of the parameter ``receiver`` names in its function, if it has one."""
    if not isinstance(receiver, cst.Name):
        return None
    function = _enclosing_function(module, receiver)
    for param in (*function.params.params, *function.params.kwonly_params) if function else ():
        if param.name.value == receiver.value and param.annotation is not None:
            return param.annotation.annotation
    return None


def _enclosing_function(module: cst.Module, node: cst.CSTNode) -> cst.FunctionDef | None:
    """The innermost function whose body holds ``node``."""
    stack: list[tuple[cst.CSTNode, cst.FunctionDef | None]] = [(module, None)]
    while stack:
        current, function = stack.pop()
        if current is node:
            return function
        if isinstance(current, cst.FunctionDef):
            function = current
        stack.extend((child, function) for child in syntax_children(current))
    return None


def _class_field_value(
    statement: cst.BaseSmallStatement, name: str, *, typed: bool = False
) -> list[cst.BaseExpression]:
    """The default a class-body statement gives the field ``name`` (none: not that field);
    ``typed``: only a field annotated as a dtype."""
    if (
        isinstance(statement, cst.AnnAssign)
        and isinstance(statement.target, cst.Name)
        and statement.target.value == name
        and statement.value is not None
        and (not typed or is_dtype_annotation(statement.annotation))
    ):
        return [statement.value]
    if (
        not typed
        and isinstance(statement, cst.Assign)
        and any(
            isinstance(t.target, cst.Name) and t.target.value == name for t in statement.targets
        )
    ):
        return [statement.value]
    return []


def _literal_torch_dtype(names: set[str]) -> bool:
    return any(dtype_from_qualified_name(name) is not None for name in names)
