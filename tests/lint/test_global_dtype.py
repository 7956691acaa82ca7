"""Torch's global dtype state (``set_default_dtype``, context managers that set it, autocast) and
module casts that convert a registered gate buffer."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.engine import Linter


def _findings(source: str) -> list[tuple[int, str, str]]:
    text = textwrap.dedent(source).lstrip("\n")
    return sorted((f.location.row, f.code, f.message) for f in Linter().check(text, "m.py"))


@pytest.mark.parametrize(
    ("source", "row", "says"),
    [
        # set at module level: every function's dtype-less allocation follows it
        (
            """
            import torch
            torch.set_default_dtype(torch.bfloat16)
            def build(shape):
                return {"g_cache": torch.zeros(shape)}
            """,
            4,
            "`torch.set_default_dtype(torch.bfloat16)` sets to torch.bfloat16",
        ),
        # the nearest setting before the allocation wins
        (
            """
            import torch
            def build(shape):
                torch.set_default_dtype(torch.float16)
                torch.set_default_dtype(torch.bfloat16)
                g_cache = torch.zeros(shape)
            """,
            5,
            "sets to torch.bfloat16",
        ),
        # a context manager named for what it does (vLLM's loader helper)
        (
            """
            import torch
            from vllm.model_executor.model_loader.utils import set_default_torch_dtype
            def load(model_config, shape):
                with set_default_torch_dtype(model_config.dtype):
                    g_cache = torch.empty(shape)
            """,
            5,
            "`with set_default_torch_dtype(model_config.dtype)` sets to a dtype that is not",
        ),
    ],
)
def test_the_setting_is_named(source: str, row: int, says: str) -> None:
    found = _findings(source)
    assert [(r, code) for r, code, _ in found] == [(row, "RL003")]
    assert says in found[0][2]


def test_a_float32_setting_or_none_keeps_the_plain_wording() -> None:
    # a class's code: a loader may build it under the model dtype whatever the module sets
    for source in (
        """
        import torch
        class Pool:
            def __init__(self, shape):
                torch.set_default_dtype(torch.float32)
                self.g_cache = torch.zeros(shape)
        """,
        """
        import torch
        class Pool:
            def __init__(self, shape):
                self.g_cache = torch.zeros(shape)
                torch.set_default_dtype(torch.bfloat16)
        """,
    ):
        (found,) = _findings(source)
        assert "model loaders set it to the model dtype" in found[2]


@pytest.mark.parametrize(
    "source",
    [
        # torch's own default, float32: nothing sets another one where these run
        """
        import torch
        def build(shape):
            g_cache = torch.zeros(shape)
            torch.set_default_dtype(torch.bfloat16)
            return g_cache
        """,
        """
        import contextlib
        import torch

        @contextlib.contextmanager
        def model_dtype(dtype):
            previous = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            yield
            torch.set_default_dtype(previous)

        def build(shape):
            with model_dtype(torch.bfloat16):
                weights = torch.randn(shape)
            g_cache = torch.zeros(shape)
            return weights, g_cache
        """,
        """
        import torch
        def build(shape):
            with torch.autocast("cuda"):
                g_cache = -torch.rand(shape)
            return g_cache
        """,
    ],
)
def test_a_function_outside_any_setting_allocates_float32(source: str) -> None:
    assert _findings(source) == []


def test_a_function_called_under_a_setting_or_by_a_class_inherits_it() -> None:
    found = _findings(
        """
        import torch
        from vllm.model_executor.model_loader.utils import set_default_torch_dtype

        def _gate_ring(shape):
            return torch.zeros(shape)

        def _pad_ring(shape):
            return torch.zeros(shape)

        class Layer(torch.nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.pad_g_cache = _pad_ring(shape)

        def load(dtype, shape):
            with set_default_torch_dtype(dtype):
                g_cache = _gate_ring(shape)
            return g_cache, Layer(shape)
        """
    )
    assert [(row, code) for row, code, _ in found] == [(5, "RL003"), (8, "RL003")]


@pytest.mark.parametrize(
    ("reset", "reported"),
    [("", True), ("    torch.set_default_dtype(torch.float32)\n", False)],
    ids=["after-the-setting", "after-a-float32-reset"],
)
def test_a_function_called_after_a_setting_in_its_caller_inherits_it(
    reset: str, reported: bool
) -> None:
    source = (
        "import torch\n\n\ndef rollback_rings(shape):\n"
        '    return {"delta": torch.zeros(shape), "g_cache": torch.zeros(shape)}\n\n\n'
        "def prepare(dtype, shape):\n    torch.set_default_dtype(dtype)\n"
        f"{reset}    return rollback_rings(shape)\n"
    )
    found = _findings(source)
    assert [(row, code) for row, code, _ in found] == ([(5, "RL003")] if reported else [])
    if reported:
        assert "before it calls `rollback_rings(shape)`" in found[0][2]


def test_get_default_and_autocast_dtypes() -> None:
    assert [
        c
        for _, c, _ in _findings(
            """
        import torch
        torch.set_default_dtype(torch.bfloat16)
        g_cache = torch.zeros(4, dtype=torch.get_default_dtype())
        replayssm_g = torch.zeros(4, dtype=torch.get_autocast_dtype("cuda"))
        """
        )
    ] == ["RL001", "RL002"]


_POOL = """
import torch
from torch import nn

class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))
        self.register_buffer("gate_cache", torch.zeros(4, dtype=torch.long))

class Pool(Base):
    pass
"""


@pytest.mark.parametrize(
    ("use", "reported"),
    [
        ("pool = Pool().cuda().to(torch.bfloat16)", True),
        ("pool = Pool()\npool = pool.half()", True),
        ("def f(model_dtype):\n    return Pool().to(dtype=model_dtype)", True),
        ("pool = Pool().to('cuda')", False),
        ("pool = Pool().to(torch.float32)", False),
        ("pool = Pool().long()", False),
        ("d_cache = torch.zeros(4).half()", False),
    ],
)
def test_module_casts(use: str, reported: bool) -> None:
    found = _findings(_POOL + use + "\n")
    assert [code for _, code, _ in found] == (["RL004"] if reported else [])
    if reported:
        assert "keep_fp32_gate_caches" in found[0][2]
        assert "`g_cache` (registered on line 7)" in found[0][2]


@pytest.mark.parametrize(
    "guard",
    [
        "from replaylint.guards import keep_fp32_gate_caches\n@keep_fp32_gate_caches\n",
        "import replaylint.guards\n@replaylint.guards.keep_fp32_gate_caches()\n",
    ],
)
def test_a_guarded_class_is_not_reported(guard: str) -> None:
    source = _POOL.replace("class Pool(Base):", guard + "class Pool(Base):")
    assert _findings(source + "pool = Pool().half()\n") == []


def test_an_integer_gate_buffer_is_not_converted() -> None:
    source = _POOL.replace(
        '"g_cache", torch.zeros(4, dtype=torch.float32)', '"g_ids", torch.zeros(4)'
    )
    assert _findings(source + "pool = Pool().half()\n") == []


def test_an_allocation_left_outside_the_function_s_own_default_block() -> None:
    found = _findings(
        """
        import torch
        from contextlib import contextmanager

        @contextmanager
        def torch_default_dtype(dtype):
            previous = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                yield
            finally:
                torch.set_default_dtype(previous)

        class GraphRunner:
            def allocate(self, shapes, dtype):
                with torch_default_dtype(dtype):
                    self.static_d_cache = torch.zeros(shapes["d"])
                # the gate ring is made outside the block: under the restored default
                self.static_g_cache = torch.zeros(shapes["g"])

            def allocate_under(self, shapes, dtype):
                with torch_default_dtype(dtype):
                    self.spare_g_cache = torch.zeros(shapes["g"])
        """
    )
    assert [(row, code) for row, code, _ in found] == [(22, "RL003")]
