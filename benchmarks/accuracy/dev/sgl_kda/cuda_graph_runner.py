"""Static decode buffers for CUDA-graph capture: the kernel reads them through a dataclass."""

import dataclasses
from dataclasses import dataclass

import torch

from .configs import KimiLinearCacheParams
from .kda_backend import CAPTURED, fused_recurrent_kda_replayssm_decode
from .memory_pool import MambaPool
from .server_args import ServerArgs, replay_ring_dtype_from_args, replay_ring_dtype_from_args_fp32_gates


@dataclass
class DecodeStateArgs:
    initial_state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    ssm_state_indices: torch.Tensor
    write_pos: torch.Tensor


class KDACudaGraphRunner:
    def __init__(self, pool: MambaPool, max_bs: int) -> None:
        self.pool = pool
        self.max_bs = max_bs
        self.cache_indices = torch.zeros(max_bs, dtype=torch.int32)
        self.write_pos = torch.zeros(max_bs, dtype=torch.int32)

    def capture_args(self, layer_id: int) -> DecodeStateArgs:
        layer_cache = self.pool.mamba2_layer_cache(layer_id)
        return DecodeStateArgs(
            initial_state=layer_cache.temporal,
            d_cache=layer_cache.replay_d,
            k_cache=layer_cache.replay_k,
            g_cache=layer_cache.replay_g,
            ssm_state_indices=self.cache_indices,
            write_pos=self.write_pos,
        )

    def capture_args_graph_dtype(self, layer_id: int, graph_dtype: torch.dtype) -> DecodeStateArgs:
        """Graphs captured for a low-precision state read every state buffer in that dtype."""
        layer_cache = self.pool.mamba2_layer_cache(layer_id)
        return DecodeStateArgs(
            initial_state=layer_cache.temporal.to(graph_dtype),
            d_cache=layer_cache.replay_d,
            k_cache=layer_cache.replay_k,
            g_cache=layer_cache.replay_g.to(graph_dtype),  # expect-bug: decode-arg
            ssm_state_indices=self.cache_indices,
            write_pos=self.write_pos,
        )

    def replay(self, args: DecodeStateArgs, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = mixed_qkv.new_empty(mixed_qkv.shape[0], 1, 2, 4)
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, torch.zeros(2), torch.zeros(2, 4), 0.5, out=out, **dataclasses.asdict(args)
        )
        return out


def pool_from_server_args(server_args: ServerArgs, fp32_gates: bool) -> MambaPool:
    ring_dtype = (
        replay_ring_dtype_from_args_fp32_gates(server_args)
        if fp32_gates
        else replay_ring_dtype_from_args(server_args)
    )
    params = KimiLinearCacheParams(ring_dtype=ring_dtype)
    return MambaPool(server_args.max_running_requests, params, "cpu")


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(2, 16).bfloat16(), torch.randn(2, 2, 4).bfloat16(), torch.randn(2, 2).bfloat16()


def build_graph_replay() -> dict[str, torch.Tensor]:
    runner = KDACudaGraphRunner(pool_from_server_args(ServerArgs(), fp32_gates=True), 2)
    runner.replay(runner.capture_args(0), *_inputs())
    return dict(CAPTURED)


def build_graph_replay_bf16_state() -> dict[str, torch.Tensor]:
    runner = KDACudaGraphRunner(pool_from_server_args(ServerArgs(), fp32_gates=True), 2)
    runner.replay(runner.capture_args_graph_dtype(0, torch.bfloat16), *_inputs())
    return dict(CAPTURED)


def build_pool_from_server_args() -> dict[str, torch.Tensor]:
    pool = pool_from_server_args(ServerArgs(), fp32_gates=False)
    return {"replay_d": pool.mamba_cache.replay_d, "replay_g": pool.mamba_cache.replay_g}


def build_pool_from_server_args_fp32_gates() -> dict[str, torch.Tensor]:
    pool = pool_from_server_args(ServerArgs(replay_ring_dtype="float16"), fp32_gates=True)
    return {"replay_d": pool.mamba_cache.replay_d, "replay_g": pool.mamba_cache.replay_g}
