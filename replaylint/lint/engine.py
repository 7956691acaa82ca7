"""The lint pipeline for one source text: learn names, check, fix.

:meth:`Linter.check` reads as the pipeline: the textual pre-filter skips texts that cannot hold a
finding; the text is parsed once (:mod:`.syntax.parse`); one traversal drives the binding walker
(:mod:`.gatecache.bindings`) and every enabled rule (:mod:`.rules`), which ask the dataflow layer
(:mod:`.dataflow`) how each gate cache got its dtype and report drafts; drafts become located
findings with text edits (:mod:`.fixes.materialise`); ``# noqa`` comments remove what they
suppress. :meth:`Linter.fix` repeats check and apply until nothing fixable is left
(:mod:`.fixes.converge`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from replaylint.lint.config.settings import Settings
from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.handed_over import handed_over
from replaylint.lint.fixes.converge import FixResult, fix_until_stable
from replaylint.lint.fixes.materialise import materialise
from replaylint.lint.gatecache.bindings import BindingReceiver, BindingWalker, GateCacheBinding
from replaylint.lint.gatecache.learning import learn_gate_cache_names
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.gatecache.prefilter import Relevance
from replaylint.lint.gatecache.siblings import sibling_names
from replaylint.lint.model import Finding, SourceError
from replaylint.lint.project.gate_buffers import (
    GENERIC_MODULE,
    MODULE_CAST_CALL,
    imports_gate_buffer_class,
)
from replaylint.lint.project.index import ProjectIndex, ProjectView
from replaylint.lint.rules.base import Rule
from replaylint.lint.rules.catalogue import RULE_NAMES
from replaylint.lint.rules.registry import ALL_RULES
from replaylint.lint.syntax.noqa import may_misfire, parse_suppressions
from replaylint.lint.syntax.parse import parse
from replaylint.lint.syntax.traversal import walk


class Linter:
    """Runs a fixed set of rules over source texts."""

    def __init__(
        self,
        settings: Settings | None = None,
        rules: Sequence[type[Rule]] = ALL_RULES,
        gate_caches: GateCacheNames | None = None,
        *,
        prefilter: bool = True,
        project: ProjectIndex | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.project = project
        """The project's modules: names imported from them resolve to their definitions."""
        self.rules = tuple(rule for rule in rules if self.settings.is_enabled(rule.CODE))
        self.prefilter = prefilter
        self.gate_caches = gate_caches or GateCacheNames(self.settings.gate_cache_patterns)

    @property
    def gate_caches(self) -> GateCacheNames:
        return self._gate_caches

    @gate_caches.setter
    def gate_caches(self, names: GateCacheNames) -> None:
        self._gate_caches = names
        self.relevance = Relevance(names, self.settings.entry_points)

    def learn(self, sources: Iterable[tuple[str, str]]) -> GateCacheNames:
        """The first pass of a run: learn gate-cache names from decode entry-point calls.

        ``sources`` are (filename, text) pairs — every file of the run, or just the stdin text.
        Whatever is passed as an entry point's gate-cache argument becomes a gate-cache name for
        the checks that follow (see :mod:`replaylint.lint.gatecache.learning`). Returns the names
        now used.
        """
        learned = learn_gate_cache_names(sources, self.settings.entry_points, self.gate_caches)
        if learned:
            self.gate_caches = self.gate_caches.with_learned(learned)
        return self.gate_caches

    def rules_for(self, filename: str) -> tuple[type[Rule], ...]:
        ignored = self.settings.ignored_for_file(Path(filename))
        if not ignored:
            return self.rules
        return tuple(r for r in self.rules if not any(r.CODE.startswith(i) for i in ignored))

    def check(self, source: str, filename: str = "<stdin>") -> list[Finding]:
        """Findings in ``source``, noqa-suppressed ones removed, sorted by position."""
        rules = self.rules_for(filename)
        if not rules or (
            self.prefilter
            and not self.relevance.may_hold_finding(source)
            and not self._may_cast_an_imported_model(source, filename)
            and not self._mentions_a_name_table(source)
        ):
            return []
        module = parse(source)
        view = ProjectView.of(self.project, filename) if self.project is not None else None
        names = self.gate_caches
        siblings = sibling_names(names, source, filename)
        if siblings:  # `alpha_rows` beside `delta_rows`, once `alpha_buffer` is the gate ring
            names = names.with_learned(siblings)
        context = FileContext(
            filename,
            module,
            names,
            self.settings.entry_points,
            source=source,
            project=view,
        )
        checkers = [rule(context) for rule in rules]
        walker = BindingWalker(
            module,
            names,
            [
                _unless_handed_over(
                    context,
                    [checker.check_binding for checker in checkers if checker.wants_bindings()],
                )
            ],
            source=source,
            imported_list=(
                (lambda name: view.index.imported_list(view.module, name))
                if view is not None
                else None
            ),
            write_receivers=[checker.check_write for checker in checkers if checker.wants_writes()],
        )
        context.site = walker.site
        try:
            walk(module, [walker, *checkers])
        except RecursionError:
            raise SourceError("the file is nested too deeply to analyse") from None
        if not context.drafts:
            return []
        findings = materialise(filename, module, context.positions, context.drafts, source)
        suppressions = parse_suppressions(source)
        return sorted((f for f in findings if not suppressions.suppresses(f)), key=Finding.sort_key)

    def _may_cast_an_imported_model(self, source: str, filename: str) -> bool:
        """A file that names no gate cache may still cast a model class of another module that
        holds one (``model.half()``): it may hold a finding when it casts a module and imports
        such a class."""
        if self.project is None:
            return False
        module = self.project.module_of(filename)
        if module is None:
            return False
        if MODULE_CAST_CALL.search(source) is None:
            # `fabric.setup_module(model)`: a helper of another module may cast it
            return self.project.calls_a_caster(module, source) and imports_gate_buffer_class(
                self.project, self.gate_caches.matches, module
            )
        if self.project.holder_names and GENERIC_MODULE.search(source) is not None:
            return True  # `model: nn.Module` or `self` in a mixin: may be a gate-buffer class
        return imports_gate_buffer_class(self.project, self.gate_caches.matches, module)

    def _mentions_a_name_table(self, source: str) -> bool:
        """A file that mentions a project constant listing a gate cache's name
        (``for field in TENSOR_FIELDS``) may make the gate cache without naming it."""
        tables = self.project.name_tables if self.project is not None else frozenset()
        return any(name in source for name in tables)

    def noqa_notes(self, source: str, filename: str = "<stdin>") -> list[str]:
        """Warnings about ``# noqa`` comments that misfire: a blanket ``# noqa RL001`` (no
        colon: it suppresses every code on its line) or an ``RL`` code that is no rule."""
        if not may_misfire(source, "RL", RULE_NAMES):
            return []
        problems = parse_suppressions(source, "RL", RULE_NAMES).problems
        return [f"{filename}:{problem.row}: {problem.message}" for problem in problems]

    def fix(self, source: str, filename: str = "<stdin>", *, unsafe: bool = False) -> FixResult:
        """Apply fixes until none is left (bounded); never returns unparsable source."""
        return fix_until_stable(lambda text: self.check(text, filename), source, unsafe=unsafe)


def _unless_handed_over(
    context: FileContext, receivers: Sequence[BindingReceiver]
) -> BindingReceiver:
    """One receiver that hands every binding to ``receivers``, but an entry of a payload that the
    function only hands to methods that copy it into tensors of their own
    (:mod:`replaylint.lint.dataflow.handed_over`), decided once per binding."""

    def receiver(binding: GateCacheBinding) -> None:
        if receivers and not handed_over(context.provenance, binding.value, binding.site):
            for receive in receivers:
                receive(binding)

    return receiver
