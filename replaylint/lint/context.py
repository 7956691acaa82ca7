"""What a rule sees of the file under analysis, and where it reports.

One :class:`FileContext` per file and traversal, shared by every rule: the module and its index
(names through imports, local bindings), the :class:`~replaylint.lint.dataflow.provenance.Provenance`
that answers dtype questions, where the traversal is now (:meth:`FileContext.site`), how float32
is spelled in this module, and the findings reported so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.scopes import Scope
from replaylint.lint.fixes.drafts import FindingDraft, FixDraft
from replaylint.lint.fixes.float32 import Float32Spelling
from replaylint.lint.gatecache.entry_points import EntryPoint
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.project.index import ProjectView
from replaylint.lint.syntax.positions import NodePositions
from replaylint.lint.syntax.sites import ScopeNode, Site


def _module_site() -> Site:
    raise RuntimeError("the traversal has not started: no site yet")


@dataclass
class FileContext:
    """What a rule may consult about the file under analysis, and where it reports."""

    filename: str
    module: cst.Module
    gate_caches: GateCacheNames
    entry_points: tuple[EntryPoint, ...]
    drafts: list[FindingDraft] = field(default_factory=list)
    source: str | None = None
    """The text ``module`` was parsed from: lets positions be found without rendering it all."""
    site: Callable[[], Site] = _module_site
    """Where the traversal is now (set by the binding walker that drives it)."""
    project: ProjectView | None = None
    """The file's view of its project (names imported from other modules), when a run has one."""
    index: ModuleIndex = field(init=False)
    positions: NodePositions = field(init=False)
    """Spans and statement rows of nodes, computed only for the nodes that ask."""
    spelling: Float32Spelling = field(init=False)
    _provenance: Provenance | None = field(default=None, init=False)
    memo: dict[tuple[str, int], object] = field(default_factory=dict, init=False)
    """What a rule computed once per scope of this file (keyed by its name and the node's id)."""

    def __post_init__(self) -> None:
        self.index = ModuleIndex(self.module, self.gate_caches, self.source)
        self.positions = NodePositions(self.module, self.source)
        self.spelling = Float32Spelling(self.index)

    @property
    def provenance(self) -> Provenance:
        """The file's dtype analysis, built on first use and shared by every rule."""
        if self._provenance is None:
            self._provenance = Provenance(self.index, self.project)
        return self._provenance

    def add_finding(self, code: str, node: cst.CSTNode, message: str, fix: FixDraft | None) -> None:
        self.drafts.append(FindingDraft(code, node, message, fix))

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """Fully resolved dotted names of ``node`` (see :meth:`ModuleIndex.qualified_names`)."""
        return self.index.qualified_names(node)

    def scope(self, node: ScopeNode) -> Scope:
        """The bindings of ``node``'s own body, built on first use and shared by every rule."""
        return self.index.scope(node)

    def line_of(self, node: cst.CSTNode) -> int:
        """``node``'s first line. Rules call this only to word a finding, so files without
        findings never pay for positions."""
        return self.positions.span(node).start.line
