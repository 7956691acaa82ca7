"""Loops over a module's own buffers (``self.named_buffers()``, ``self.state_dict().items()``,
``self._buffers``): one iteration per buffer the class registers under a literal name."""

from __future__ import annotations

import textwrap

import libcst as cst

from replaylint.lint.dataflow.own_buffers import registered_buffers
from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding

_CACHE = """
import numpy as np
import torch
from torch import nn


class ReplayCache(nn.Module):
    def __init__(self, n, dtype):
        super().__init__()
        self.dtype = dtype
        self.register_buffer("state", torch.zeros(n, 4, 4, dtype=torch.float32))
        self.register_buffer("d_cache", torch.zeros(n, 8, 4, dtype=dtype))
        self.register_buffer("g_cache", torch.zeros(n, 8, 4, dtype=torch.float32))
        self.write_pos = nn.Buffer(torch.zeros(n, dtype=torch.int32))
"""


def _check(methods: str) -> list[Finding]:
    return Linter().check(_CACHE + textwrap.indent(textwrap.dedent(methods), "    "), "c.py")


def test_the_names_a_class_registers() -> None:
    module = cst.parse_module(_CACHE)
    cls = next(s for s in module.body if isinstance(s, cst.ClassDef))
    assert registered_buffers(cls) == ["state", "d_cache", "g_cache", "write_pos"]


def test_a_restore_over_the_own_buffers_that_casts_every_one() -> None:
    findings = _check(
        """
        def load_snapshot(self, path):
            with np.load(path) as archive:
                for name, _ in self.named_buffers():
                    setattr(self, name, torch.from_numpy(archive[name]).to(dtype=self.dtype))

        def compact(self):
            for name, buf in self.state_dict().items():
                setattr(self, name, buf.to(self.dtype))
        """
    )
    assert [(f.code, f.location.row) for f in findings] == [("RL006", 19), ("RL006", 23)]
    fixed = (
        Linter()
        .fix(
            _CACHE
            + textwrap.indent(
                textwrap.dedent("""
        def compact(self):
            for name, buf in self.state_dict().items():
                setattr(self, name, buf.to(self.dtype))
        """),
                "    ",
            ),
            "c.py",
            unsafe=True,
        )
        .source
    )
    assert 'buf.to(torch.float32 if name == "g_cache" else self.dtype)' in fixed


def test_walks_that_keep_or_copy_the_gate_buffer_are_left_alone() -> None:
    assert not _check(
        """
        def keep(self):
            for name, buf in self.named_buffers():
                setattr(self, name, buf.to(self.dtype) if name != "g_cache" else buf)

        def swap_in(self, slot, saved):
            for name, buf in self.named_buffers():
                buf[slot] = saved[name]

        def offload(self):
            return {name: buf.to("cpu") for name, buf in self._buffers.items()}
        """
    )


def test_a_cast_of_every_own_buffer_is_one_module_cast() -> None:
    findings = _check(
        """
        def save_half(self, path):
            torch.save({name: buf.half() for name, buf in self.named_buffers()}, path)
        """
    )
    assert [f.code for f in findings] == ["RL004"]
