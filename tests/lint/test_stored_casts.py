"""RL004 on copies of the gate ring kept in a narrower dtype: appended, put in a payload, saved
or handed out in a list, also through a loop variable over a list of gate rings."""

from __future__ import annotations

import textwrap

from replaylint.lint.engine import Linter

_SOURCE = """
import torch


class Pool:
    def export(self, idx):
        out = []
        for g in self.g_cache:
            out.append(g[idx].to(self.wire_dtype))
        return out

    def saved(self, path):
        torch.save(self.g_cache.to(torch.bfloat16), path)

    def handed_out(self, idx):
        return [g[idx].half() for g in self.g_cache]

    def payload(self, idx):
        return [{"d": d[idx], "gate": g[idx].half()} for d, g in zip(self.d_cache, self.g_cache)]

    def moved(self, idx):
        return [g[idx].to("cpu") for g in self.g_cache], torch.save(self.g_cache.float(), "x")
"""


def test_stored_casts_of_the_gate_ring_are_reported_once_each() -> None:
    findings = Linter().check(textwrap.dedent(_SOURCE), "pool.py")
    rows = [(f.location.row, f.code) for f in findings]
    assert rows == [(9, "RL004"), (13, "RL004"), (16, "RL004"), (19, "RL004")]
    assert all("and stored" in f.message for f in findings)
