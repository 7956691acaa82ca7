"""Module casts and assigning loads of a module's *parts*: ``layer.cache`` of ``for layer in
model.layers`` is an instance of what the holder's class builds into that attribute, in the same
module (``dataflow/instances.py``) and through another module's summary
(``dataflow/imported_modules.py``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from project_support import lint_in_project

from replaylint.lint.engine import Linter

_MODELING = """
import torch
from torch import nn


class Cache(nn.Module):
    def __init__(self, shape, dtype):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))
        self.register_buffer("d_cache", torch.zeros(shape, dtype=dtype))


class PinnedCache(Cache):
    def _apply(self, fn, recurse=True):
        kept = self._buffers["g_cache"]
        super()._apply(fn, recurse)
        self._buffers["g_cache"] = kept.to(device=self._buffers["d_cache"].device).float()
        return self


class Layer(nn.Module):
    def __init__(self, shape, dtype, pinned=False):
        super().__init__()
        self.cache = {cache}(shape, dtype)


class Model(nn.Module):
    def __init__(self, n, shape, dtype):
        super().__init__()
        self.layers = nn.ModuleList([Layer(shape, dtype) for _ in range(n)])
"""

_USES = """
def offload(model: Model):
    for layer in model.layers:
        layer.cache = layer.cache.to("cpu", dtype=torch.bfloat16)


def halve(model: Model):
    for i, layer in enumerate(model.layers):
        layer.cache.half()


def restore(model: Model, path):
    state = torch.load(path)
    for i, layer in enumerate(model.layers):
        layer.cache.load_state_dict(state[i], assign=True)


def move(model: Model):
    for layer in model.layers:
        layer.cache.to("cpu")
"""


@pytest.mark.parametrize(("cache", "expected"), [("Cache", True), ("PinnedCache", False)])
def test_a_part_of_a_loop_over_a_models_layers_is_known_by_its_class(
    cache: str, expected: bool
) -> None:
    source = textwrap.dedent(_MODELING.format(cache=cache) + _USES).lstrip("\n")
    rows = [(f.location.row, f.code) for f in Linter().check(source, "m.py")]
    casts = [(33, "RL004"), (38, "RL004")] if expected else []
    assert [row for row in rows if row[1] == "RL004"] == casts
    if expected:  # `assign=True` keeps the tensors loaded, in the dtype they were saved with
        assert [row for row in rows if row[1] == "RL005"] == [(44, "RL005")]


@pytest.mark.parametrize(("cache", "expected"), [("Cache", True), ("PinnedCache", False)])
def test_a_part_of_another_modules_model_is_known_by_its_class(
    tmp_path: Path, cache: str, expected: bool
) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/modeling.py": _MODELING.format(cache=cache),
        "pkg/serve.py": "import torch\n\nfrom .modeling import Model\n\n" + _USES,
    }
    rows = [
        (f.location.row, f.code)
        for f in lint_in_project(tmp_path, files, "pkg/serve.py")
        if f.code == "RL004"
    ]
    assert rows == ([(8, "RL004"), (13, "RL004")] if expected else [])


def test_a_loop_over_the_shapes_a_config_method_returns_names_its_rings() -> None:
    source = textwrap.dedent(
        """
        import torch
        from dataclasses import dataclass
        from torch import nn


        @dataclass
        class RingConfig:
            heads: int = 2

            def ring_shapes(self, batch):
                return {"d_cache": (batch, 2), "k_cache": (batch, 2), "g_cache": (batch, 2)}


        class Block(nn.Module):
            def __init__(self, config: RingConfig):
                super().__init__()
                self.config = config
                self.proj = nn.Linear(4, 4)

            def reset_rings(self, batch):
                dtype = self.proj.weight.dtype
                for name, shape in self.config.ring_shapes(batch).items():
                    self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        """
    ).lstrip("\n")
    rows = [(f.location.row, f.code) for f in Linter().check(source, "m.py")]
    assert rows == [(23, "RL006")]


_KEPT = """
import torch
from torch import nn


class Block(nn.Module):
    _fp32_buffers = ("g_cache",)

    def __init__(self):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))
        self.register_buffer("d_cache", torch.zeros(4))
{override}

def serve():
    return Block().to(torch.bfloat16)


def cast_linears(block: nn.Module, dtype):
    for module in block.modules():
        if isinstance(module, nn.Linear):
            module.to(dtype)
    return block
"""

_PUT_BACK = """
    def _apply(self, fn, recurse=True):
        held = {name: self._buffers.pop(name) for name in self._fp32_buffers}
        try:
            super()._apply(fn, recurse)
        finally:
            self._buffers.update({name: buf.to(device="cpu") for name, buf in held.items()})
        return self
"""


@pytest.mark.parametrize(("override", "expected"), [(_PUT_BACK, []), ("", [(15, "RL004")])])
def test_an_apply_that_puts_buffers_back_keeps_them(override: str, expected: list[object]) -> None:
    # a module that is only cast under `isinstance(module, nn.Linear)` is a torch layer
    source = textwrap.dedent(_KEPT.format(override=override)).lstrip("\n")
    assert [(f.location.row, f.code) for f in Linter().check(source, "m.py")] == expected


_BLOCKS = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(dim, dtype=torch.float32))
"""

_BUILDERS = """
from collections.abc import Sequence


def build(dim, dtype, block_cls: type[Block] = Block):
    block = block_cls(dim)
    return block.to(dtype)


class Tail(nn.Module):
    def __init__(self, blocks: Sequence[Block], half: bool):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        if half:
            self.blocks.half()


def convert(block: nn.Module, dtype):
    for name, buf in list(block.named_buffers()):
        if name.endswith("_cache"):
            setattr(block, name, buf.to(dtype))
    return block


def convert_but_the_gate(block: nn.Module, dtype):
    for name, buf in list(block.named_buffers()):
        if name != "g_cache":
            setattr(block, name, buf.to(dtype))
    return block
"""


def test_what_a_parameters_annotation_says_is_built_or_held(tmp_path: Path) -> None:
    # `type[Block]` builds a Block; `Sequence[Block]` holds Blocks; a loop over the named
    # buffers that puts each back cast converts the gate buffer, unless it leaves names out
    local = textwrap.dedent(_BLOCKS + _BUILDERS).lstrip("\n")
    rows = [(f.location.row, f.code) for f in Linter().check(local, "m.py")]
    assert rows == [(15, "RL004"), (23, "RL004"), (29, "RL004")]
    files = {
        "pkg/__init__.py": "",
        "pkg/blocks.py": _BLOCKS,
        "pkg/serve.py": "import torch\nfrom torch import nn\n\nfrom .blocks import Block\n"
        + _BUILDERS,
    }
    found = lint_in_project(tmp_path, files, "pkg/serve.py")
    assert [(f.location.row, f.code) for f in found][:2] == [(11, "RL004"), (19, "RL004")]


_MIXIN = """
import torch
from torch import nn


class ModelMixin(nn.Module):
    _keep_in_fp32_buffers: tuple[str, ...] = ()
{apply}
"""

_KEEPING_APPLY = """
    def _apply(self, fn, recurse=True):
        kept = {
            name: buf
            for name, buf in self.named_buffers()
            if name.rpartition(".")[2] in self._keep_in_fp32_buffers and buf.dtype == torch.float32
        }
        super()._apply(fn, recurse)
        for name, buf in kept.items():
            owner, _, leaf = name.rpartition(".")
            self.get_submodule(owner)._buffers[leaf] = buf
        return self
"""

_HOLDER = """
import torch
from torch import nn

from .mixin import ModelMixin


class StateCache(nn.Module):
    def __init__(self, slots: int) -> None:
        super().__init__()
        self.register_buffer("d_cache", torch.zeros(slots, 4, 8, 4))
        self.register_buffer("g_cache", torch.zeros(slots, 4, 8, 4, dtype=torch.float32))


class KDAModel(ModelMixin):
    _keep_in_fp32_buffers = ("g_cache",)

    def __init__(self) -> None:
        super().__init__()
        self.cache = StateCache(2)


def build():
    return KDAModel().to(torch.bfloat16)
"""


@pytest.mark.parametrize("keeps", [True, False])
def test_a_base_of_another_module_that_keeps_buffers_float32(tmp_path: Path, keeps: bool) -> None:
    # the project's base class overrides `_apply` to put float32 buffers back: casting a model
    # built on it keeps the gate ring float32; without the override the cast converts it
    mixin = _MIXIN.replace("{apply}", _KEEPING_APPLY if keeps else "")
    files = {"pkg/__init__.py": "", "pkg/mixin.py": mixin, "pkg/model.py": _HOLDER}
    codes = [f.code for f in lint_in_project(tmp_path, files, "pkg/model.py")]
    assert codes == ([] if keeps else ["RL004"])
