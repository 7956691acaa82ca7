"""Local bindings of one scope and which of them reach a use: a small intra-function dataflow.

A :class:`Scope` is built lazily, only for the functions (or module, or class body) where a rule
asks a question, by one walk over that scope's statements. It numbers statements in source order
and records, per name, every binding with the chain of conditional blocks it sits in. A binding
*reaches* a use when it precedes it; searching backwards from the use, the search stops at the
first binding that *dominates* the use (it sits in a block that encloses the use, so every path
to the use runs it). Guards of ``if`` blocks are kept so that a caller that knows the value of a
loop variable (``name == "g_cache"``) can prune branches that cannot run.

Approximations, chosen because they only ever widen the set of reaching bindings: loops are not
iterated (a binding later in a loop body does not reach an earlier use), ``try`` bodies and
``with`` bodies count as straight-line code, walrus targets and comprehension variables are not
recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from replaylint.lint.syntax.sites import ScopeNode

__all__ = ["Binding", "Guard", "Scope", "all_params", "build_scope", "dominates"]

BindingKind = Literal["assign", "param", "loop", "with", "import", "definition", "other"]


@dataclass(frozen=True)
class Guard:
    """A conditional block: the ``if`` test it depends on and whether the test must be true."""

    block: int
    test: cst.BaseExpression | None
    """None for blocks without a simple test (loop bodies, ``except`` handlers, ``match``)."""
    polarity: bool


@dataclass(frozen=True)
class Binding:
    """``name`` bound to ``value`` by ``statement`` (``value`` is None when not an expression)."""

    name: str
    value: cst.BaseExpression | None
    kind: BindingKind
    node: cst.CSTNode
    """The node that binds: the target, the parameter, the import alias."""
    statement: cst.CSTNode
    order: int
    guards: tuple[Guard, ...]
    scope: ScopeNode | None = None
    """The scope the binding belongs to."""


# A guard evaluator: True / False when the test's value is known under the caller's assumptions.
GuardEvaluator = Callable[[cst.BaseExpression], bool | None]


@dataclass
class Scope:
    """The bindings of one scope, in source order."""

    node: ScopeNode
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    statements: dict[int, tuple[int, tuple[Guard, ...]]] = field(default_factory=dict)
    """``id(statement)`` -> (order, guards) for every statement directly in this scope."""
    returns: list[tuple[cst.Return, cst.CSTNode]] = field(default_factory=list)
    """Every ``return`` with its statement (functions only)."""
    declared_global: set[str] = field(default_factory=set)

    def parameters(self) -> dict[str, Binding]:
        return {
            name: bindings[0]
            for name, bindings in self.bindings.items()
            if bindings and bindings[0].kind == "param"
        }

    def reaching(
        self,
        name: str,
        statement: cst.CSTNode | None,
        evaluate_guard: GuardEvaluator | None = None,
    ) -> list[Binding] | None:
        """Bindings of ``name`` that may reach ``statement``; None when this scope has none.

        An empty list means every binding before the use is impossible under the caller's
        assumptions, or the name is only bound after the use.
        """
        candidates = self.bindings.get(name)
        if not candidates or name in self.declared_global:
            return None
        if statement is None or id(statement) not in self.statements:
            # Not a statement of this scope (the use is in a nested function): any binding.
            return [b for b in candidates if _possible(b.guards, evaluate_guard)]
        order, use_guards = self.statements[id(statement)]
        reaching: list[Binding] = []
        for binding in reversed(candidates):
            if binding.order >= order:
                continue
            if not _possible(binding.guards, evaluate_guard):
                continue
            reaching.append(binding)
            if dominates(binding.guards, use_guards, evaluate_guard):
                break
        reaching.reverse()
        return reaching


def _possible(guards: Sequence[Guard], evaluate: GuardEvaluator | None) -> bool:
    if evaluate is None:
        return True
    for guard in guards:
        if guard.test is not None and evaluate(guard.test) is (not guard.polarity):
            return False
    return True


def dominates(
    binding: Sequence[Guard], use: Sequence[Guard], evaluate: GuardEvaluator | None = None
) -> bool:
    """Every path to the use runs the binding: its blocks enclose the use, or are known taken."""
    shared = 0
    while shared < min(len(binding), len(use)) and binding[shared].block == use[shared].block:
        shared += 1
    for guard in binding[shared:]:
        if guard.test is None or evaluate is None or evaluate(guard.test) is not guard.polarity:
            return False
    return True


class _ScopeBuilder:
    def __init__(self, node: ScopeNode) -> None:
        self.scope = Scope(node)
        self.order = 0
        self.blocks = 0

    def build(self) -> Scope:
        node = self.scope.node
        if isinstance(node, cst.FunctionDef):
            for param in all_params(node.params):
                self._bind(param.name.value, None, "param", param, node, -1, ())
            self._suite(node.body, ())
        elif isinstance(node, cst.ClassDef):
            self._suite(node.body, ())
        else:
            self._statements(node.body, ())
        return self.scope

    def _new_block(self, test: cst.BaseExpression | None, polarity: bool) -> Guard:
        self.blocks += 1
        return Guard(self.blocks, test, polarity)

    def _bind(
        self,
        name: str,
        value: cst.BaseExpression | None,
        kind: BindingKind,
        node: cst.CSTNode,
        statement: cst.CSTNode,
        order: int,
        guards: tuple[Guard, ...],
    ) -> None:
        binding = Binding(name, value, kind, node, statement, order, guards, self.scope.node)
        self.scope.bindings.setdefault(name, []).append(binding)

    def _suite(self, suite: cst.BaseSuite, guards: tuple[Guard, ...]) -> None:
        if isinstance(suite, cst.IndentedBlock):
            self._statements(suite.body, guards)
        elif isinstance(suite, cst.SimpleStatementSuite):
            self._simple(suite, suite.body, guards)

    def _statements(self, body: Sequence[cst.BaseStatement], guards: tuple[Guard, ...]) -> None:
        for statement in body:
            if isinstance(statement, cst.SimpleStatementLine):
                self._simple(statement, statement.body, guards)
            elif isinstance(statement, cst.BaseCompoundStatement):
                self._compound(statement, guards)

    def _number(self, statement: cst.CSTNode, guards: tuple[Guard, ...]) -> int:
        self.order += 1
        self.scope.statements[id(statement)] = (self.order, guards)
        return self.order

    def _simple(
        self,
        statement: cst.CSTNode,
        body: Sequence[cst.BaseSmallStatement],
        guards: tuple[Guard, ...],
    ) -> None:
        order = self._number(statement, guards)
        for small in body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    self._target(target.target, small.value, statement, order, guards)
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                self._target(small.target, small.value, statement, order, guards)
            elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
                self._bind(small.target.value, None, "other", small, statement, order, guards)
            elif isinstance(small, (cst.Import, cst.ImportFrom)):
                for name, alias in _imported(small):
                    self._bind(name, None, "import", alias, statement, order, guards)
            elif isinstance(small, (cst.Global, cst.Nonlocal)):
                self.scope.declared_global.update(item.name.value for item in small.names)
            elif isinstance(small, cst.Return):
                self.scope.returns.append((small, statement))

    def _target(
        self,
        target: cst.BaseExpression,
        value: cst.BaseExpression | None,
        statement: cst.CSTNode,
        order: int,
        guards: tuple[Guard, ...],
    ) -> None:
        if isinstance(target, cst.Name):
            self._bind(target.value, value, "assign", target, statement, order, guards)
        elif isinstance(target, (cst.Tuple, cst.List)):
            values: list[cst.BaseExpression | None]
            if (
                isinstance(value, (cst.Tuple, cst.List))
                and len(value.elements) == len(target.elements)
                and not any(isinstance(e, cst.StarredElement) for e in value.elements)
            ):
                values = [element.value for element in value.elements]
            else:
                values = [None] * len(target.elements)
            for element, element_value in zip(target.elements, values, strict=True):
                inner = element.value
                if isinstance(element, cst.StarredElement):
                    element_value = None
                self._target(inner, element_value, statement, order, guards)

    def _compound(self, statement: cst.BaseCompoundStatement, guards: tuple[Guard, ...]) -> None:
        order = self._number(statement, guards)
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            name = statement.name.value
            self._bind(name, None, "definition", statement, statement, order, guards)
        elif isinstance(statement, cst.If):
            self._if(statement, guards)
        elif isinstance(statement, (cst.For, cst.While)):
            body_guards = (*guards, self._new_block(None, True))
            if isinstance(statement, cst.For):
                for name, node in _target_names(statement.target):
                    self._bind(name, None, "loop", node, statement, order, body_guards)
            self._suite(statement.body, body_guards)
            if statement.orelse is not None:
                self._suite(statement.orelse.body, (*guards, self._new_block(None, True)))
        elif isinstance(statement, cst.With):
            for item in statement.items:
                if item.asname is not None:
                    for name, node in _target_names(item.asname.name):
                        value = item.item if isinstance(item.asname.name, cst.Name) else None
                        self._bind(name, value, "with", node, statement, order, guards)
            self._suite(statement.body, guards)
        elif isinstance(statement, (cst.Try, cst.TryStar)):
            self._suite(statement.body, guards)
            for handler in statement.handlers:
                handler_guards = (*guards, self._new_block(None, True))
                if handler.name is not None and isinstance(handler.name.name, cst.Name):
                    name = handler.name.name.value
                    self._bind(name, None, "other", handler, statement, order, handler_guards)
                self._suite(handler.body, handler_guards)
            if statement.orelse is not None:
                self._suite(statement.orelse.body, (*guards, self._new_block(None, True)))
            if statement.finalbody is not None:
                self._suite(statement.finalbody.body, guards)
        elif isinstance(statement, cst.Match):
            for case in statement.cases:
                self._suite(case.body, (*guards, self._new_block(None, True)))

    def _if(self, statement: cst.If, guards: tuple[Guard, ...]) -> None:
        self._suite(statement.body, (*guards, self._new_block(statement.test, True)))
        orelse = statement.orelse
        if orelse is None:
            return
        negated = (*guards, self._new_block(statement.test, False))
        if isinstance(orelse, cst.If):  # elif: numbered as a statement of the negated block
            self._number(orelse, negated)
            self._if(orelse, negated)
        else:
            self._suite(orelse.body, negated)


def all_params(params: cst.Parameters) -> Iterator[cst.Param]:
    yield from params.posonly_params
    yield from params.params
    if isinstance(params.star_arg, cst.Param):
        yield params.star_arg
    yield from params.kwonly_params
    if params.star_kwarg is not None:
        yield params.star_kwarg


def _target_names(target: cst.BaseExpression) -> Iterator[tuple[str, cst.CSTNode]]:
    if isinstance(target, cst.Name):
        yield target.value, target
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _target_names(element.value)


def _imported(statement: cst.Import | cst.ImportFrom) -> Iterator[tuple[str, cst.CSTNode]]:
    if isinstance(statement.names, cst.ImportStar):
        return
    for alias in statement.names:
        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
            yield alias.asname.name.value, alias
        elif isinstance(alias.name, cst.Name):
            yield alias.name.value, alias
        elif isinstance(alias.name, cst.Attribute):  # import a.b binds a
            root: cst.BaseExpression = alias.name
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Name):
                yield root.value, alias


def build_scope(node: ScopeNode) -> Scope:
    """Walk ``node``'s own statements (not nested functions or classes) once."""
    return _ScopeBuilder(node).build()


def function_definitions(body: Sequence[cst.BaseStatement]) -> dict[str, cst.FunctionDef]:
    """Functions defined directly in ``body`` (the last definition of a name wins)."""
    found: dict[str, cst.FunctionDef] = {}
    for statement in body:
        if isinstance(statement, cst.FunctionDef):
            found[statement.name.value] = statement
    return found


def scope_body(node: cst.Module | cst.ClassDef) -> Sequence[cst.BaseStatement]:
    if isinstance(node, cst.Module):
        return node.body
    if isinstance(node.body, cst.IndentedBlock):
        return node.body.body
    return ()
