"""Spelling float32 in a module, and the edits that make an expression produce it.

The analysis says *what* would make a tensor float32 (a
:data:`~replaylint.lint.dataflow.facts.Float32Target`); this module says how that reads in this
module's source: ``torch.float32`` spelled with a name bound to torch where the fix goes
(``th.float32``), plus ``import torch`` when no such name is bound there.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    TypeAsDeviceOfOther,
)
from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.dataflow.scopes import Binding, Scope
from replaylint.lint.fixes.drafts import AddModuleImport, EditDraft, InsertAfter, Replace
from replaylint.lint.syntax.nodes import dotted_name, literal_string
from replaylint.lint.syntax.sites import Site


@dataclass(frozen=True)
class TorchSpelling:
    """How ``torch.<attribute>`` is written at one site, and what writing it needs."""

    prefix: str
    """The name bound to the torch module there (``torch``, ``th``)."""
    imports: tuple[EditDraft, ...] = ()
    """``import torch`` when nothing at the site is bound to torch."""
    safe: bool = True
    """False when the added import makes a module need torch that did not need it to import."""

    def attribute(self, name: str) -> str:
        return f"{self.prefix}.{name}"


Float32Edits = tuple[tuple[EditDraft, ...], bool]
"""The edits of a fix and whether they are safe (see :attr:`TorchSpelling.safe`)."""


class Float32Spelling:
    """How one module spells ``torch.float32`` at a site, and the edits that make values float32.

    The spelling uses a name bound to the torch module *at that site*: a function's own
    ``import torch``, a module-level import anywhere at module level (``try: import torch``,
    ``torch = pytest.importorskip("torch")``), never one under ``if TYPE_CHECKING:`` and never an
    alias that the site's function rebinds (``import torch as t`` then ``for t in ...``). With no
    such name it adds ``import torch`` at the top: safe when the module already imports torch
    unconditionally in another form (``from torch import zeros``), unsafe otherwise (the module
    would need torch to import).
    """

    def __init__(self, index: ModuleIndex) -> None:
        self.index = index
        self.module = index.module
        self._at: dict[tuple[int, ...], TorchSpelling | None] = {}

    def torch_at(self, site: Site) -> TorchSpelling | None:
        """How ``torch`` is spelled at ``site``; None when no spelling can be made to work there
        (the name ``torch`` itself is rebound and no alias is bound)."""
        key = tuple(id(scope) for scope in site.scopes)
        if key not in self._at:
            self._at[key] = self._torch_at(site)
        return self._at[key]

    def float32_at(self, site: Site) -> str:
        """``torch.float32`` as a message should show it at ``site``."""
        spelling = self.torch_at(site)
        return spelling.attribute("float32") if spelling is not None else "torch.float32"

    def edits_for(self, target: Float32Target, site: Site) -> Float32Edits | None:
        """The edits that make ``target`` produce float32, or None when there is no way."""
        edit: EditDraft
        if isinstance(target, CastMethodToFloat):
            copied = self._copying_cast(target, site)
            if copied is not None:
                return copied
            return (Replace(target.node, "float"),), True  # no torch spelling needed
        if isinstance(target, FloatTensorType):
            node = target.node
            if isinstance(node, cst.SimpleString):
                quote = node.value[0]
                return (Replace(node, f"{quote}{target.float_type}{quote}"),), True
            return (Replace(node, target.float_type),), True
        torch = self.torch_at(site)
        if torch is None:
            return None
        spelling = torch.attribute("float32")
        if isinstance(target, SetDtype):
            edit = Replace(target.node, spelling)
            if target.copying is not None and target.copying.args:
                copy = InsertAfter(target.copying.args[-1], ", copy=True")
                return (edit, copy, *torch.imports), torch.safe
        elif isinstance(target, DeviceOfOther):  # the Arg, parentheses included
            other = target.node.value
            if not isinstance(other, (cst.Name, cst.Attribute, cst.Subscript)):
                return None
            other_code = self.module.code_for_node(other)
            edit = Replace(target.node, f"{other_code}.device, {spelling}")
        elif isinstance(target, TypeAsDeviceOfOther):
            call = target.node
            other = call.args[0].value
            if not isinstance(call.func, cst.Attribute) or not isinstance(
                other, (cst.Name, cst.Attribute, cst.Subscript)
            ):
                return None
            other_code = self.module.code_for_node(other)
            renamed = (
                Replace(call.func.attr, "to"),
                Replace(call.args[0], f"{other_code}.device, {spelling}"),
            )
            return (*renamed, *torch.imports), False
        elif isinstance(target, OverrideKwargsDtype):
            # A later key wins: float32 whatever the mapping holds.
            mapping = self.module.code_for_node(target.node)
            edit = Replace(target.node, f'{{**{mapping}, "dtype": {spelling}}}')
        elif isinstance(target, CastValue):
            edit = InsertAfter(target.node, f".to({spelling})")
        else:
            assert isinstance(target, AddDtypeArgument)
            if not target.node.args:
                return None
            edit = InsertAfter(target.node.args[-1], f", dtype={spelling}")
        return (edit, *torch.imports), torch.safe

    def _copying_cast(self, target: CastMethodToFloat, site: Site) -> Float32Edits | None:
        """``t.half()`` of a held tensor as ``t.to(torch.float32, copy=True)``: a new tensor, as
        before (``t.float().clone()`` where torch cannot be spelled without an import: the same,
        at the cost of a second copy when ``t`` is not float32); None for a fresh tensor."""
        call, torch = target.call, self.torch_at(site)
        if call is None or not isinstance(call.func, cst.Attribute):
            return None
        receiver = self.module.code_for_node(call.func.value)
        if torch is None or not torch.safe or torch.imports:
            return (Replace(call, f"{receiver}.float().clone()"),), True
        spelling = torch.attribute("float32")
        return (Replace(call, f"{receiver}.to({spelling}, copy=True)"),), True

    def cast_at(self, value: cst.BaseExpression, site: Site) -> Float32Edits | None:
        """``<value>.to(torch.float32)``, parenthesised when ``value`` is not a primary."""
        torch = self.torch_at(site)
        if torch is None:
            return None
        spelling = torch.attribute("float32")
        edit: EditDraft
        if isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
            edit = InsertAfter(value, f".to({spelling})")
        else:
            edit = Replace(value, f"({self.module.code_for_node(value)}).to({spelling})")
        return (edit, *torch.imports), torch.safe

    # ------------------------------------------------------------------ finding the name
    def _torch_at(self, site: Site) -> TorchSpelling | None:
        scopes = [
            scope
            for position, scope in enumerate(site.scopes)
            if not isinstance(scope, cst.ClassDef) or position == len(site.scopes) - 1
        ]
        for depth in range(len(scopes) - 1, -1, -1):
            scope = self.index.scope(scopes[depth])
            for alias in _torch_aliases(scope):
                if not any(
                    alias in self.index.scope(inner).bindings for inner in scopes[depth + 1 :]
                ):
                    return TorchSpelling(alias)
        if any(_binds(self.index.scope(scope), "torch") for scope in scopes):
            return None  # `torch` means something else here: an added import would not help
        module_scope = self.index.scope(self.module)
        return TorchSpelling(
            "torch", (AddModuleImport("torch"),), safe=_imports_torch_unconditionally(module_scope)
        )


def _torch_aliases(scope: Scope) -> list[str]:
    """Names this scope binds to the torch module at run time, and to nothing else."""
    aliases = []
    for name, bindings in scope.bindings.items():
        runtime = [b for b in bindings if not _type_checking_only(b)]
        if (
            runtime
            and all(_is_torch_module(b) or _is_none(b) for b in runtime)
            and any(_is_torch_module(b) for b in runtime)
        ):  # `import torch` (with `torch = None` when the import failed)
            aliases.append(name)
    return sorted(aliases, key=lambda name: (name != "torch", name))


def _binds(scope: Scope, name: str) -> bool:
    return any(not _type_checking_only(b) for b in scope.bindings.get(name, ()))


def _is_torch_module(binding: Binding) -> bool:
    node = binding.node
    if binding.kind == "import" and isinstance(node, cst.ImportAlias):
        dotted = dotted_name(node.name) or ""
        if node.asname is not None:
            return dotted == "torch"
        return dotted == "torch" or dotted.startswith("torch.")  # `import torch.nn` binds torch
    if binding.kind == "assign" and isinstance(binding.value, cst.Call):
        # torch = pytest.importorskip("torch") / importlib.import_module("torch")
        called = dotted_name(binding.value.func) or ""
        args = binding.value.args
        return (
            called.rpartition(".")[2] in {"importorskip", "import_module", "__import__"}
            and len(args) >= 1
            and literal_string(args[0].value) == "torch"
        )
    return False


def _is_none(binding: Binding) -> bool:
    """``torch = None``: what an optional import binds when torch is missing."""
    return (
        binding.kind == "assign"
        and isinstance(binding.value, cst.Name)
        and binding.value.value == "None"
    )


def _type_checking_only(binding: Binding) -> bool:
    return any(
        guard.polarity
        and guard.test is not None
        and (dotted_name(guard.test) or "").rpartition(".")[2] == "TYPE_CHECKING"
        for guard in binding.guards
    )


def _imports_torch_unconditionally(module_scope: Scope) -> bool:
    """Whether importing the module already imports torch: a top-level, unguarded import of
    torch or of a name from it."""
    for bindings in module_scope.bindings.values():
        for binding in bindings:
            if binding.kind != "import" or binding.guards:
                continue
            statement = binding.statement
            if isinstance(statement, cst.SimpleStatementLine) and _statement_imports_torch(
                statement
            ):
                return True
    return False


def _statement_imports_torch(statement: cst.SimpleStatementLine) -> bool:
    for small in statement.body:
        if isinstance(small, cst.Import) and any(
            (dotted_name(alias.name) or "").partition(".")[0] == "torch" for alias in small.names
        ):
            return True
        if (
            isinstance(small, cst.ImportFrom)
            and not small.relative
            and small.module is not None
            and (dotted_name(small.module) or "").partition(".")[0] == "torch"
        ):
            return True
    return False
