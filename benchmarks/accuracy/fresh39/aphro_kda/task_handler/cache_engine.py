"""CacheEngine class for managing the ReplaySSM caches of the KDA layers."""
import math
from dataclasses import dataclass, fields
from typing import Dict, List, Optional

import torch

from ..common.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig
from ..common.logger import init_logger
from ..common.utils import KDA_RING_NAMES, get_dtype_size, is_pin_memory_available
from ..modeling.layers.quantization import get_kv_cache_method
from ..modeling.model_loader.loader import _get_quantization_config

logger = init_logger(__name__)


@dataclass
class KDALayerCache:
    """One layer's cache over all blocks (a block is one sequence slot)."""

    ssm_state: torch.Tensor
    delta_cache: torch.Tensor
    key_cache: torch.Tensor
    alpha_log_cache: torch.Tensor

    def kernel_kwargs(self) -> Dict[str, torch.Tensor]:
        return {"initial_state": self.ssm_state, "d_cache": self.delta_cache, "k_cache": self.key_cache, "g_cache": self.alpha_log_cache}

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def block(self, index: int) -> Dict[str, torch.Tensor]:
        return {name: t[index] for name, t in self.tensors().items()}


class CacheEngine:
    """Allocates the device cache and the host swap space, and moves blocks between them."""

    def __init__(
        self,
        cache_config: CacheConfig,
        model_config: ModelConfig,
        parallel_config: ParallelConfig,
        device_config: DeviceConfig,
    ) -> None:
        self.cache_config = cache_config
        self.model_config = model_config
        self.device = device_config.torch_device
        self.shapes = model_config.get_kda_shapes(cache_config)
        self.ring_shapes = self.shapes.ring_shapes()
        self.num_layers = model_config.get_num_layers(parallel_config)
        self.dtype = model_config.dtype
        self.num_gpu_blocks = cache_config.num_gpu_blocks or 0
        self.num_cpu_blocks = cache_config.num_cpu_blocks or 0
        self.kv_cache_method = get_kv_cache_method(_get_quantization_config(model_config))
        if cache_config.cache_dtype != "auto":
            self.ring_dtypes = cache_config.ring_dtypes(self.dtype)
        else:
            self.ring_dtypes = self.kv_cache_method.ring_dtypes(self.dtype)  # expect-bug: imported-policy id=int8-rings
        self.gpu_cache = self._allocate_gpu_cache()
        self.write_pos = torch.zeros(self.num_gpu_blocks, dtype=torch.int32, device=self.device)
        self.cpu_cache = self._allocate_swap_cache() if self.num_cpu_blocks else []
        self.cpu_write_pos = torch.zeros(self.num_cpu_blocks, dtype=torch.int32)
        logger.info("# GPU blocks: %d, # CPU blocks: %d, ring dtypes %s", self.num_gpu_blocks, self.num_cpu_blocks, self.ring_dtypes)

    def _allocate_gpu_cache(self) -> List[KDALayerCache]:
        caches = []
        for _ in range(self.num_layers):
            tensors = {
                name: torch.zeros((self.num_gpu_blocks, *shape), dtype=self.ring_dtypes[name], device=self.device)
                for name, shape in self.ring_shapes.items()
            }
            caches.append(KDALayerCache(**tensors))
        return caches

    def _allocate_swap_cache(self) -> List[KDALayerCache]:
        pin_memory = is_pin_memory_available()
        caches = []
        for _ in range(self.num_layers):
            tensors: Dict[str, torch.Tensor] = {}
            for name, shape in self.ring_shapes.items():
                dtype = torch.float32 if name == "ssm_state" else self.dtype
                tensors[name] = torch.zeros((self.num_cpu_blocks, *shape), dtype=dtype, pin_memory=pin_memory)  # expect-bug: pool-dtype
            caches.append(KDALayerCache(**tensors))
        return caches

    def _swap(self, src: List[KDALayerCache], dst: List[KDALayerCache], src_to_dst: Dict[int, int]) -> None:
        for src_layer, dst_layer in zip(src, dst):
            for name in KDA_RING_NAMES:
                s, d = getattr(src_layer, name), getattr(dst_layer, name)
                for src_block, dst_block in src_to_dst.items():
                    d[dst_block].copy_(s[src_block], non_blocking=True)

    def swap_in(self, src_to_dst: Dict[int, int]) -> None:
        self._swap(self.cpu_cache, self.gpu_cache, src_to_dst)
        for src_block, dst_block in src_to_dst.items():
            self.write_pos[dst_block] = self.cpu_write_pos[src_block]

    def swap_out(self, src_to_dst: Dict[int, int]) -> None:
        self._swap(self.gpu_cache, self.cpu_cache, src_to_dst)
        for src_block, dst_block in src_to_dst.items():
            self.cpu_write_pos[dst_block] = self.write_pos[src_block]

    def copy(self, src_to_dsts: Dict[int, List[int]]) -> None:
        """Copies blocks on the device (forked sequences share a prefix state)."""
        for layer in self.gpu_cache:
            for tensor in layer.tensors().values():
                for src, dsts in src_to_dsts.items():
                    for dst in dsts:
                        tensor[dst].copy_(tensor[src])
        for src, dsts in src_to_dsts.items():
            for dst in dsts:
                self.write_pos[dst] = self.write_pos[src]

    def grow(self, extra_blocks: int) -> None:
        """Adds ``extra_blocks`` empty slots to the device cache, keeping the existing ones."""
        total = self.num_gpu_blocks + extra_blocks
        for index, layer in enumerate(self.gpu_cache):
            grown = {}
            for name, old in layer.tensors().items():
                new = old.new_zeros((total, *old.shape[1:]))
                new[: old.shape[0]].copy_(old)
                grown[name] = new
            self.gpu_cache[index] = KDALayerCache(**grown)
        self.write_pos = torch.cat([self.write_pos, self.write_pos.new_zeros(extra_blocks)])
        self.num_gpu_blocks = total

    @staticmethod
    def get_cache_block_size(cache_config: CacheConfig, model_config: ModelConfig, parallel_config: ParallelConfig) -> int:
        shapes = model_config.get_kda_shapes(cache_config)
        dtypes = cache_config.ring_dtypes(model_config.dtype)
        per_layer = 0
        for name, shape in shapes.ring_shapes().items():
            per_layer += math.prod(shape) * get_dtype_size(dtypes[name])
        return per_layer * model_config.get_num_layers(parallel_config)


def _engine(num_gpu_blocks: int = 3, num_cpu_blocks: int = 0, **model_kwargs) -> CacheEngine:
    cache_config = CacheConfig(num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, swap_space=0.001 * bool(num_cpu_blocks))
    model_config = ModelConfig("kimi-linear-tiny", dtype="bfloat16", **model_kwargs)
    return CacheEngine(cache_config, model_config, ParallelConfig(), DeviceConfig("cpu"))


def _fill(engine: CacheEngine) -> None:
    torch.manual_seed(0)
    for layer in engine.gpu_cache:
        for tensor in layer.tensors().values():
            tensor.copy_(torch.randn(tensor.shape))


def build_cache_engine_default() -> Dict[str, object]:
    engine = _engine()
    return {"gpu_cache": engine.gpu_cache, "write_pos": engine.write_pos}


def build_cache_engine_fp8_kv() -> Dict[str, object]:
    engine = _engine(quantization="fp8")
    _fill(engine)
    return {"gpu_cache": engine.gpu_cache}


def build_cache_engine_int8_kv() -> Dict[str, object]:
    engine = _engine(quantization="int8_kv")
    return {"gpu_cache": engine.gpu_cache}


def build_swap_roundtrip() -> Dict[str, object]:
    engine = _engine(num_gpu_blocks=3, num_cpu_blocks=2)
    _fill(engine)
    engine.write_pos.copy_(torch.tensor([1, 3, 2], dtype=torch.int32))
    engine.swap_out({0: 1, 2: 0})
    for layer in engine.gpu_cache:
        for tensor in layer.tensors().values():
            tensor[0].zero_()
    engine.swap_in({1: 0})
    return {"gpu_cache": engine.gpu_cache, "cpu_cache": engine.cpu_cache, "write_pos": engine.write_pos}


def build_grown_cache() -> Dict[str, object]:
    engine = _engine(num_gpu_blocks=2)
    _fill(engine)
    engine.copy({0: [1]})
    engine.grow(2)
    return {"gpu_cache": engine.gpu_cache, "write_pos": engine.write_pos}
