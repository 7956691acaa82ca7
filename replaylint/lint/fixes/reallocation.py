"""The fix for a gate cache unpacked from a shared-dtype comprehension: make it again, float32.

``d_cache, k_cache, g_cache = (torch.zeros(s, dtype=dtype) for s in shapes)`` gets the line
``g_cache = torch.zeros_like(g_cache, dtype=torch.float32)`` after it: for a fresh ``zeros``,
``ones`` or ``empty`` given only ``size``, ``dtype`` and ``device``, ``*_like`` gives the same
shape, device and values, and only the dtype changes. Unsafe: for a moment the gate ring is
allocated twice. :func:`reallocates` recognises that line, so that the unpacking it follows is no
finding any more.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.fixes.drafts import FixDraft, InsertLineAfter
from replaylint.lint.fixes.float32 import TorchSpelling
from replaylint.lint.model import Applicability

_REALLOCATABLE = frozenset({"torch.zeros", "torch.ones", "torch.empty"})
# what `*_like` keeps of the original allocation; `requires_grad`, `pin_memory`, `out=`,
# `layout` and the like it does not
_PLAIN_KEYWORDS = frozenset({"size", "dtype", "device"})


def reallocation_fix(
    index: ModuleIndex,
    torch: TorchSpelling | None,
    statement: cst.CSTNode | None,
    allocation: cst.BaseExpression,
    target: cst.BaseExpression,
) -> FixDraft | None:
    """The fix for ``target``, unpacked in ``statement`` from a comprehension whose element is
    ``allocation``; None when the allocation is not a plain fresh one."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None  # `a, b = ...; more()`: a line after it would come too late
    if torch is None or not isinstance(allocation, cst.Call):
        return None
    factory = next((n for n in index.qualified_names(allocation.func) if n in _REALLOCATABLE), None)
    if factory is None or any(
        arg.star or (arg.keyword is not None and arg.keyword.value not in _PLAIN_KEYWORDS)
        for arg in allocation.args
    ):
        return None
    ring = index.module.code_for_node(target).strip()
    like = torch.attribute(f"{factory.rsplit('.', 1)[1]}_like")
    float32 = torch.attribute("float32")
    return FixDraft(
        f"Reallocate the gate cache as {float32} after unpacking",
        (InsertLineAfter(statement, f"{ring} = {like}({ring}, dtype={float32})"), *torch.imports),
        Applicability.UNSAFE,
    )


def reallocates(
    index: ModuleIndex, statement: cst.CSTNode | None, target: cst.BaseExpression
) -> bool:
    """Whether the statement after ``statement`` is
    ``<target> = torch.<x>_like(<target>, dtype=torch.float32)``."""
    successor = index.next_statement(statement)
    if not isinstance(successor, cst.SimpleStatementLine) or len(successor.body) != 1:
        return False
    assign = successor.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return False
    value = assign.value
    if not (isinstance(value, cst.Call) and target.deep_equals(assign.targets[0].target)):
        return False
    first = value.args[0].value if value.args and value.args[0].keyword is None else None
    dtype = next((a.value for a in value.args if a.keyword and a.keyword.value == "dtype"), None)
    return (
        any(
            n.startswith("torch.") and n.endswith("_like")
            for n in index.qualified_names(value.func)
        )
        and first is not None
        and first.deep_equals(target)
        and dtype is not None
        and "torch.float32" in index.qualified_names(dtype)
    )
