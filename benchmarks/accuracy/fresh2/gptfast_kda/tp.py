"""Tensor parallelism: each rank keeps 1/world_size of the KDA heads and of the MLP, and the outputs
of the row-wise projections are all-reduced.

    torchrun --standalone --nproc_per_node=2 -m gptfast_kda.generate --checkpoint_path ...
"""
import os
from typing import List, Optional
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor, nn

from .model import FeedForward, KimiDeltaAttention, ReplayCache, Transformer


def _get_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def _get_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def maybe_init_dist() -> Optional[int]:
    if _get_world_size() < 2:
        # not run via torchrun, no-op
        return None
    rank = _get_rank()
    torch.cuda.set_device(rank)
    dist.init_process_group(backend="nccl", rank=rank, world_size=_get_world_size())
    return rank


def _shard(t: Tensor, dim: int, rank: int, world_size: int) -> Tensor:
    size = t.size(dim)
    assert size % world_size == 0, f"{size} is not divisible by the world size {world_size}"
    return t.narrow(dim, rank * (size // world_size), size // world_size).contiguous()


def _apply_tp_linear(linear: nn.Linear, style: str, sizes: Optional[List[int]] = None) -> None:
    rank, world_size = _get_rank(), _get_world_size()
    dim = {"colwise": 0, "rowwise": 1}[style]
    if sizes is not None:
        # fused projection (q, k, v): shard each part
        weight = torch.cat([_shard(w, dim, rank, world_size) for w in linear.weight.split(sizes, dim=dim)], dim=dim)
    else:
        weight = _shard(linear.weight, dim, rank, world_size)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    linear.out_features, linear.in_features = weight.shape


def _reduce_output(module: nn.Module) -> None:
    if dist.is_initialized():  # one process (tests, tools): nothing to reduce
        world = list(range(_get_world_size()))
        module.register_forward_hook(lambda _mod, _inp, out: funcol.all_reduce(out, "sum", world))


def _apply_tp_ffn(mlp: FeedForward) -> None:
    _apply_tp_linear(mlp.w1, "colwise")
    _apply_tp_linear(mlp.w3, "colwise")
    _apply_tp_linear(mlp.w2, "rowwise")
    _reduce_output(mlp)


def _shard_replay_cache(cache: ReplayCache, rank: int, world_size: int) -> None:
    """This rank's heads of an allocated (static) pool. Nothing has been decoded yet, so the rings
    are allocated again at their local size instead of being copied."""
    B, HV, L, V = cache.d_cache.shape
    H, K = cache.k_cache.size(1) // world_size, cache.k_cache.size(3)
    HV //= world_size
    cache.state = _shard(cache.state, 1, rank, world_size)
    cache.d_cache = cache.d_cache.new_zeros(B, HV, L, V)
    cache.k_cache = cache.k_cache.new_zeros(B, H, L, K)
    cache.g_cache = cache.k_cache.new_zeros(B, HV, L, K)  # expect-bug: like


def _apply_tp_kda(kda: KimiDeltaAttention) -> None:
    rank, world_size = _get_rank(), _get_world_size()
    _apply_tp_linear(kda.wqkv, "colwise", kda.qkv_sizes)
    _apply_tp_linear(kda.wa, "colwise")
    _apply_tp_linear(kda.wb, "colwise")
    _apply_tp_linear(kda.wo, "rowwise")
    kda.A_log = nn.Parameter(_shard(kda.A_log.data, 0, rank, world_size), requires_grad=False)
    kda.dt_bias = nn.Parameter(_shard(kda.dt_bias.data, 0, rank, world_size), requires_grad=False)
    kda.n_heads //= world_size
    kda.n_v_heads //= world_size
    kda.qkv_sizes = [s // world_size for s in kda.qkv_sizes]
    if kda.kv_cache is not None:
        _shard_replay_cache(kda.kv_cache, rank, world_size)
    _reduce_output(kda)


def apply_tp(model: Transformer) -> None:
    world_size = _get_world_size()
    assert model.config.kda_heads % world_size == 0 and model.config.kda_v_heads % world_size == 0
    for block in model.layers:
        _apply_tp_ffn(block.feed_forward)
        _apply_tp_kda(block.attention)


# ---- builders: rank 0 of 2, in one process ----------------------------------------------------

def _load_rank0(tmp_dir, name: str):
    from .generate import _load_model
    from .testing import write_checkpoint

    with mock.patch.dict(os.environ, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}):
        return _load_model(write_checkpoint(tmp_dir, name), "cpu", torch.bfloat16, use_tp=True)


def build_tp_static_slots(tmp_dir):
    model = _load_rank0(tmp_dir, "kda-tiny-static")
    return {"caches": model.replay_caches()}


def build_tp(tmp_dir):
    model = _load_rank0(tmp_dir, "kda-tiny")
    with torch.device("cpu"):
        model.setup_caches(max_batch_size=2, max_seq_length=16)
    return {"caches": model.replay_caches()}
