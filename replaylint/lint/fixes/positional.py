"""The fix for one dtype shared by every element of a comprehension whose elements are taken by
position: float32 for the gate cache's position only.

``d, k, g = (t.to(dtype) for t in rings)`` and ``Rings(*(t.half() for t in parts))`` fill the
gate cache from one position of the comprehension. The loop is numbered with ``enumerate`` and
the dtype picked by the number: ``(t.to(torch.float32 if position == 2 else dtype) for
position, t in enumerate(rings))``. The iterable is read once, as before, and every other
element keeps exactly the dtype expression it had.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.facts import TensorFact
from replaylint.lint.fixes.conditional import conditional_fix
from replaylint.lint.fixes.drafts import FixDraft, Replace
from replaylint.lint.fixes.float32 import TorchSpelling
from replaylint.lint.syntax.nodes import Comprehension, one_line
from replaylint.lint.syntax.traversal import descendants

_NAMES = ("position", "ring_position", "gate_position")


def positional_fix(
    module: cst.Module,
    torch: TorchSpelling | None,
    comprehension: Comprehension,
    position: int,
    fact: TensorFact,
) -> FixDraft | None:
    """Float32 for the element at ``position`` of ``comprehension`` (``fact`` describes how
    its element gets its dtype); None for a comprehension whose positions are not its loop's
    (a filter, a nested loop, a set) or a dtype this cannot write."""
    loop = comprehension.for_in
    if (
        isinstance(comprehension, cst.SetComp)
        or loop.ifs
        or loop.inner_for_in is not None
        or loop.asynchronous is not None
    ):
        return None
    if fact.target is None or not any(
        node is fact.target.node for node in descendants(comprehension.elt)
    ):
        return None  # the dtype is decided outside the comprehension: not per element
    used = {node.value for node in descendants(comprehension) if isinstance(node, cst.Name)}
    variable = next((name for name in _NAMES if name not in used), None)
    if variable is None:
        return None
    chosen = conditional_fix(module, torch, fact, f"{variable} == {position}")
    if chosen is None:
        return None
    target = one_line(module, loop.target, 10_000)
    if isinstance(loop.target, cst.Tuple) and not loop.target.lpar:
        target = f"({target})"
    iterable = one_line(module, loop.iter, 10_000)
    written = module.code_for_node(loop)
    leading = written[: len(written) - len(written.lstrip())]  # the space before `for` is its own
    numbered = (Replace(loop, f"{leading}for {variable}, {target} in enumerate({iterable})"),)
    return FixDraft(
        f"Use float32 for the gate cache's position only ({variable} == {position})",
        (*numbered, *chosen.edits),
        chosen.applicability,
    )
