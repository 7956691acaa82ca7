"""The benchmark scripts under ``benchmarks/``, imported as modules so tests can call their parts."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(filename: str) -> types.ModuleType:
    """``benchmarks/<filename>`` as a module (registered in ``sys.modules``: its dataclasses
    need it)."""
    path = BENCHMARKS / filename
    spec = importlib.util.spec_from_file_location(f"replaylint_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
