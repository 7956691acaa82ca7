"""The fix for a per-key helper called with a mapping that holds the gate cache: the gate entry
made again by the same helper, in float32.

``alloc_rings(shapes, dtype)`` returns ``{name: torch.zeros(shape, dtype=dtype) for name, shape
in shapes.items()}``; the helper may serve callers whose mappings hold no gate cache, so it is
not rewritten. The call becomes ``{**alloc_rings(shapes, dtype), **alloc_rings({"g_cache":
shapes["g_cache"]}, torch.float32)}``: the later spread replaces the gate entry where it stood,
so every key keeps its place and every other entry its dtype. Unsafe: for a moment the gate ring
is allocated twice, and the call's other arguments are read twice (only names, attributes and
literals are accepted for them). :func:`split_for_gate` recognises the result, so that the first
call is no finding any more.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.fixes.drafts import FixDraft, Replace
from replaylint.lint.fixes.float32 import TorchSpelling
from replaylint.lint.model import Applicability
from replaylint.lint.syntax.nodes import dotted_name, one_line
from replaylint.lint.syntax.traversal import descendants


def keyed_split_fix(
    module: cst.Module,
    torch: TorchSpelling | None,
    call: cst.Call,
    mapping: cst.BaseExpression,
    dtype: cst.BaseExpression,
    gates: list[str],
) -> FixDraft | None:
    """The split of ``call`` (``mapping`` and ``dtype`` its arguments) for the gate keys
    ``gates``; None when an argument is not one to read twice."""
    if torch is None or not gates:
        return None
    arguments = [arg.value for arg in call.args]
    if any(arg.star for arg in call.args) or not (
        any(a is mapping for a in arguments) and any(a is dtype for a in arguments)
    ):
        return None
    if not all(a is mapping or a is dtype or _plain(a) for a in arguments):
        return None
    entries = _gate_entries(module, mapping, gates)
    if entries is None:
        return None
    float32 = torch.attribute("float32")

    def argument(arg: cst.Arg) -> str:
        code = one_line(module, arg.value, 10_000)
        if arg.value is mapping:
            code = "{" + ", ".join(entries) + "}"
        elif arg.value is dtype:
            code = float32
        return f"{arg.keyword.value}={code}" if arg.keyword is not None else code

    again = f"{one_line(module, call.func, 10_000)}({', '.join(argument(a) for a in call.args)})"
    text = f"{{**{one_line(module, call, 10_000)}, **{again}}}"
    return FixDraft(
        f"Make the gate cache's entry again as {float32}",
        (Replace(call, text), *torch.imports),
        Applicability.UNSAFE,
    )


def split_for_gate(statement: cst.CSTNode | None, call: cst.Call) -> bool:
    """Whether ``call`` is spread into a dict display that then spreads another call of the
    same function: the gate entry made again (what :func:`keyed_split_fix` writes)."""
    if statement is None:
        return False
    name = dotted_name(call.func)
    for node in descendants(statement):
        if not isinstance(node, cst.Dict):
            continue
        spreads = [e.value for e in node.elements if isinstance(e, cst.StarredDictElement)]
        if not any(s is call for s in spreads):
            continue
        later = spreads[next(i for i, s in enumerate(spreads) if s is call) + 1 :]
        return any(_made_again(s, name) for s in later)
    return False


def _made_again(value: cst.BaseExpression, name: str | None) -> bool:
    """``alloc_rings({"g_cache": ...}, torch.float32)``: the same helper, given a dict display
    and float32."""
    if not (isinstance(value, cst.Call) and dotted_name(value.func) == name):
        return False
    arguments = [arg.value for arg in value.args]
    return any(isinstance(a, cst.Dict) for a in arguments) and any(
        (dotted_name(a) or "").endswith("float32") for a in arguments
    )


def _plain(value: cst.BaseExpression) -> bool:
    """A name, an attribute of one, or a literal: the same when read twice."""
    if isinstance(value, (cst.SimpleString, cst.Integer, cst.Float)):
        return True
    if isinstance(value, cst.Name):
        return True
    return isinstance(value, cst.Attribute) and _plain(value.value)


def _gate_entries(
    module: cst.Module, mapping: cst.BaseExpression, gates: list[str]
) -> list[str] | None:
    """``"g_cache": shapes["g_cache"]`` for each gate key of ``mapping`` (a name or attribute),
    or the gate key's own entry of a dict display whose value is plain."""
    if _plain(mapping) and not isinstance(mapping, (cst.SimpleString, cst.Integer, cst.Float)):
        source = one_line(module, mapping, 10_000)
        return [f'"{key}": {source}["{key}"]' for key in gates]
    if not isinstance(mapping, cst.Dict):
        return None
    written: dict[str, cst.BaseExpression] = {}
    for element in mapping.elements:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
            written[element.key.evaluated_value] = element.value  # type: ignore[index]
    if not all(key in written and _plain_or_tuple(written[key]) for key in gates):
        return None
    return [f'"{key}": {one_line(module, written[key], 10_000)}' for key in gates]


def _plain_or_tuple(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Tuple):
        return all(_plain(e.value) for e in value.elements)
    return _plain(value)
