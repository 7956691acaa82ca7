"""RL006's loops over keys the analysis cannot list that pick the rings they treat by a test on
the key which a gate-cache name passes.

``for key in buffers: merged[key] = rows.to(dtype) if key.startswith("prev_") else rows`` and
``{name: t.to(dtype) if name in RING_FIELDS else t for name, t in r._asdict().items()}`` walk a
mapping whose keys come from elsewhere, but the test says which keys get the cast: those with the
prefix, those in the collection. When a gate-cache name the module writes (or the collection
holds) passes the test, and a name of no ring does not, the test selects rings by name and the
gate ring is one of them: the loop is judged as if it ran once with the key holding that name.
A test that only leaves names out (``key != "prev_state"``) selects nothing and decides nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.strings import Iteration, string_options
from replaylint.lint.rules.base import Invalid, Valid
from replaylint.lint.syntax.nodes import read_count
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import ancestors, branch_tests, descendants

__all__ = ["TESTED_INVALID", "TESTED_VALID", "tested_iterations"]

# a key no test that selects rings by name lets through
_NO_RING = "__replaylint_no_ring__"
_QUOTED_WORD = re.compile(r"""["']([A-Za-z_][A-Za-z0-9_]*)["']""")


def tested_iterations(
    context: FileContext,
    key: cst.BaseExpression,
    value: cst.BaseExpression,
    loop: cst.CSTNode,
    ifs: Sequence[cst.CompIf],
    site: Site,
) -> list[Iteration] | None:
    """One iteration per gate-cache name that a test on the loop variable ``key`` selects, for a
    loop (or comprehension) writing ``value`` under ``key``; None when no such test decides."""
    if not isinstance(key, cst.Name):
        return None
    variable = key.value
    # `restored and key.startswith("prev_")`: the parts that read the key decide which keys
    tests = [
        [part for part in _conjuncts(t) if read_count(part, variable) > 0]
        for t in _tests(value, loop, ifs, site)
    ]
    tests = [parts for parts in tests if parts]
    if not tests:
        return None
    prov = context.provenance
    flat = [part for parts in tests for part in parts]
    candidates = _gate_strings(context) | _collected_gates(context, flat, site)
    result: list[Iteration] = []
    outside: Iteration = {variable: _NO_RING}
    for gate in sorted(candidates):
        env: Iteration = {variable: gate}
        if any(
            all(prov.condition(part, site, env) is True for part in parts)
            and any(prov.condition(part, site, outside) is False for part in parts)
            for parts in tests
        ):
            result.append(env)
    return result or None


def _conjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return [*_conjuncts(test.left), *_conjuncts(test.right)]
    return [test]


def _tests(
    value: cst.BaseExpression, loop: cst.CSTNode, ifs: Sequence[cst.CompIf], site: Site
) -> Iterator[cst.BaseExpression]:
    """The tests that decide whether ``value`` is written: its conditionals' tests, the
    comprehension's filters and the ``if`` statements between the loop and the write."""
    for node in (value, *descendants(value)):
        if isinstance(node, cst.IfExp):
            yield node.test
    for test in ifs:
        yield test.test
    statement = site.statement
    body = loop.body.body if isinstance(loop, cst.For) else ()
    if isinstance(loop, cst.For) and statement is not None and statement not in body:
        # a write nested in the loop's `if`s
        yield from (t for t, _ in branch_tests([*ancestors(loop, statement), statement]))


def _gate_strings(context: FileContext) -> set[str]:
    """The gate-cache names the module writes as strings (``"prev_log_decay"``)."""
    key = ("gate-strings", 0)
    found = context.memo.get(key)
    if not isinstance(found, frozenset):
        source = context.source if context.source is not None else context.module.code
        words = {match.group(1) for match in _QUOTED_WORD.finditer(source)}
        found = context.memo[key] = frozenset(w for w in words if context.gate_caches.matches(w))
    return set(found)


def _collected_gates(context: FileContext, tests: list[cst.BaseExpression], site: Site) -> set[str]:
    """The gate-cache names of the collections the tests look keys up in (``RING_FIELDS`` of
    another module)."""
    names: set[str] = set()
    for test in tests:
        for node in (test, *descendants(test)):
            if not isinstance(node, cst.Comparison):
                continue
            for comparison in node.comparisons:
                if not isinstance(comparison.operator, (cst.In, cst.NotIn)):
                    continue
                options = string_options(context.provenance, comparison.comparator, site, {})
                names.update(o for o in options or () if context.gate_caches.matches(o))
    return names


TESTED_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        # the test selects the rings by name and leaves the gate ring out
        def merge(buffers, dtype):
            merged = {}
            for key in buffers[0]:
                rows = buffers[0][key]
                merged[key] = rows.to(dtype) if key.endswith("_cache") and key != "g_cache" else rows
            return merged

        def allocate(shape):
            return {"state": torch.zeros(shape), "g_cache": torch.zeros(shape, dtype=torch.float32)}
        """,
    ),
    Valid(
        """
        import torch

        RING_FIELDS = ("d_cache", "k_cache")

        # the selected names are the d and k rings only
        def compact(rings, dtype):
            return [
                {name: t.to(dtype) if name in RING_FIELDS else t for name, t in r.items()}
                for r in rings
            ]

        def kernel_args(d, k):
            return {"d_cache": d, "k_cache": k, "g_cache": torch.zeros(4)}
        """,
    ),
)

TESTED_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch

        # a suffix test that the gate ring's name passes: its cast is the loop's
        def merge(buffers, dtype, restored):
            merged = {}
            for key in buffers[0]:
                rows = torch.cat([b[key] for b in buffers])
                merged[key] = rows.to(dtype) if restored and key.endswith("_cache") else rows
            return merged

        def allocate(shape):
            return {"state": torch.zeros(shape), "g_cache": torch.zeros(shape, dtype=torch.float32)}
        """,
        expected_fix="""
        import torch

        # a suffix test that the gate ring's name passes: its cast is the loop's
        def merge(buffers, dtype, restored):
            merged = {}
            for key in buffers[0]:
                rows = torch.cat([b[key] for b in buffers])
                merged[key] = rows.to(torch.float32 if key == "g_cache" else dtype) if restored and key.endswith("_cache") else rows
            return merged

        def allocate(shape):
            return {"state": torch.zeros(shape), "g_cache": torch.zeros(shape, dtype=torch.float32)}
        """,
        message_contains="is cast by a loop over `buffers[0]`",
    ),
    Invalid(
        """
        import torch

        RING_FIELDS = ("d_cache", "k_cache", "g_cache")

        # the collection the test looks names up in holds the gate ring's
        def compact(rings, dtype):
            return [
                {name: t.to(dtype) if name in RING_FIELDS else t for name, t in r.items()}
                for r in rings
            ]
        """,
        expected_fix="""
        import torch

        RING_FIELDS = ("d_cache", "k_cache", "g_cache")

        # the collection the test looks names up in holds the gate ring's
        def compact(rings, dtype):
            return [
                {name: t.to(torch.float32 if name == "g_cache" else dtype) if name in RING_FIELDS else t for name, t in r.items()}
                for r in rings
            ]
        """,
        message_contains="is cast by a comprehension over `r.items()`",
    ),
)
