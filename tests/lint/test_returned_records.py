"""Fields of the records a policy function returns: ``self.dtypes.gate`` of ``self.dtypes =
cache_dtypes(...)``, in this module and from another module of the project."""

from __future__ import annotations

import textwrap
from pathlib import Path

from project_support import lint_in_project

from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding

_POLICY = """
    from typing import NamedTuple

    import torch

    GATE_DTYPE = torch.float32

    class CacheDtypes(NamedTuple):
        delta: torch.dtype
        gate: torch.dtype

    def cache_dtypes(model_dtype, ssm_dtype="auto"):
        if ssm_dtype == "auto":
            return CacheDtypes(delta=model_dtype, gate=GATE_DTYPE)
        return CacheDtypes(model_dtype, torch.float32)

    def narrow_dtypes(model_dtype):
        return CacheDtypes(delta=model_dtype, gate=model_dtype)
    """

_POOL = """
    class Pool:
        def __init__(self, model_dtype):
            self.dtypes = cache_dtypes(model_dtype)
            self.narrow = narrow_dtypes(model_dtype)

        def allocate(self, n):
            g_cache = torch.zeros(n, dtype=self.dtypes.gate)
            return g_cache

        def allocate_local(self, n, model_dtype):
            dtypes = cache_dtypes(model_dtype, "bf16")
            g_cache = torch.zeros(n, dtype=dtypes.gate)
            return g_cache

        def allocate_narrow(self, n):
            g_cache = torch.zeros(n, dtype=self.narrow.gate)
            return g_cache
    """


def _rows(findings: list[Finding]) -> list[tuple[int, str]]:
    return [(f.location.row, f.code) for f in findings]


def test_fields_of_records_a_function_of_the_module_returns() -> None:
    source = textwrap.dedent(_POLICY) + textwrap.dedent(_POOL)
    findings = Linter().check(source, "example.py")
    # every return of `cache_dtypes` gives the gate float32; `narrow_dtypes` does not
    assert _rows(findings) == [(35, "RL002")]


def test_fields_of_records_a_function_of_another_module_returns(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/config.py": _POLICY,
        "pkg/pool.py": "import torch\n\nfrom .config import cache_dtypes, narrow_dtypes\n"
        + textwrap.dedent(_POOL),
    }
    assert _rows(lint_in_project(tmp_path, files, "pkg/pool.py")) == [(20, "RL002")]


def test_attributes_made_from_each_other_end_the_search(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/config.py": _POLICY,
        "pkg/pool.py": """
            import torch

            from .config import cache_dtypes

            class Pool:
                def __init__(self):
                    self.a = self.b.float()
                    self.b = self.a.half()
                    self.c = self.c.float()

                def alloc(self, n):
                    g_cache = torch.zeros(n, dtype=self.a.dtype)
                    g2_cache = torch.zeros(n, dtype=self.c.dtype)
                    return g_cache, g2_cache
            """,
    }
    # answered, not lost to the recursion limit
    assert _rows(lint_in_project(tmp_path, files, "pkg/pool.py")) == [(12, "RL002")]
