"""find_gate_caches / assert_fp32_gate_caches: every gate cache in an object graph, with its path."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from replaylint.guards import (  # noqa: E402
    FoundGateCache,
    GateCacheDtypeError,
    assert_fp32_gate_caches,
    find_gate_caches,
)

F32 = torch.float32
BF16 = torch.bfloat16


class Attn(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(2, dtype=dtype), persistent=False)
        self.register_buffer("k_cache", torch.zeros(2, dtype=BF16))


class Layer(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.attn = Attn(dtype)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(BF16 if i == 3 else F32) for i in range(5))


class Pool:
    """A cache pool: plain attributes."""

    def __init__(self) -> None:
        self.state = torch.zeros(2, dtype=BF16)
        self.g_cache = torch.zeros(2, dtype=torch.float16)
        self.owner = self  # cycles are walked once


class SlottedPool:
    __slots__ = ("d_cache", "gate_cache")

    def __init__(self) -> None:
        self.d_cache = torch.zeros(1, dtype=BF16)
        self.gate_cache = torch.zeros(1, dtype=BF16)


@dataclasses.dataclass
class Caches:
    d_cache: Any
    g_cache: Any
    extra: dict[str, Any]


def test_the_path_names_the_layer_as_module_names_do() -> None:
    model = Model()
    found = find_gate_caches(model)
    assert [entry.path for entry in found] == [f"model.layers.{i}.attn.g_cache" for i in range(5)]
    assert all(isinstance(entry, FoundGateCache) for entry in found)
    assert found[3].tensor is model.layers[3].attn.g_cache
    with pytest.raises(GateCacheDtypeError) as info:
        assert_fp32_gate_caches(model)
    message = str(info.value)
    assert "1 of 5 ReplaySSM gate caches in model are not torch.float32" in message
    assert "\n  model.layers.3.attn.g_cache: torch.bfloat16\n" in message
    assert "keep_fp32_gate_caches(model)" in message
    assert "k_cache" not in message


def test_pools_dicts_lists_tuples_and_dataclasses() -> None:
    obj = {
        "pool": Pool(),
        "slotted": SlottedPool(),
        "per_layer": Caches(torch.zeros(1), [torch.zeros(1), torch.zeros(1, dtype=BF16)], {}),
        "g_caches": (torch.zeros(1), torch.zeros(1, dtype=torch.float64)),
        "caches": [{"g_cache": torch.zeros(1, dtype=BF16), "d_cache": torch.zeros(1, dtype=BF16)}],
    }
    found = [str(entry) for entry in find_gate_caches(obj, root="cfg")]
    assert found == [
        "cfg['pool'].g_cache: torch.float16",
        "cfg['slotted'].gate_cache: torch.bfloat16",
        "cfg['per_layer'].g_cache[0]: torch.float32",
        "cfg['per_layer'].g_cache[1]: torch.bfloat16",
        "cfg['g_caches'][0]: torch.float32",
        "cfg['g_caches'][1]: torch.float64",
        "cfg['caches'][0]['g_cache']: torch.bfloat16",
    ]
    with pytest.raises(GateCacheDtypeError, match=r"5 of 7 ReplaySSM gate caches in cfg"):
        assert_fp32_gate_caches(obj, root="cfg")


def test_finding_none_is_an_error_unless_allowed() -> None:
    with pytest.raises(LookupError, match=r"found no gate cache in model.*extend_gate_cache_names"):
        assert_fp32_gate_caches(nn.Linear(2, 2))
    assert assert_fp32_gate_caches(nn.Linear(2, 2), allow_none=True) == []


def test_extra_and_replacement_names() -> None:
    obj = {"decay_ring": torch.zeros(1, dtype=BF16), "g_cache": torch.zeros(1, dtype=BF16)}
    assert [e.path for e in find_gate_caches(obj, extend_gate_cache_names=["decay_*"])] == [
        "model['decay_ring']",
        "model['g_cache']",
    ]
    assert [e.path for e in find_gate_caches(obj, gate_cache_names=["decay_ring"])] == [
        "model['decay_ring']"
    ]


def test_all_float32_returns_what_it_found() -> None:
    model = Model()
    model.layers[3].attn.g_cache = torch.zeros(2)
    assert len(assert_fp32_gate_caches(model)) == 5


def test_the_walk_does_not_enter_foreign_objects_or_tensors() -> None:
    class Holder:
        def __init__(self) -> None:
            self.device = torch.device("cpu")
            self.fn = print
            self.g_cache = None  # not allocated yet: nothing to report
            self.optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)

    assert find_gate_caches(Holder()) == []


def test_gate_cache_names_come_from_the_linter_through_one_module() -> None:
    import importlib
    from pathlib import Path

    import replaylint.guards
    from replaylint.guards import _names

    folder = Path(replaylint.guards.__file__).parent
    importers = sorted(
        path.name for path in folder.glob("*.py") if "replaylint.lint" in path.read_text()
    )
    assert importers == ["_names.py"]
    linter = importlib.import_module(_names.GateCacheNames.__module__)
    assert linter.__name__.startswith("replaylint.lint")
    assert linter.GateCacheNames is _names.GateCacheNames
    patterns = _names.gate_cache_patterns(None, (), where="test")
    assert patterns == linter.DEFAULT_GATE_CACHE_PATTERNS
    names = _names.names_for(patterns)
    for name in ("g_cache", "G_Caches", "__gate_cache", "replayssm_g", "layer3_g_cache"):
        assert names.matches(name), name
    for name in ("k_cache", "gcache", "g_cache_len"):
        assert not names.matches(name), name


def test_importing_the_linters_gate_cache_names_needs_no_torch() -> None:
    import subprocess
    import sys

    from replaylint.guards import _names

    code = (
        f"import sys; import {_names.GateCacheNames.__module__}; "
        "assert 'torch' not in sys.modules and 'libcst' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
