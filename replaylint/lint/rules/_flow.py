"""What the dataflow rules share: the per-file :class:`Provenance`, fix edits and wording."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from replaylint.lint.analysis import GateCacheBinding, GateCacheRule
from replaylint.lint.context import EditDraft, FileContext, FixDraft, InsertAfter, Replace
from replaylint.lint.findings import Applicability
from replaylint.lint.provenance import DtypeFact, Provenance, Rewrite, TensorFact
from replaylint.lint.rules._messages import gate_cache_subject
from replaylint.lint.scopes import Binding

WHY = "gate caches hold log-decays that are summed and exponentiated, so they must be float32"


def provenance_of(context: FileContext) -> Provenance:
    """One :class:`Provenance` per file, shared by every rule of the traversal."""
    shared = context.memo.get("provenance")
    if not isinstance(shared, Provenance):
        shared = context.memo["provenance"] = Provenance(context)
    return shared


class FlowRule(GateCacheRule):
    """A gate-cache rule that asks how each bound value's dtype was decided."""

    @property
    def provenance(self) -> Provenance:
        return provenance_of(self.context)

    def facts(self, binding: GateCacheBinding) -> tuple[TensorFact, ...]:
        return self.provenance.tensor_facts(binding.value, binding.site)

    def subject(self, binding: GateCacheBinding) -> str:
        return gate_cache_subject(self.context, binding)

    def float32_fix(
        self, rewrite: Rewrite, message: str, applicability: Applicability
    ) -> FixDraft | None:
        edits = float32_edits(self.context, rewrite)
        if edits is None:
            return None
        return FixDraft(message.format(float32=self.float32()), edits, applicability)

    def fix_for(
        self,
        binding: GateCacheBinding,
        fact: TensorFact,
        rewrite: Rewrite | None,
        message: str,
        applicability: Applicability,
    ) -> FixDraft | None:
        """The fix for ``fact`` found at ``binding``.

        A fact reached through a local that is read elsewhere too (``ring = ...`` used for more
        than this gate cache) is not fixed where the local is made — that would change its other
        uses — but by a cast where it becomes the gate cache. Every such cast of one binding is
        the same edit, so several findings on one binding do not stack casts.
        """
        if fact.via and not all(self._sole_use(b) for b in fact.via):
            return FixDraft(
                f"Cast it to {self.float32()} where it becomes the gate cache",
                cast_at_binding(self.context, binding.value),
                applicability,
            )
        if rewrite is None:
            return None
        if rewrite.style == "append" and rewrite.node is binding.value:
            edits: tuple[EditDraft, ...] | None = cast_at_binding(self.context, binding.value)
        else:
            edits = float32_edits(self.context, rewrite)
        if edits is None:
            return None
        return FixDraft(message.format(float32=self.float32()), edits, applicability)

    def _sole_use(self, binding: Binding) -> bool:
        """Whether the local ``binding`` makes is read exactly once in its scope."""
        if binding.scope is None:
            return False
        key = f"reads:{id(binding.scope)}:{binding.name}"
        count = self.context.memo.get(key)
        if not isinstance(count, int):
            scope = self.context.scope(binding.scope)
            written = sum(
                1 for b in scope.bindings.get(binding.name, ()) if isinstance(b.node, cst.Name)
            )
            total = sum(1 for n in read_names(binding.scope) if n.value == binding.name)
            count = total - written
            self.context.memo[key] = count
        return count == 1

    def float32(self) -> str:
        return self.context.torch_attribute("float32")[0]


def float32_edits(context: FileContext, rewrite: Rewrite) -> tuple[EditDraft, ...] | None:
    """The edits that make ``rewrite.node`` produce float32, or None when there is no safe way."""
    spelling, import_edits = context.torch_attribute("float32")
    node = rewrite.node
    edit: EditDraft
    if rewrite.style == "dtype":
        edit = Replace(node, spelling)
    elif rewrite.style in {"method", "text"}:  # no torch spelling needed
        return (Replace(node, rewrite.text),)
    elif rewrite.style == "device_and_dtype":  # node: the Arg, parentheses included
        if not isinstance(node, cst.Arg) or not isinstance(
            node.value, (cst.Name, cst.Attribute, cst.Subscript)
        ):
            return None
        edit = Replace(node, f"{rewrite.text}.device, {spelling}")
    elif rewrite.style == "kwargs":
        edit = Replace(node, f'{{**{rewrite.text}, "dtype": {spelling}}}')
    elif rewrite.style == "append":
        edit = InsertAfter(node, f".to({spelling})")
    elif rewrite.style == "add_dtype":
        if not isinstance(node, cst.Call) or not node.args:
            return None
        edit = InsertAfter(node.args[-1], f", dtype={spelling}")
    else:  # pragma: no cover - every style is handled above
        raise AssertionError(rewrite.style)
    return (edit, *import_edits)


def cast_at_binding(context: FileContext, value: cst.BaseExpression) -> tuple[EditDraft, ...]:
    """``<value>.to(torch.float32)``, parenthesised when ``value`` is not a primary."""
    spelling, import_edits = context.torch_attribute("float32")
    edit: EditDraft
    if isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
        edit = InsertAfter(value, f".to({spelling})")
    else:
        edit = Replace(value, f"({context.module.code_for_node(value)}).to({spelling})")
    return (edit, *import_edits)


def read_names(node: cst.CSTNode) -> list[cst.Name]:
    """Names in ``node`` (not keyword names of calls, not attribute names)."""
    if isinstance(node, cst.Name):
        return [node]
    if isinstance(node, cst.Attribute):
        return read_names(node.value)
    if isinstance(node, cst.Arg):
        return read_names(node.value)
    found: list[cst.Name] = []
    for child in node.children:
        found.extend(read_names(child))
    return found


def code(context: FileContext, node: cst.CSTNode, limit: int = 60) -> str:
    """``node``'s source on one line, shortened to ``limit`` characters."""
    text = " ".join(context.module.code_for_node(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def through(context: FileContext, fact: TensorFact) -> str:
    """`` (through `ring`, line 12)`` when the fact was reached through local tensor bindings."""
    if not fact.via:
        return ""
    names = ", ".join(
        f"`{binding.name}` (line {context.line_of(binding.node)})" for binding in fact.via
    )
    return f" through {names}"


def describe_dtype(
    context: FileContext, expression: cst.CSTNode, facts: Iterable[DtypeFact]
) -> str:
    """How a non-literal dtype reads, and where it comes from: ``` `ring_dtype` (line 775:
    `conv_dtype if spec else ssm_dtype`)```, ``` `dtype`, a parameter```."""
    described = f"`{code(context, expression)}`"
    for fact in facts:
        if fact.dtype is not None or fact.binding is None:
            continue
        binding = fact.binding
        if binding.kind == "param":
            return f"{described}, a parameter"
        if binding.value is not None:
            line = context.line_of(binding.node)
            return f"{described} (line {line}: `{code(context, binding.value, 50)}`)"
        return described
    return described


def literal_names(dtypes: Iterable[str]) -> str:
    return " or ".join(f"torch.{dtype}" for dtype in dtypes)


def binding_lines(context: FileContext, facts: Iterable[DtypeFact]) -> str:
    """`` (`dtype`, line 3)`` for literal dtypes that came through a local variable."""
    seen: list[str] = []
    for fact in facts:
        if fact.binding is not None and fact.dtype is not None:
            text = f"`{fact.binding.name}`, line {context.line_of(fact.binding.node)}"
            if text not in seen:
                seen.append(text)
    return f" (through {'; '.join(seen)})" if seen else ""
