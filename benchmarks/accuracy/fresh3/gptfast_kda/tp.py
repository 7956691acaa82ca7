# Tensor parallelism, after gpt-fast's tp.py: heads are split across ranks before setup_caches,
# which then sizes each rank's caches from the per-rank config.
import os
from typing import List, Optional

import torch
import torch.distributed as dist
from torch import nn

from .model import Transformer


def _get_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def _get_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def maybe_init_dist() -> Optional[int]:
    rank, world_size = _get_rank(), _get_world_size()
    if world_size < 2:  # too few gpus to parallelize, tp is no-op
        return None
    torch.cuda.set_device(rank)
    dist.init_process_group(backend="nccl", rank=rank, world_size=world_size)
    return rank


def _apply_tp_linear(linear: nn.Linear, style: str, rank: int, world_size: int, weight_splits: List[int] = []) -> None:
    # Linear's weight matrix is transposed, and is of shape (linear.out_features, linear.in_features)
    shard_dim, size_attr = {"colwise": (0, "out_features"), "rowwise": (1, "in_features")}[style]
    assert getattr(linear, size_attr) % world_size == 0

    def shard(x, dim):
        return torch.tensor_split(x, world_size, dim=dim)[rank]

    def shard_qkv(qkv, dim):
        return torch.cat([shard(t, dim) for t in qkv.split(weight_splits, dim=dim)], dim=dim)

    shard_fn = shard_qkv if weight_splits else shard
    if hasattr(linear, "scales") and style == "colwise":
        linear.scales = shard_fn(linear.scales, 0)
    linear.weight = nn.Parameter(shard_fn(linear.weight, shard_dim), requires_grad=False)
    setattr(linear, size_attr, getattr(linear, size_attr) // world_size)


def _maybe_all_reduce(module: nn.Module, world_size: int) -> None:
    if dist.is_initialized():
        from torch.distributed import _functional_collectives as funcol

        module.register_forward_hook(lambda _m, _i, output: funcol.all_reduce(output, "sum", list(range(world_size))))


def apply_tp(model: Transformer, rank: Optional[int] = None, world_size: Optional[int] = None) -> None:
    rank = _get_rank() if rank is None else rank
    world_size = _get_world_size() if world_size is None else world_size
    c = model.config  # overwrite config before Transformer.setup_caches is called
    c.n_head, c.dim, c.n_local_heads = c.n_head // world_size, c.dim // world_size, c.n_local_heads // world_size
    c.kda_n_head, c.kda_n_v_head = c.kda_n_head // world_size, c.kda_n_v_head // world_size
    for block in model.layers:
        mlp, attn = block.feed_forward, block.attention
        _apply_tp_linear(mlp.w1, "colwise", rank, world_size)
        _apply_tp_linear(mlp.w3, "colwise", rank, world_size)
        _apply_tp_linear(mlp.w2, "rowwise", rank, world_size)
        if block.is_kda:
            key_dim, value_dim = attn.n_head * attn.head_dim, attn.n_v_head * attn.head_dim
            _apply_tp_linear(attn.wqkv, "colwise", rank, world_size, [key_dim, key_dim, value_dim])
            _apply_tp_linear(attn.f_proj, "colwise", rank, world_size)
            _apply_tp_linear(attn.b_proj, "colwise", rank, world_size)
            # per-head decay parameters follow their heads
            attn.A_log = nn.Parameter(torch.tensor_split(attn.A_log.data, world_size)[rank], requires_grad=False)
            attn.dt_bias = nn.Parameter(torch.tensor_split(attn.dt_bias.data, world_size)[rank], requires_grad=False)
            attn.n_head, attn.n_v_head = attn.n_head // world_size, attn.n_v_head // world_size
        else:
            kv_size = attn.n_local_heads * attn.head_dim
            _apply_tp_linear(attn.wqkv, "colwise", rank, world_size, [attn.dim, kv_size, kv_size])
            attn.n_head, attn.dim, attn.n_local_heads = attn.n_head // world_size, attn.dim // world_size, attn.n_local_heads // world_size
        _apply_tp_linear(attn.wo, "rowwise", rank, world_size)
        _maybe_all_reduce(mlp, world_size)
        _maybe_all_reduce(attn, world_size)


def build_tp_rank_caches():
    # what rank 1 of 2 holds: half the heads, and caches sized for them
    model = Transformer.from_name("kda-tiny")
    apply_tp(model, rank=1, world_size=2)
    model = model.to(dtype=torch.bfloat16)
    model.setup_caches(max_batch_size=2, max_seq_length=16)
    idx = torch.randint(0, model.config.vocab_size, (2, 3))
    with torch.no_grad():
        model(idx, torch.arange(3))
        model(idx[:, -1:], torch.tensor([3]))
    return model
