"""Dtype parameters that the module's own calls fill (``dataflow/callers.passed_dtype_facts``):
where the finding goes, and what decides the parameter."""

from __future__ import annotations

import textwrap

from replaylint.lint.engine import Linter


def _findings(source: str) -> list[tuple[int, str]]:
    text = textwrap.dedent(source).lstrip("\n")
    return [(f.location.row, f.code) for f in Linter().check(text, "m.py")]


def _fixed(source: str) -> str:
    return Linter().fix(textwrap.dedent(source).lstrip("\n"), "m.py").source


_POOL = """
import torch

class ReplayPool:
    def __init__(self, shape, dtype, gate_dtype=torch.float32):
        self.d_cache = torch.zeros(shape, dtype=dtype)
        self.k_cache = torch.zeros(shape, dtype=dtype)
        self.g_cache = torch.zeros(shape, dtype=gate_dtype)

    @classmethod
    def for_model(cls, config, shape):
        gate_dtype = {gate}
        return cls(shape, config.dtype, gate_dtype=gate_dtype)
"""


def test_every_call_passing_float32_decides_the_parameter() -> None:
    assert _findings(_POOL.format(gate="torch.float32")) == []
    source = """
        import torch

        def gate_ring(shape, dtype):
            return {"g_cache": torch.zeros(shape, dtype=dtype)}

        rings = [gate_ring((4, 16), torch.float32), gate_ring((8, 16), dtype=torch.float)]
        """
    assert _findings(source) == []


def test_a_call_that_passes_another_dtype_is_where_the_finding_goes() -> None:
    # a value the analysis cannot tell: RL002 at the caller's binding; the fix is the
    # allocation's, and the caller's local is left alone
    source = _POOL.format(gate="config.dtype")
    assert _findings(source) == [(11, "RL002")]
    (finding,) = Linter().check(textwrap.dedent(source).lstrip("\n"), "m.py")
    assert "a parameter that the call at line 12 passes as `config.dtype` (line 11)" in (
        finding.message
    )
    fixed = _fixed(source)
    assert "self.g_cache = torch.zeros(shape, dtype=torch.float32)" in fixed
    assert "gate_dtype = config.dtype" in fixed
    # a literal for a parameter read once: RL001 at the call
    literal = """
        import torch

        def ring(shape, dt):
            return {"g_cache": torch.zeros(shape, dtype=dt)}

        state = ring((4, 16), torch.bfloat16)
        """
    assert _findings(literal) == [(6, "RL001")]


def test_a_literal_for_a_gate_dtype_setting_is_reported_as_the_setting_too() -> None:
    # RL001 reports `gate_dtype = torch.bfloat16` where the caller writes it, so the
    # allocation's finding stays at the allocation, with its safe fix
    rows = _findings(_POOL.format(gate="torch.bfloat16"))
    assert (7, "RL001") in rows
    assert (11, "RL001") in rows


def test_one_caller_of_several_is_reported() -> None:
    source = """
        import torch

        def gate_ring(shape, precision):
            return {"g_cache": torch.zeros(shape, dtype=precision)}

        exact = gate_ring((4, 16), torch.float32)
        cheap = gate_ring((4, 16), torch.bfloat16)
        """
    assert _findings(source) == [(7, "RL001")]


def test_a_general_dtype_parameter_is_the_allocations_to_override() -> None:
    # `dtype` makes the d ring too: the gate ring is wrong to follow it, whoever calls
    source = """
        import torch

        def rings(shape, dtype):
            return {
                "d_cache": torch.zeros(shape, dtype=dtype),
                "g_cache": torch.zeros(shape, dtype=dtype),
            }

        state = rings((4, 16), torch.bfloat16)
        """
    assert _findings(source) == [(6, "RL002")]


def test_the_allocation_is_reported_when_the_calls_do_not_decide() -> None:
    unread = """
        import torch

        def gate_ring(shape, gate_dtype):
            return {"g_cache": torch.zeros(shape, dtype=gate_dtype)}

        state = gate_ring(**settings)
        """
    # a call whose arguments cannot be read
    assert _findings(unread) == [(4, "RL002")]
    # no call in the module: other modules' calls are not seen
    assert _findings(unread.replace("state = gate_ring(**settings)", "")) == [(4, "RL002")]
    # a call that leaves a None default: torch's default dtype, at the allocation
    left = """
        import torch

        def gate_ring(shape, gate_dtype=None):
            return {"g_cache": torch.zeros(shape, dtype=gate_dtype)}

        state = [gate_ring((4, 16)), gate_ring((4, 16), torch.bfloat16)]
        """
    assert [code for _, code in _findings(left)] == ["RL002"]
    assert _findings(left)[0][0] == 4


def test_a_none_default_that_the_function_replaces_is_not_a_dtype() -> None:
    source = """
        import torch

        class Cache:
            def __init__(self, shape, gate_dtype=None):
                if gate_dtype is None:
                    gate_dtype = torch.float32
                self.g_cache = torch.zeros(shape, dtype=gate_dtype)

        default = Cache((4, 16))
        cheap = Cache((4, 16), gate_dtype=torch.float16)
        """
    # the allocation's finding (a literal for a setting named for the gate dtype stays there)
    # and the setting's, where the call writes it
    assert _findings(source) == [(7, "RL001"), (10, "RL001")]
    assert _findings(source.replace("torch.float16", "torch.float32")) == []


_METHOD_HELPER = """
import torch

class ReplayPool:
    def __init__(self, shape, dtype):
        self.dtype = dtype
        self.k_cache = self._ring(shape)

    def _ring(self, shape):
        return torch.empty(shape, dtype=self.dtype)

    def reset(self, shape):
        self.g_cache = self._ring(shape)
"""


def test_a_method_that_allocates_with_the_instances_dtype_is_no_dtype_parameter() -> None:
    # `self.dtype` is the instance's setting, not an argument each call chooses: the gate
    # cache's allocation is reported at the call, and cast there (the method serves k_cache too)
    assert _findings(_METHOD_HELPER) == [(12, "RL002")]
    (finding,) = Linter().check(textwrap.dedent(_METHOD_HELPER).lstrip("\n"), "m.py")
    assert "`self.dtype` by `self._ring(shape)` (line 9)" in finding.message
    assert "self.g_cache = self._ring(shape).to(torch.float32)" in _fixed(_METHOD_HELPER)
