"""The mamba-style pool that holds each request's KDA state and replay rings."""

from dataclasses import dataclass
from typing import Optional

import torch

from .environ import ring_dtype_from_env
from .state_params import KimiLinearStateParams


@dataclass(frozen=True, kw_only=True)
class LayerCache:
    temporal: torch.Tensor
    d_ring: torch.Tensor
    k_ring: torch.Tensor
    gate_ring: torch.Tensor


class HybridMambaPool:
    def __init__(self, size: int, params: KimiLinearStateParams, device: str = "cpu",
                 draft_tokens: Optional[int] = None, one_ring_dtype: bool = False,
                 gate_dtype: Optional[torch.dtype] = None) -> None:
        n = len(params.layers)
        self.size = size
        self.temporal = torch.zeros((n, size + 1) + params.temporal_shape, dtype=params.dtype.temporal, device=device)
        shapes = params.ring_shapes
        rings: dict[str, torch.Tensor] = {}
        if one_ring_dtype:
            ring_dtype = ring_dtype_from_env()
            for name, shape in shapes.items():
                rings[name] = torch.zeros((n, size + 1) + shape, dtype=ring_dtype, device=device)  # expect-bug: pool-dtype
        else:
            rings["d_ring"] = torch.zeros((n, size + 1) + shapes["d_ring"], dtype=ring_dtype_from_env(), device=device)
            rings["k_ring"] = torch.zeros((n, size + 1) + shapes["k_ring"], dtype=ring_dtype_from_env(), device=device)
            rings["gate_ring"] = torch.zeros(
                (n, size + 1) + shapes["gate_ring"],
                dtype=params.gate_ring_dtype if gate_dtype is None else gate_dtype,  # expect-bug: container id=sr-prop; imported-policy id=sr-args
                device=device,
            )
        self.d_ring, self.k_ring, self.gate_ring = rings["d_ring"], rings["k_ring"], rings["gate_ring"]
        self.draft_gate_ring: Optional[torch.Tensor] = None
        if draft_tokens is not None:
            self.draft_gate_ring = self.d_ring.new_zeros((n, size + 1, draft_tokens) + shapes["gate_ring"])  # expect-bug: like
        self.free = list(range(1, size + 1))

    def layer_cache(self, layer_id: int) -> LayerCache:
        return LayerCache(
            temporal=self.temporal[layer_id], d_ring=self.d_ring[layer_id], k_ring=self.k_ring[layer_id],
            gate_ring=self.gate_ring[layer_id],
        )

    def alloc(self, n: int) -> torch.Tensor:
        taken, self.free = self.free[:n], self.free[n:]
        index = torch.tensor(taken, dtype=torch.int64)
        self.gate_ring[:, index] = 0.0
        return index

    def fork(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for ring in (self.temporal, self.d_ring, self.k_ring, self.gate_ring):
            ring[:, dst] = ring[:, src]


def _pool_tensors(pool: HybridMambaPool) -> dict[str, object]:
    return {
        "temporal": pool.temporal,
        "d_ring": pool.d_ring,
        "k_ring": pool.k_ring,
        "gate_ring": pool.gate_ring,
        "draft_gate_ring": pool.draft_gate_ring,
    }


def build_pool() -> dict[str, object]:
    pool = HybridMambaPool(3, KimiLinearStateParams())
    index = pool.alloc(2)
    pool.fork(index[:1], index[1:])
    return _pool_tensors(pool)


def build_pool_one_ring_dtype() -> dict[str, object]:
    return _pool_tensors(HybridMambaPool(3, KimiLinearStateParams(), one_ring_dtype=True))


def build_pool_draft() -> dict[str, object]:
    return _pool_tensors(HybridMambaPool(3, KimiLinearStateParams(), draft_tokens=2))


def build_pool_conv_dtype_params() -> dict[str, object]:
    from .state_params import KimiLinearStateParamsConvDtype

    return _pool_tensors(HybridMambaPool(3, KimiLinearStateParamsConvDtype()))


def build_pool_from_server_args() -> dict[str, object]:
    from .server_args import ServerArgs, gate_ring_dtype

    args = ServerArgs()
    return _pool_tensors(HybridMambaPool(args.max_running_requests, KimiLinearStateParams(), gate_dtype=gate_ring_dtype(args)))


def build_pool_from_server_args_fp32() -> dict[str, object]:
    from .server_args import ServerArgs, gate_ring_dtype_fp32

    args = ServerArgs(kv_cache_dtype="float16")
    return _pool_tensors(HybridMambaPool(args.max_running_requests, KimiLinearStateParams(), gate_dtype=gate_ring_dtype_fp32(args)))
