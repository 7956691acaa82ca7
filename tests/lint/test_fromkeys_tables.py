"""RL006's ``dict.fromkeys`` dtype tables: reported once, where the table is made, and read by
the loops and lookups that allocate from it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from project_support import cli_rows, write_tree

from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding


def _check(source: str) -> list[Finding]:
    return Linter().check(textwrap.dedent(source), "example.py")


def test_a_table_read_by_a_loop_is_reported_at_the_table_only() -> None:
    findings = _check(
        """
        import torch

        RINGS = ("state", "d_cache", "k_cache", "g_cache")

        def host_rings(shape, dtype):
            dtypes = dict.fromkeys(RINGS, dtype)
            dtypes["state"] = torch.float32
            return {name: torch.empty(shape, dtype=dtypes[name]) for name in RINGS}
        """
    )
    assert [(f.location.row, f.code) for f in findings] == [(7, "RL006")]


def test_a_table_whose_gate_entry_is_set_apart_is_left_alone() -> None:
    assert not _check(
        """
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def host_rings(shape, dtype):
            dtypes = dict.fromkeys(RINGS, dtype)
            dtypes.update(g_cache=torch.float32)
            return {name: torch.empty(shape, dtype=dtypes[name]) for name in RINGS}

        def float_rings(shape):
            dtypes = dict.fromkeys(RINGS, torch.float32)
            return {name: torch.empty(shape, dtype=dtypes[name]) for name in RINGS}
        """
    )


def test_a_table_over_a_class_constant_of_another_module(tmp_path: Path) -> None:
    files = {
        "replaylint.toml": "",
        "pkg/__init__.py": "",
        "pkg/cache.py": """
            class ReplayCache:
                BUFFER_NAMES = ("state", "delta_ring", "key_ring", "g_cache")
            """,
        "pkg/swap.py": """
            from .cache import ReplayCache

            def host_dtypes(cache_dtype):
                return dict.fromkeys(ReplayCache.BUFFER_NAMES, cache_dtype)

            def flags():
                return dict.fromkeys(ReplayCache.BUFFER_NAMES, False)
            """,
    }
    write_tree(tmp_path, files)
    # the file names no gate cache: the class constant that lists one lets it through
    assert cli_rows(tmp_path, "--no-cache", "pkg/swap.py") == [("pkg/swap.py", 4, "RL006")]
