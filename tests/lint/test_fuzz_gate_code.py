"""Property tests over generated gate-cache code (:func:`fuzz_strategies.gate_cache_programs`).

For every generated module: linting never raises (an internal error would be reported, never
raised), ``--fix`` output parses and is idempotent, changes nothing outside the fixed statements
and leaves no fixable finding, and the pre-filter hides no finding.

CI runs a small, derandomized budget (the same examples every run, no example database).
Deep mode: ``REPLAYLINT_FUZZ_EXAMPLES=<n>`` runs n randomized examples per test, e.g.
``REPLAYLINT_FUZZ_EXAMPLES=5000 python -m pytest tests/lint/test_fuzz_gate_code.py -q``.
A failure prints the minimal program; keep it in ``test_fuzz_regressions.py``.
"""

from __future__ import annotations

from fuzz_strategies import Program, gate_cache_programs
from fuzz_support import (
    assert_check_properties,
    assert_fix_properties,
    assert_prefilter_hides_nothing,
    fuzz_settings,
)
from hypothesis import given


@fuzz_settings(40)
@given(gate_cache_programs())
def test_linting_generated_gate_code_never_raises(program: Program) -> None:
    assert_check_properties(program.source)


@fuzz_settings(40)
@given(gate_cache_programs())
def test_safe_fixes_of_generated_gate_code_are_sound(program: Program) -> None:
    assert_fix_properties(program.source)


@fuzz_settings(20)
@given(gate_cache_programs())
def test_unsafe_fixes_of_generated_gate_code_are_sound(program: Program) -> None:
    assert_fix_properties(program.source, unsafe=True)


@fuzz_settings(40)
@given(gate_cache_programs())
def test_prefilter_hides_no_finding_in_generated_gate_code(program: Program) -> None:
    assert_prefilter_hides_nothing(program.source)
