"""The fix for one dtype shared by every cache of a loop over cache names: float32 for the gate
cache only.

``for name in ("d_cache", "k_cache", "g_cache"): ... torch.zeros(shape, dtype=dtype)`` gets
``dtype=torch.float32 if name == "g_cache" else dtype`` (or ``dtype=torch.float32 if ... else
None`` where no dtype was given: ``None`` keeps the old behaviour for the other caches), and
``getattr(self, name).half()`` gets ``.to(torch.float32, copy=True)`` for the gate cache only. A
cast to a dtype that is surely not float32 made a new tensor; cast to float32, a float32 gate
cache would be handed back as it is, so the gate cache's cast passes ``copy``
(``.to(torch.float32 if name == "g_cache" else torch.float16, copy=name == "g_cache")``).
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.facts import (
    AddDtypeArgument,
    CastMethodToFloat,
    CastValue,
    SetDtype,
    TensorFact,
)
from replaylint.lint.fixes.drafts import EditDraft, FixDraft, InsertAfter, Replace
from replaylint.lint.fixes.float32 import TorchSpelling
from replaylint.lint.model import Applicability
from replaylint.lint.syntax.nodes import one_line
from replaylint.lint.syntax.traversal import descendants, syntax_children


def conditional_fix(
    module: cst.Module, torch: TorchSpelling | None, fact: TensorFact, condition: str
) -> FixDraft | None:
    """Float32 where ``condition`` (``name == "g_cache"``) holds, the old dtype elsewhere; None
    when ``fact`` says no dtype expression to change or torch cannot be spelled there."""
    target = fact.target
    if torch is None:
        return None
    spelling = torch.attribute("float32")
    edit: EditDraft
    if isinstance(target, SetDtype):
        original = one_line(module, target.node, 10_000)
        if isinstance(target.node, (cst.IfExp, cst.Lambda, cst.NamedExpr)):
            original = f"({original})"
        edit = Replace(target.node, f"{spelling} if {condition} else {original}")
        if target.copying is not None and target.copying.args:
            # a float32 gate cache stays a copy, as its cast made one; the others as they were
            copy = InsertAfter(target.copying.args[-1], f", copy={condition}")
            return FixDraft(
                f"Use {spelling} for the gate cache only",
                (edit, copy, *torch.imports),
                Applicability.SAFE if torch.safe else Applicability.UNSAFE,
            )
    elif isinstance(target, AddDtypeArgument) and target.node.args:
        edit = InsertAfter(target.node.args[-1], f", dtype={spelling} if {condition} else None")
    elif isinstance(target, CastValue):  # a load: cast what it read, for the gate cache only
        original = one_line(module, target.node, 10_000)
        if not isinstance(target.node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            original = f"({original})"
        choice = f"{original}.to({spelling}) if {condition} else {original}"
        if _inside_an_expression(module, target.node):  # `torch.from_file(...).view(shape)`
            choice = f"({choice})"
        edit = Replace(target.node, choice)
    elif isinstance(target, CastMethodToFloat):  # `t.half()`: `t.float()` for the gate only
        call = fact.call
        if not (
            isinstance(call, cst.Call)
            and not call.args
            and isinstance(call.func, cst.Attribute)
            and call.func.attr is target.node
        ):
            return None
        original = one_line(module, call, 10_000)
        tensor = one_line(module, call.func.value, 10_000)
        copied = f"{tensor}.to({spelling}, copy=True)"  # a new tensor, as the cast made
        edit = Replace(call, f"({copied} if {condition} else {original})")
    else:
        return None
    # safe, unless spelling float32 needs an import the module did not need before
    applicability = Applicability.SAFE if torch.safe else Applicability.UNSAFE
    return FixDraft(
        f"Use {spelling} for the gate cache only", (edit, *torch.imports), applicability
    )


def _inside_an_expression(module: cst.Module, node: cst.CSTNode) -> bool:
    """Whether ``node`` is an operand, a receiver or an element of a larger expression, where a
    conditional expression in its place needs parentheses (an argument or an assigned value
    does not)."""
    for parent in descendants(module):
        children = syntax_children(parent)
        if any(child is node for child in children):
            return not isinstance(
                parent, (cst.Arg, cst.Assign, cst.AnnAssign, cst.Return, cst.Expr, cst.AssignTarget)
            )
    return True


def per_buffer_fix(
    module: cst.Module,
    torch: TorchSpelling | None,
    cast: cst.Call,
    dtype: cst.BaseExpression | None,
    condition: str,
) -> FixDraft | None:
    """For a loop that casts every buffer (``buf.to(dtype)``, ``saved.to(device, dtype=dtype)``,
    ``buf.half()``, ``buf.type_as(x)``): float32 for the gate buffers only. ``dtype`` is the
    cast's dtype argument, when it has one: ``torch.float32 if <condition> else dtype``;
    otherwise the tensor is made float32 instead of cast (``buf.float() if ... else
    buf.half()``)."""
    if torch is None or not isinstance(cast.func, cst.Attribute):
        return None
    spelling = torch.attribute("float32")
    edit: EditDraft
    if dtype is not None:
        original = one_line(module, dtype, 10_000)
        if isinstance(dtype, (cst.IfExp, cst.Lambda, cst.NamedExpr)):
            original = f"({original})"
        edit = Replace(dtype, f"{spelling} if {condition} else {original}")
    else:
        tensor = one_line(module, cast.func.value, 10_000)
        original = one_line(module, cast, 10_000)
        edit = Replace(cast, f"({tensor}.float() if {condition} else {original})")
    return FixDraft(
        f"Use {spelling} for the gate buffers only", (edit, *torch.imports), Applicability.UNSAFE
    )
