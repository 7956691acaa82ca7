"""Spelling float32 in a module, and the edits that make an expression produce it.

The analysis says *what* would make a tensor float32 (a
:data:`~replaylint.lint.dataflow.facts.Float32Target`); this module says how that reads in this
module's source: ``torch.float32`` with the module's own alias for torch (``th.float32``), plus
``import torch`` when the module has no module-level binding of it.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.facts import (
    AddDtypeArgument,
    CastMethodToFloat,
    CastValue,
    DeviceOfOther,
    Float32Target,
    FloatTensorType,
    OverrideKwargsDtype,
    SetDtype,
)
from replaylint.lint.fixes.drafts import AddModuleImport, EditDraft, InsertAfter, Replace
from replaylint.lint.syntax.nodes import dotted_name, one_line


class Float32Spelling:
    """How one module spells ``torch.<attribute>``, and the edits that make values float32."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self._torch_alias: tuple[str, bool] | None = None

    def torch_attribute(self, attribute: str) -> tuple[str, tuple[EditDraft, ...]]:
        """Spell ``torch.<attribute>`` with the module's own alias for ``torch``.

        Returns the spelling and the edits it needs: ``import torch`` when the module has no
        module-level binding of torch (``from torch import zeros`` alone, say).
        """
        if self._torch_alias is None:
            self._torch_alias = _find_torch_alias(self.module)
        alias, present = self._torch_alias
        edits: tuple[EditDraft, ...] = () if present else (AddModuleImport("torch"),)
        return f"{alias}.{attribute}", edits

    @property
    def float32(self) -> str:
        """``torch.float32`` as this module spells it."""
        return self.torch_attribute("float32")[0]

    def edits_for(self, target: Float32Target) -> tuple[EditDraft, ...] | None:
        """The edits that make ``target`` produce float32, or None when there is no safe way."""
        spelling, import_edits = self.torch_attribute("float32")
        edit: EditDraft
        if isinstance(target, SetDtype):
            edit = Replace(target.node, spelling)
        elif isinstance(target, CastMethodToFloat):  # no torch spelling needed
            return (Replace(target.node, "float"),)
        elif isinstance(target, FloatTensorType):
            node = target.node
            if isinstance(node, cst.SimpleString):
                quote = node.value[0]
                return (Replace(node, f"{quote}{target.float_type}{quote}"),)
            return (Replace(node, target.float_type),)
        elif isinstance(target, DeviceOfOther):  # the Arg, parentheses included
            other = target.node.value
            if not isinstance(other, (cst.Name, cst.Attribute, cst.Subscript)):
                return None
            other_code = self.module.code_for_node(other)
            edit = Replace(target.node, f"{other_code}.device, {spelling}")
        elif isinstance(target, OverrideKwargsDtype):
            mapping = one_line(self.module, target.node)
            edit = Replace(target.node, f'{{**{mapping}, "dtype": {spelling}}}')
        elif isinstance(target, CastValue):
            edit = InsertAfter(target.node, f".to({spelling})")
        else:
            assert isinstance(target, AddDtypeArgument)
            if not target.node.args:
                return None
            edit = InsertAfter(target.node.args[-1], f", dtype={spelling}")
        return (edit, *import_edits)

    def cast_at(self, value: cst.BaseExpression) -> tuple[EditDraft, ...]:
        """``<value>.to(torch.float32)``, parenthesised when ``value`` is not a primary."""
        spelling, import_edits = self.torch_attribute("float32")
        edit: EditDraft
        if isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
            edit = InsertAfter(value, f".to({spelling})")
        else:
            edit = Replace(value, f"({self.module.code_for_node(value)}).to({spelling})")
        return (edit, *import_edits)


def _find_torch_alias(module: cst.Module) -> tuple[str, bool]:
    """The name a module-level ``import torch[...] [as x]`` binds, or ("torch", False)."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not isinstance(small, cst.Import):
                continue
            for alias in small.names:
                dotted = dotted_name(alias.name) or ""
                if alias.asname is not None:
                    if dotted == "torch" and isinstance(alias.asname.name, cst.Name):
                        return alias.asname.name.value, True
                elif dotted == "torch" or dotted.startswith("torch."):
                    return "torch", True
    return "torch", False
