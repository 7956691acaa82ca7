"""Decode through the pool with the ReplaySSM kernel (sglang's attention backend shape)."""

import functools
from typing import Any, Optional

import torch

from .memory_pool import HybridMambaPool
from .state_params import KimiLinearStateParams

KERNEL_ARGS: dict[str, torch.Tensor] = {}


def fused_recurrent_kda_replayssm_decode(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor,
    g_cache: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None, use_qk_l2norm_in_kernel: bool = False,
    lower_bound: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    KERNEL_ARGS.clear()
    KERNEL_ARGS.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache)
    return out.zero_(), initial_state


class KimiLinearAttnBackend:
    def __init__(self, pool: HybridMambaPool, fp16_kernel: bool = False) -> None:
        self.pool = pool
        self.fp16_kernel = fp16_kernel
        self.A_log = torch.zeros(2)
        self.dt_bias = torch.zeros(2, 4)

    def forward_decode(self, layer_id: int, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       cache_indices: torch.Tensor) -> torch.Tensor:
        layer_cache = self.pool.layer_cache(layer_id)
        out = mixed_qkv.new_empty(mixed_qkv.shape[0], 1, 2, 4)
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, self.A_log, self.dt_bias, 0.5,
            initial_state=layer_cache.temporal,
            d_cache=layer_cache.d_ring,
            k_cache=layer_cache.k_ring,
            g_cache=layer_cache.gate_ring.half() if self.fp16_kernel else layer_cache.gate_ring,  # expect-bug: cast
            out=out,
            ssm_state_indices=cache_indices.int(),
            write_pos=torch.zeros_like(cache_indices, dtype=torch.int32),
        )
        return out

    def decode_fn_for_graph(self, layer_id: int, graph_dtype: torch.dtype) -> Any:
        """Binds the state buffers once; the captured graph replays with new activations."""
        layer_cache = self.pool.layer_cache(layer_id)
        return functools.partial(
            fused_recurrent_kda_replayssm_decode,
            initial_state=layer_cache.temporal,
            d_cache=layer_cache.d_ring,
            k_cache=layer_cache.k_ring,
            g_cache=layer_cache.gate_ring.to(graph_dtype),  # expect-bug: decode-arg
        )

    def decode_fn_for_graph_fp32(self, layer_id: int) -> Any:
        layer_cache = self.pool.layer_cache(layer_id)
        return functools.partial(
            fused_recurrent_kda_replayssm_decode,
            initial_state=layer_cache.temporal,
            d_cache=layer_cache.d_ring,
            k_cache=layer_cache.k_ring,
            g_cache=layer_cache.gate_ring,
        )


def _inputs() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "mixed_qkv": torch.randn(2, 16).bfloat16(),
        "a": torch.randn(2, 2, 4).bfloat16(),
        "b": torch.randn(2, 2).bfloat16(),
    }


def _graph_replay(fn: Any, backend: KimiLinearAttnBackend) -> dict[str, torch.Tensor]:
    inputs = _inputs()
    out = torch.empty(2, 1, 2, 4).bfloat16()
    index = torch.tensor([1, 2], dtype=torch.int32)
    fn(inputs["mixed_qkv"], inputs["a"], inputs["b"], backend.A_log, backend.dt_bias, 0.5, out=out,
       ssm_state_indices=index, write_pos=torch.zeros_like(index))
    return dict(KERNEL_ARGS)


def build_decode() -> dict[str, torch.Tensor]:
    backend = KimiLinearAttnBackend(HybridMambaPool(3, KimiLinearStateParams()))
    backend.forward_decode(0, **_inputs(), cache_indices=torch.tensor([1, 2]))
    return dict(KERNEL_ARGS)


def build_decode_fp16_kernel() -> dict[str, torch.Tensor]:
    backend = KimiLinearAttnBackend(HybridMambaPool(3, KimiLinearStateParams()), fp16_kernel=True)
    backend.forward_decode(0, **_inputs(), cache_indices=torch.tensor([1, 2]))
    return dict(KERNEL_ARGS)


def build_graph_decode_bf16() -> dict[str, torch.Tensor]:
    backend = KimiLinearAttnBackend(HybridMambaPool(3, KimiLinearStateParams()))
    return _graph_replay(backend.decode_fn_for_graph(1, torch.bfloat16), backend)


def build_graph_decode_fp32() -> dict[str, torch.Tensor]:
    backend = KimiLinearAttnBackend(HybridMambaPool(3, KimiLinearStateParams()))
    return _graph_replay(backend.decode_fn_for_graph_fp32(1), backend)
