"""RL004's module casts: ``model.to(torch.bfloat16)`` converts the gate buffers a model holds.

One question per cast call, answered from the most to the least that is known of the receiver:
an instance of a gate-buffer class of this module (or of a class that holds one through its
submodules), an instance of such a class imported from another module of the project, and a
module of no known class (``model: nn.Module``, ``self`` in a mixin) in a project or module
whose classes hold a gate buffer. A guarded instance is never reported, nor a cast whose result
goes straight into a function that puts the gate buffer back to float32 (:mod:`replaylint.lint.dataflow.recasts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import DtypeFact
from replaylint.lint.dataflow.imported_modules import imported_gate_buffer
from replaylint.lint.dataflow.modules import module_cast, module_cast_dtypes
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.recasts import undone_for
from replaylint.lint.dataflow.submodules import (
    GateBufferHolders,
    gate_buffer_holders,
    guarded_instance,
    held_module_cast,
)
from replaylint.lint.dataflow.unknown_modules import unknown_module
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.fixes.guard import protect_before_cast
from replaylint.lint.rules.wording import (
    imported_cast_message,
    module_cast_message,
    unknown_module_cast_message,
)
from replaylint.lint.syntax.sites import Site


@dataclass(frozen=True)
class ModuleCastFinding:
    message: str
    fix: FixDraft | None


class ModuleCasts:
    """Answers for the module casts of one file (the module's holders are read once)."""

    def __init__(self, context: FileContext, prov: Provenance) -> None:
        self._context = context
        self._prov = prov
        self._holders: GateBufferHolders | None = None

    def finding(self, call: cst.Call, site: Site) -> ModuleCastFinding | None:
        """The finding for ``call`` when it casts a module holding a float32 gate buffer to a
        dtype not provably float32, and the module is not guarded."""
        prov, module = self._prov, self._context.module
        if self._holders is None:
            self._holders = gate_buffer_holders(prov, prov.gate_buffers())
        holders = self._holders
        if not isinstance(call.func, cst.Attribute):
            return None
        if holders.buffers:
            cast = module_cast(prov, call, site, holders.buffers) or held_module_cast(
                prov, call, site, holders
            )
            if cast is not None:
                if guarded_instance(prov, call, site) or undone_for(
                    prov, call, site, cast.buffer.name
                ):
                    return None
                fix = protect_before_cast(module, call, cast.buffer.name)
                return ModuleCastFinding(module_cast_message(self._context, call, cast), fix)
        dtypes = module_cast_dtypes(prov, call, site)
        if dtypes is None or guarded_instance(prov, call, site):
            return None
        if prov.imports_gate_buffer_holder():
            imported = imported_gate_buffer(prov, call.func.value, site)
            if imported is not None and not undone_for(prov, call, site, imported.name):
                message = imported_cast_message(module, call, imported, dtypes)
                return ModuleCastFinding(message, protect_before_cast(module, call, imported.name))
        return self._unknown_class(call, call.func.value, holders, site, dtypes)

    def _unknown_class(
        self,
        call: cst.Call,
        receiver: cst.BaseExpression,
        holders: GateBufferHolders,
        site: Site,
        dtypes: tuple[DtypeFact, ...],
    ) -> ModuleCastFinding | None:
        """A cast of ``model: nn.Module`` or of ``self`` in a base of a gate-buffer class."""
        prov, module = self._prov, self._context.module
        local = next(iter(holders.buffers.values()), None)
        bases = {
            base.name.value
            for name in holders.buffers
            for base in holders.classes.mro(holders.classes.by_name[name])[1:]
        }
        index = prov.project.index if prov.project is not None else None
        if index is not None:
            bases |= index.holder_bases
        if not unknown_module(prov, receiver, site, frozenset(bases)):
            return None
        if local is not None:
            holder, name = local.cls.name.value, local.name
            where = f"on line {self._context.line_of(local.node)}"
        elif index is not None and index.holder_example is not None:
            example = index.holder_example
            holder, name = example.cls, example.name
            where = f"at {example.origin.path}:{example.origin.line}"
            owner = index.module_of(example.origin.path)
            if owner is not None:
                index.summary(owner)  # the finding depends on the holder's module
        else:
            return None
        if undone_for(prov, call, site, name):
            return None
        others = {buffer.name for buffer in holders.buffers.values()}
        if index is not None:
            others |= index.holder_buffers
        message = unknown_module_cast_message(module, call, holder, name, where, dtypes)
        fix = protect_before_cast(module, call, name, sorted(others - {name}))
        return ModuleCastFinding(message, fix)
