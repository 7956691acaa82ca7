"""Per-file state shared by the rules of one traversal: the module, settings and the findings."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from replaylint.lint.findings import Applicability
from replaylint.lint.gate_caches import GateCacheNames
from replaylint.lint.imports import ImportTable
from replaylint.lint.positions import NodePositions
from replaylint.lint.scopes import Scope, ScopeNode, build_scope
from replaylint.lint.settings import EntryPoint


@dataclass(frozen=True)
class Replace:
    """Replace ``node``'s code with ``new`` (a node rendered in the module's style, or text)."""

    node: cst.CSTNode
    new: cst.CSTNode | str


@dataclass(frozen=True)
class InsertAfter:
    """Insert ``text`` right after ``node``'s code."""

    node: cst.CSTNode
    text: str


@dataclass(frozen=True)
class AddModuleImport:
    """Insert ``import <module>`` at the top of the file, after docstring and __future__ imports."""

    module: str


EditDraft = Replace | InsertAfter | AddModuleImport


@dataclass(frozen=True)
class FixDraft:
    """A fix as a rule states it, in terms of nodes; the engine turns it into text edits."""

    message: str
    edits: tuple[EditDraft, ...]
    applicability: Applicability = Applicability.SAFE


@dataclass
class FindingDraft:
    code: str
    node: cst.CSTNode
    message: str
    fix: FixDraft | None


@dataclass
class FileContext:
    """What a rule may consult about the file under analysis, and where it reports."""

    filename: str
    module: cst.Module
    gate_caches: GateCacheNames
    entry_points: tuple[EntryPoint, ...]
    drafts: list[FindingDraft] = field(default_factory=list)
    _torch_alias: tuple[str, bool] | None = None
    _scopes: dict[int, Scope] = field(default_factory=dict)
    _imports: ImportTable | None = None
    memo: dict[str, object] = field(default_factory=dict)
    """Per-file analyses that rules share (built on first use)."""
    source: str | None = None
    """The text ``module`` was parsed from: lets positions be found without rendering it all."""
    positions: NodePositions = field(init=False)
    """Spans and statement rows of nodes, computed only for the nodes that ask."""

    def __post_init__(self) -> None:
        self.positions = NodePositions(self.module, self.source)

    def add_finding(self, code: str, node: cst.CSTNode, message: str, fix: FixDraft | None) -> None:
        self.drafts.append(FindingDraft(code, node, message, fix))

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """Fully resolved dotted names of ``node`` (``th.zeros`` -> ``{"torch.zeros"}``).

        A name no import binds resolves to itself (``x.half`` -> ``{"x.half"}``); an expression
        that is not a dotted name (a call, a subscript) resolves to nothing.
        """
        return self._import_table().resolve(node)[0]

    def imported_names(self, node: cst.CSTNode) -> set[str]:
        """Like :meth:`qualified_names`, but only for names that come from an import."""
        names, imported = self._import_table().resolve(node)
        return names if imported else set()

    def _import_table(self) -> ImportTable:
        if self._imports is None:
            self._imports = ImportTable(self.module)
        return self._imports

    def scope(self, node: ScopeNode) -> Scope:
        """The bindings of ``node``'s own body, built on first use and shared by every rule."""
        scope = self._scopes.get(id(node))
        if scope is None:
            scope = self._scopes[id(node)] = build_scope(node)
        return scope

    def line_of(self, node: cst.CSTNode) -> int:
        """``node``'s first line. Rules call this only to word a finding, so files without
        findings never pay for positions."""
        return self.positions.span(node).start.line

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


def _find_torch_alias(module: cst.Module) -> tuple[str, bool]:
    """The name a module-level ``import torch[...] [as x]`` binds, or ("torch", False)."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not isinstance(small, cst.Import):
                continue
            for alias in small.names:
                dotted = _dotted(alias.name)
                if alias.asname is not None:
                    if dotted == "torch" and isinstance(alias.asname.name, cst.Name):
                        return alias.asname.name.value, True
                elif dotted == "torch" or dotted.startswith("torch."):
                    return "torch", True
    return "torch", False


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""
