"""Module casts the class of whose receiver is not known from the cast alone, in whole runs.

* ``model: nn.Module`` cast by a precision wrapper, and ``self`` cast in a mixin of the model
  class, in a project whose modules register a float32 gate buffer;
* a model class whose setup method installs the gate-buffer modules into its layers after
  construction (``setup_caches``): a cast converts them only once that method has run;
* dtypes returned as a tuple by a policy function of another module with several returns.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from project_support import cli_rows, write_tree

_MODELING = """
import torch
from torch import nn


class ReplayCache(nn.Module):
    def __init__(self, slots, gate_dtype=torch.float32):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(slots, 4, dtype=gate_dtype))
        self.register_buffer("d_cache", torch.zeros(slots, 4))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.Linear(4, 4)


class Transformer(nn.Module):
    def __init__(self, n_layers):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(n_layers)])

    @classmethod
    def from_name(cls, name):
        return cls(2)

    def setup_caches(self, slots):
        for block in self.layers:
            attention = block.attention
            attention.kv_cache = ReplayCache(slots)
"""

_KEPT = """
import torch
from torch import nn


class ReplayCache(nn.Module):
    def __init__(self, slots):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(slots, 4, dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        kept = self.g_cache
        super()._apply(fn, recurse)
        self.g_cache = kept.float()
        return self
"""

_WRAPPER = """
import torch
import torch.nn as nn


class NaiveMixedPrecision:
    def __init__(self, dtype: torch.dtype = torch.float16):
        self.dtype = dtype

    def configure(self, model: nn.Module):
        model = model.to(dtype=self.dtype)
        return model

    def to_device(self, model: nn.Module, device):
        return model.to(device)
"""

_MIXIN_AND_MODEL = {
    "pkg/lora.py": """
        import torch


        class LoRALoaderMixin:
            def load_lora(self, dtype: torch.dtype) -> None:
                if dtype != torch.float32:
                    self.to(dtype=dtype)
        """,
    "pkg/model.py": """
        import torch
        from torch import nn

        from .lora import LoRALoaderMixin


        class KimiModel(nn.Module, LoRALoaderMixin):
            def __init__(self):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))
        """,
}


def _findings(root: Path, files: dict[str, str]) -> list[tuple[str, int, str]]:
    write_tree(root, {**files, "pyproject.toml": "[tool.replaylint]\n"})
    return cli_rows(root, "--no-cache")


def _package(files: dict[str, str]) -> dict[str, str]:
    return {"pkg/__init__.py": "", **files}


def test_a_cast_of_an_nn_module_parameter_is_reported_when_the_project_has_gate_buffers(
    tmp_path: Path,
) -> None:
    found = _findings(tmp_path, _package({"pkg/modeling.py": _MODELING, "pkg/amp.py": _WRAPPER}))
    assert ("pkg/amp.py", 10, "RL004") in found
    # a device move converts nothing
    assert not any(path == "pkg/amp.py" and row == 14 for path, row, _ in found)


def test_no_report_where_every_gate_buffer_class_keeps_its_buffers_float32(
    tmp_path: Path,
) -> None:
    found = _findings(tmp_path, _package({"pkg/modeling.py": _KEPT, "pkg/amp.py": _WRAPPER}))
    assert not any(path == "pkg/amp.py" for path, _, _ in found)


def test_no_report_in_a_project_without_gate_buffers(tmp_path: Path) -> None:
    plain = "import torch\nfrom torch import nn\n\nclass Mlp(nn.Module):\n    pass\n"
    found = _findings(tmp_path, _package({"pkg/modeling.py": plain, "pkg/amp.py": _WRAPPER}))
    assert found == []


def test_a_cast_of_self_in_a_mixin_of_a_gate_buffer_class_is_reported(tmp_path: Path) -> None:
    found = _findings(tmp_path, _package(_MIXIN_AND_MODEL))
    assert ("pkg/lora.py", 7, "RL004") in found


@pytest.mark.parametrize(
    ("body", "reported"),
    [
        (
            "model = Transformer.from_name(name)\n    model.setup_caches(2)\n    return model.half()",
            True,
        ),
        ("model = Transformer.from_name(name)\n    return model.half()", False),
        # handed in: its setup method may have run before
        ("model = Transformer.from_name(name)\n    model.eval()\n    return model.half()", False),
        ("return merge(name)\n\n\ndef merge(model: Transformer):\n    return model.half()", True),
    ],
    ids=["after-setup", "before-setup", "other-method", "parameter"],
)
def test_parts_a_setup_method_installs_count_once_it_has_run(
    tmp_path: Path, body: str, reported: bool
) -> None:
    loader = f"from .modeling import Transformer\n\n\ndef load(name):\n    {body}\n"
    found = _findings(tmp_path, _package({"pkg/modeling.py": _MODELING, "pkg/loader.py": loader}))
    assert (any(path == "pkg/loader.py" and code == "RL004" for path, _, code in found)) is reported


_POLICY = """
import torch


def ring_dtypes(quant_mode, dtype):
    if quant_mode == "int8":
        return dtype, dtype
    return dtype, torch.float32


def safe_ring_dtypes(quant_mode, dtype):
    if quant_mode == "int8":
        return torch.int8, torch.float32
    return dtype, torch.float32
"""

_POOL = """
import torch

from .policy import ring_dtypes, safe_ring_dtypes


def make_rings(quant_mode):
    ring_dtype, gate_dtype = ring_dtypes(quant_mode, torch.bfloat16)
    d_cache = torch.zeros(4, dtype=ring_dtype)
    g_cache = torch.zeros(4, dtype=gate_dtype)
    return d_cache, g_cache


def make_safe_rings(quant_mode):
    ring_dtype, gate_dtype = safe_ring_dtypes(quant_mode, torch.bfloat16)
    g_cache = torch.zeros(4, dtype=gate_dtype)
    return g_cache
"""


def test_an_element_of_a_tuple_that_a_policy_with_several_returns_gives(tmp_path: Path) -> None:
    found = _findings(tmp_path, _package({"pkg/policy.py": _POLICY, "pkg/pool.py": _POOL}))
    assert ("pkg/pool.py", 9, "RL002") in found or ("pkg/pool.py", 9, "RL001") in found
    assert not any(path == "pkg/pool.py" and row == 16 for path, row, _ in found)


_CONTAINER_MODEL = """
import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))


class KeptMixer(Mixer):
    def _apply(self, fn, recurse=True):
        kept = self.g_cache
        super()._apply(fn, recurse)
        self.g_cache = kept.float()
        return self


class CausalLM(nn.Module):
    def __init__(self, static):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([Mixer() for _ in range(2)])
        mixer_cls = KeptMixer if static else Mixer
        self.model.extra = mixer_cls()


class ChoiceLM(nn.Module):
    def __init__(self, static):
        super().__init__()
        mixer_cls = KeptMixer if static else Mixer
        self.mixer = mixer_cls()


class BothLM(nn.Module):
    def __init__(self, static):
        super().__init__()
        mixer_cls = WideMixer if static else Mixer
        self.mixer = mixer_cls()


class WideMixer(Mixer):
    pass


class FastModel:
    @staticmethod
    def for_inference(model):
        for module in model.modules():
            if isinstance(module, Mixer):
                module.g_cache = module.g_cache.float()
        return model
"""

_CASTS = """
import torch

from .modeling import BothLM, CausalLM, ChoiceLM, FastModel


def plain(static):
    return CausalLM(static).to(torch.bfloat16)


def recast(static):
    return FastModel.for_inference(CausalLM(static).to(torch.bfloat16))


def recast_later(static):
    model = CausalLM(static)
    model = model.half()
    return FastModel.for_inference(model)


def choice(static):
    return ChoiceLM(static).half()


def both(static):
    return BothLM(static).half()
"""


def test_layers_of_a_container_attribute_and_casts_undone_at_once(tmp_path: Path) -> None:
    found = _findings(
        tmp_path, _package({"pkg/modeling.py": _CONTAINER_MODEL, "pkg/casts.py": _CASTS})
    )
    rows = sorted(row for path, row, code in found if path == "pkg/casts.py" and code == "RL004")
    # `self.model.layers` holds the mixers; `for_inference` puts `g_cache` back to float32;
    # a choice of classes converts when one of them holds a gate buffer that a cast converts
    # (it is cast whenever that one is chosen), whether or not the other keeps its own
    assert rows == [7, 21, 25]


_NAMED = """
import torch
from torch import nn

from .modeling import Block


class Engine:
    def __init__(self, model, dtype):
        self.model = model
        self.dtype = dtype

    def prepare(self):
        self.model.to(self.dtype)


def wrap(model, dtype):
    return model.half()


def load_model(loader, path):
    model = loader(path)
    model = model.bfloat16()
    return model


def annotated(model: Block):
    return model.half()


def known():
    model = Block()
    return model.half()


def other_name(layer):
    return layer.half()


def moved(model):
    return model.to("cuda")
"""


def test_a_model_of_unknown_class_named_model_is_a_module_cast(tmp_path: Path) -> None:
    # what a project of gate-buffer models calls `model`, with nothing else to say what it is
    files = _package({"pkg/modeling.py": _MODELING, "pkg/engine.py": _NAMED})
    found = {row for path, row, code in _findings(tmp_path, files) if path == "pkg/engine.py"}
    assert found == {13, 17, 22}


def test_a_model_named_model_in_a_project_without_gate_buffers_is_not_reported(
    tmp_path: Path,
) -> None:
    plain = "import torch\nfrom torch import nn\n\nclass Block(nn.Module):\n    pass\n"
    files = _package({"pkg/modeling.py": plain, "pkg/engine.py": _NAMED})
    assert not any(path == "pkg/engine.py" for path, _, _ in _findings(tmp_path, files))


_SETUP_CACHES_MODEL = """
import torch
from torch import nn


class ReplayCache(nn.Module):
    def __init__(self, slots, ring_len, dim, dtype):
        super().__init__()
        self.register_buffer("d_cache", torch.zeros(slots, ring_len, dim, dtype=dtype))
        self.register_buffer("g_cache", torch.zeros(slots, ring_len, dim, dtype=torch.float32))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.Linear(4, 4)


class Transformer(nn.Module):
    def __init__(self, n_layer):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(n_layer))

    def setup_caches(self, slots, ring_len, cache_cls=None):
        cache_cls = cache_cls or ReplayCache
        for b in self.layers:
            b.attention.cache = cache_cls(slots, ring_len, 4, torch.bfloat16)
"""

_SETUP_CACHES_LOADER = """
import torch

from .model import Transformer


def with_caches(precision):
    model = Transformer(2)
    model.setup_caches(4, 8)
    return model.to(dtype=precision)


def caches_after_the_cast(precision):
    model = Transformer(2).to(dtype=precision)
    model.setup_caches(4, 8)
    return model
"""


def test_parts_a_method_installs_in_each_layer_from_a_class_or_its_default(
    tmp_path: Path,
) -> None:
    found = _findings(
        tmp_path,
        _package({"pkg/model.py": _SETUP_CACHES_MODEL, "pkg/loader.py": _SETUP_CACHES_LOADER}),
    )
    # `cache_cls or ReplayCache` may build a ReplayCache; caches set up after the cast are
    # allocated in their own dtypes
    assert [row for path, row, code in found if path == "pkg/loader.py"] == [9]


_ATTACH_MODEL = """
import torch
from torch import nn


class RingCache(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))


class GraphRingCache(RingCache):
    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.g_cache = self.g_cache.float()
        return self


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def attach_rings(self, n, graph=False):
        cls = GraphRingCache if graph else RingCache
        self.ring_cache = cls(n)
"""

_ATTACH_CASTS = """
import torch

from .model import Model


def graph_rings():
    model = Model()
    model.attach_rings(4, graph=True)
    return model.to(dtype=torch.bfloat16)


def plain_rings():
    model = Model()
    model.attach_rings(4, graph=False)
    return model.to(dtype=torch.bfloat16)


def chosen_by_the_caller(graph):
    model = Model()
    model.attach_rings(4, graph=graph)
    return model.to(dtype=torch.bfloat16)
"""


def test_a_choice_of_part_classes_picked_by_a_literal_argument(tmp_path: Path) -> None:
    found = _findings(
        tmp_path, _package({"pkg/model.py": _ATTACH_MODEL, "pkg/casts.py": _ATTACH_CASTS})
    )
    # `graph=True` picks the class that keeps its gate buffer float32; `graph=False` and a
    # value the analysis does not know may pick the one a cast converts
    assert [row for path, row, code in found if path == "pkg/casts.py"] == [15, 21]
