"""Model construction for the PyTorch backend: config, meta-init dtype, weight loading."""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ._utils import str_dtype_to_torch
from .kda_mixer import KDAMixer


@dataclass
class PretrainedConfig:
    num_hidden_layers: int = 2
    num_value_heads: int = 2
    head_dim: int = 4
    replay_ring_length: int = 4
    torch_dtype: str = "bfloat16"


@contextlib.contextmanager
def model_init_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class KimiLinearForCausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        dtype = str_dtype_to_torch(config.torch_dtype)
        self.layers = nn.ModuleList([KDAMixer(i, dtype=dtype) for i in range(config.num_hidden_layers)])
        shape = (1, config.num_value_heads, config.replay_ring_length, config.head_dim)
        # Rows padded up to the CUDA-graph batch size decode into this dummy slot.
        self.register_buffer("dummy_g_cache", torch.zeros(shape, dtype=torch.float32), persistent=False)
        self.register_buffer("dummy_d_cache", torch.zeros(shape), persistent=False)


class KimiLinearForCausalLMLazyDummy(KimiLinearForCausalLM):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        shape = (1, config.num_value_heads, config.replay_ring_length, config.head_dim)
        self.dummy_g_cache = torch.empty(shape).zero_()  # expect-bug: default-dtype


class ReplayScratchRings:
    """Per-step scratch rings for the overlap scheduler, one allocation path for all three."""

    def __init__(self, config: PretrainedConfig, max_batch_size: int, dtype: torch.dtype) -> None:
        shapes = {
            "d_cache": (max_batch_size, config.num_value_heads, config.replay_ring_length, config.head_dim),
            "k_cache": (max_batch_size, 1, config.replay_ring_length, config.head_dim),
            "g_cache": (max_batch_size, config.num_value_heads, config.replay_ring_length, config.head_dim),
        }
        for name, shape in shapes.items():
            setattr(self, name, torch.zeros(shape, dtype=dtype))  # expect-bug: pool-dtype


class ReplayScratchRingsFp32Gates:
    def __init__(self, config: PretrainedConfig, max_batch_size: int, dtype: torch.dtype) -> None:
        shapes = {
            "d_cache": (max_batch_size, config.num_value_heads, config.replay_ring_length, config.head_dim),
            "k_cache": (max_batch_size, 1, config.replay_ring_length, config.head_dim),
            "g_cache": (max_batch_size, config.num_value_heads, config.replay_ring_length, config.head_dim),
        }
        for name, shape in shapes.items():
            setattr(self, name, torch.zeros(shape, dtype=torch.float32 if name == "g_cache" else dtype))


class ModelLoader:
    def __init__(self, config: PretrainedConfig) -> None:
        self.config = config

    def load(self, lazy_dummy: bool = False) -> KimiLinearForCausalLM:
        dtype = str_dtype_to_torch(self.config.torch_dtype)
        model_class = KimiLinearForCausalLMLazyDummy if lazy_dummy else KimiLinearForCausalLM
        with model_init_dtype(dtype):
            model = model_class(self.config)
        return model

    def load_and_cast(self) -> KimiLinearForCausalLM:
        """Checkpoints without a dtype are built in float32, then cast to the configured dtype."""
        model = KimiLinearForCausalLM(self.config)
        model = model.to(str_dtype_to_torch(self.config.torch_dtype))  # expect-bug: module-cast
        return model


def build_loader_default() -> dict[str, torch.Tensor]:
    return dict(ModelLoader(PretrainedConfig()).load().named_buffers())


def build_loader_lazy_dummy() -> dict[str, torch.Tensor]:
    model = ModelLoader(PretrainedConfig()).load(lazy_dummy=True)
    return {"dummy_g_cache": model.dummy_g_cache, "dummy_d_cache": model.dummy_d_cache}


def build_loader_load_and_cast() -> dict[str, torch.Tensor]:
    return dict(ModelLoader(PretrainedConfig()).load_and_cast().named_buffers())


def build_scratch_rings() -> dict[str, object]:
    return vars(ReplayScratchRings(PretrainedConfig(), 2, torch.bfloat16))


def build_scratch_rings_fp32_gates() -> dict[str, object]:
    return vars(ReplayScratchRingsFp32Gates(PretrainedConfig(), 2, torch.bfloat16))
