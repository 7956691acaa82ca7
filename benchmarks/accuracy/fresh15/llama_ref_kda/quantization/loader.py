# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

"""Quantized checkpoints (fp8 / int4 feed-forward weights) and host-side cache pools."""

import os
from typing import Dict, List, NamedTuple, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..args import ModelArgs
from ..compat import default_dtype
from ..datatypes import DTYPE_BY_NAME, QuantizationMode, activation_dtype
from ..model import Transformer

FFN_WEIGHTS = ("w1", "w2", "w3")


class Fp8Linear(nn.Module):
    """Row-wise scaled float8 (e4m3) weight; activations stay in their own dtype."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn))
        self.register_buffer("scale", torch.ones(out_features, 1, dtype=torch.float32))

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Fp8Linear":
        module = cls(linear.in_features, linear.out_features)
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
        module.weight.copy_((weight / scale).to(torch.float8_e4m3fn))
        module.scale.copy_(scale)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = (self.weight.float() * self.scale).to(x.dtype)
        return F.linear(x, weight)


class Int4Linear(nn.Module):
    """Group-wise int4 weight, two values to a byte, with per-group scales."""

    def __init__(self, in_features: int, out_features: int, group_size: int, scale_dtype: torch.dtype):
        super().__init__()
        assert in_features % group_size == 0 and group_size % 2 == 0
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed_weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer(
            "scales", torch.ones(out_features, in_features // group_size, dtype=scale_dtype)
        )

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int, scale_dtype: torch.dtype) -> "Int4Linear":
        module = cls(linear.in_features, linear.out_features, group_size, scale_dtype)
        weight = linear.weight.detach().float()
        groups = weight.view(linear.out_features, -1, group_size)
        scales = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 7.0
        q = (torch.clamp(torch.round(groups / scales), -8, 7) + 8).to(torch.uint8).flatten(1)
        module.packed_weight.copy_(q[:, 0::2] | (q[:, 1::2] << 4))
        module.scales.copy_(scales.squeeze(-1).to(scale_dtype))
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = (self.packed_weight & 0xF).to(torch.int16) - 8
        high = (self.packed_weight >> 4).to(torch.int16) - 8
        q = torch.stack([low, high], dim=-1).flatten(1).float()
        q = q.view(self.out_features, -1, self.group_size) * self.scales.float()[..., None]
        return F.linear(x, q.flatten(1).to(x.dtype))


def convert_to_quantized_model(model: Transformer, args: ModelArgs) -> Transformer:
    """Swaps the feed-forward weights of ``model`` for their quantized form, in place."""
    mode = args.quantization_mode
    if mode == QuantizationMode.fp8_mixed:
        # everything that stays unquantized runs in bf16 next to the fp8 matmuls
        model.to(torch.bfloat16)  # expect-bug: module-cast
        for block in model.layers:
            for name in FFN_WEIGHTS:
                setattr(block.feed_forward, name, Fp8Linear.from_linear(getattr(block.feed_forward, name)))
    elif mode == QuantizationMode.int4_mixed:
        quant = args.quantization_args
        scale_dtype = DTYPE_BY_NAME[quant.scale_dtype]
        for block in model.layers:
            for name in FFN_WEIGHTS:
                linear = getattr(block.feed_forward, name)
                setattr(block.feed_forward, name, Int4Linear.from_linear(linear, quant.group_size, scale_dtype))
    return model


# --- host-side cache pools --------------------------------------------------------------


def _pool_shapes(params: ModelArgs, n_slots: int) -> Dict[str, Tuple[int, ...]]:
    hv, h, k, v, length = params.n_v_heads, params.n_heads, params.head_dim, params.v_head_dim, params.ring_len
    return {
        "state": (n_slots, hv, v, k),
        "delta": (n_slots, hv, length, v),
        "key": (n_slots, h, length, k),
        "logdecay": (n_slots, hv, length, k),
    }


def _ring_buffers(shapes: Dict[str, Tuple[int, ...]], dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    return {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}  # expect-bug: pool-dtype id=offload-pool


def allocate_fp8_pool(params: ModelArgs, n_slots: int) -> Dict[str, torch.Tensor]:
    """A host pool for fp8 checkpoints, with the rings on the activation dtype."""
    shapes = _pool_shapes(params, n_slots)
    act = activation_dtype(params)
    pool = _ring_buffers({name: shapes[name] for name in ("state", "delta", "key")}, act)
    pool["logdecay"] = torch.zeros(shapes["logdecay"], dtype=act)  # expect-bug: imported-policy
    pool["write_pos"] = torch.zeros(n_slots, dtype=torch.int32)
    return pool


def allocate_int4_pool(params: ModelArgs, n_slots: int) -> Dict[str, torch.Tensor]:
    """A host pool for int4 checkpoints; state and delta/key rings on the activation dtype."""
    shapes = _pool_shapes(params, n_slots)
    act = activation_dtype(params)
    pool = {
        "state": torch.zeros(shapes["state"], dtype=act),
        "delta": torch.zeros(shapes["delta"], dtype=act),
        "key": torch.zeros(shapes["key"], dtype=act),
        "logdecay": torch.zeros(shapes["logdecay"], dtype=torch.float32),
    }
    pool["write_pos"] = torch.zeros(n_slots, dtype=torch.int32)
    pool["slot_table"] = torch.full((n_slots,), -1, dtype=torch.int32)
    return pool


def allocate_offload_pool(params: ModelArgs, n_slots: int) -> Dict[str, torch.Tensor]:
    """A host pool for caches offloaded from the device, on the cache dtype."""
    pool = _ring_buffers(_pool_shapes(params, n_slots), DTYPE_BY_NAME[params.cache_dtype])  # expect-bug: pool-dtype id=offload-pool
    pool["write_pos"] = torch.zeros(n_slots, dtype=torch.int32)
    return pool


def save_pool(pool: Dict[str, torch.Tensor], path: str) -> None:
    arrays = {name: t.float().numpy() if t.is_floating_point() else t.numpy() for name, t in pool.items()}
    np.savez(path, **arrays)


def load_pool(pool: Dict[str, torch.Tensor], path: str) -> None:
    """Copies a pool written by ``save_pool`` into ``pool`` (the tensors keep their dtypes)."""
    with np.load(path) as archive:
        for name, tensor in pool.items():
            tensor.copy_(torch.from_numpy(archive[name]))


def offload_rings(model: Transformer) -> List[Dict[str, torch.Tensor]]:
    """Host copies of every layer's cache, in half precision to halve host memory."""
    host = []
    for block in model.layers:
        attn = block.attention
        host.append(
            {
                "state": attn.cache_state.to(torch.float16, copy=True),
                "delta": attn.cache_d.to(torch.float16, copy=True),
                "key": attn.cache_k.to(torch.float16, copy=True),
                "logdecay": attn.cache_logdecay.half(),  # expect-bug: cast
                "write_pos": attn.cache_pos.clone(),
            }
        )
    return host


def reload_rings(model: Transformer, host: List[Dict[str, torch.Tensor]]) -> None:
    """Puts host copies back as the model's cache, on the cache dtype of its params."""
    ring_dtype = DTYPE_BY_NAME[model.params.cache_dtype]
    for block, saved in zip(model.layers, host):
        attn = block.attention
        attn.cache_state = saved["state"].to(ring_dtype)
        attn.cache_d = saved["delta"].to(ring_dtype)
        attn.cache_k = saved["key"].to(ring_dtype)
        attn.cache_logdecay = saved["logdecay"].to(ring_dtype)  # expect-bug: imported-policy
        attn.cache_pos.copy_(saved["write_pos"])


# --- speculative decoding ---------------------------------------------------------------


class SpeculativeRings(NamedTuple):
    """One layer's cache, copied before a speculative step so that it can be rolled back."""

    state: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    logdecay: torch.Tensor
    write_pos: torch.Tensor


def checkpoint_rings(model: Transformer) -> List[SpeculativeRings]:
    saved = []
    with default_dtype(activation_dtype(model.params)):
        for block in model.layers:
            attn = block.attention
            state = torch.empty(attn.cache_state.shape)
            delta = torch.empty(attn.cache_d.shape)
            key = torch.empty(attn.cache_k.shape)
            logdecay = torch.empty(attn.cache_logdecay.shape)  # expect-bug: default-dtype
            write_pos = torch.empty(attn.cache_pos.shape, dtype=torch.int32)
            for dst, src in (
                (state, attn.cache_state),
                (delta, attn.cache_d),
                (key, attn.cache_k),
                (logdecay, attn.cache_logdecay),
                (write_pos, attn.cache_pos),
            ):
                dst.copy_(src)
            saved.append(SpeculativeRings(state, delta, key, logdecay, write_pos))
    return saved


def rollback(model: Transformer, saved: List[SpeculativeRings]) -> None:
    for block, rings in zip(model.layers, saved):
        attn = block.attention
        attn.cache_state.copy_(rings.state)
        attn.cache_d.copy_(rings.delta)
        attn.cache_k.copy_(rings.key)
        attn.cache_logdecay.copy_(rings.logdecay)
        attn.cache_pos.copy_(rings.write_pos)


def load_prompt_cache(model: Transformer, path: str) -> None:
    """Starts every slot from a cached system prompt (``prompt_cache.npz`` of a release).

    The archive holds one slot per layer (``layers.{i}.{ring}``) and the prompt length.
    """
    with np.load(path) as archive:
        length = int(archive["length"])
        for i, block in enumerate(model.layers):
            attn = block.attention
            n = attn.cache_slots
            attn.cache_state.copy_(torch.from_numpy(archive[f"layers.{i}.state"]).expand_as(attn.cache_state))
            attn.cache_d.copy_(torch.from_numpy(archive[f"layers.{i}.delta"]).expand_as(attn.cache_d))
            attn.cache_k.copy_(torch.from_numpy(archive[f"layers.{i}.key"]).expand_as(attn.cache_k))
            logdecay = torch.from_numpy(archive[f"layers.{i}.logdecay"])
            attn.cache_logdecay = logdecay.expand(n, *logdecay.shape[1:]).contiguous()  # expect-bug: load
            attn.cache_pos.fill_(length)


# --- builders ---------------------------------------------------------------------------


def _tiny_args(**overrides) -> ModelArgs:
    base = dict(dim=32, n_layers=2, n_heads=2, n_v_heads=4, head_dim=8, ring_len=4, max_batch_size=2)
    base.update(overrides)
    return ModelArgs(**base)


def build_fp8_checkpoint(tmp_dir: str):
    """An fp8_mixed checkpoint loaded through Llama.build, decoded, with an fp8 host pool."""
    from ..generation import Llama, write_checkpoint

    torch.manual_seed(0)
    ckpt = write_checkpoint(os.path.join(tmp_dir, "ckpt"), quantization_args={"mode": "fp8_mixed"})
    llama = Llama.build(ckpt, max_batch_size=2, max_seq_len=16)
    out = llama.generate([[1, 2, 3], [4, 5]], max_gen_len=2)
    pool = allocate_fp8_pool(llama.args, 2)
    return {"model": llama.model, "pool": pool, "tokens": torch.tensor(sum(out, []))}


def build_int4_checkpoint(tmp_dir: str):
    """An int4_mixed checkpoint, decoded; its int4 host pool saved and loaded back."""
    from ..generation import Llama, write_checkpoint

    torch.manual_seed(0)
    ckpt = write_checkpoint(
        os.path.join(tmp_dir, "ckpt"), quantization_args={"mode": "int4_mixed", "group_size": 8}
    )
    llama = Llama.build(ckpt, max_batch_size=2, max_seq_len=16)
    out = llama.generate([[1, 2, 3], [4, 5]], max_gen_len=2)
    pool = allocate_int4_pool(llama.args, 2)
    pool["logdecay"].copy_(llama.model.layers[0].attention.cache_logdecay)
    pool["delta"].copy_(llama.model.layers[0].attention.cache_d)
    path = os.path.join(tmp_dir, "pool.npz")
    save_pool(pool, path)
    pool["logdecay"].zero_()
    load_pool(pool, path)
    return {"model": llama.model, "pool": pool, "tokens": torch.tensor(sum(out, []))}


def build_offloaded_model():
    """The cache of an fp16 model offloaded to the host and put back, with an offload pool."""
    torch.manual_seed(0)
    args = _tiny_args(dtype="fp16", cache_dtype="fp16")
    model = Transformer(args).half()
    model.setup_cache(args.max_batch_size, args.max_seq_len)
    slots = torch.arange(2, dtype=torch.int32)
    model(torch.tensor([3, 4]), slots)
    host = offload_rings(model)
    pool = allocate_offload_pool(args, 2)
    reload_rings(model, host)
    logits = model(torch.tensor([5, 6]), slots)
    return {"model": model, "host": host, "pool": pool, "logits": logits}


def build_speculative_rollback(tmp_dir: str):
    """A rejected speculative step rolled back, then every slot restarted from a prompt cache."""
    torch.manual_seed(0)
    args = _tiny_args()
    model = Transformer(args).to(torch.bfloat16)
    model.setup_cache(args.max_batch_size, args.max_seq_len)
    slots = torch.arange(2, dtype=torch.int32)
    model(torch.tensor([3, 4]), slots)
    model(torch.tensor([5, 6]), slots)
    saved = checkpoint_rings(model)
    model(torch.tensor([7, 8]), slots)
    rollback(model, saved)
    # the prompt cache shipped with a release: one slot per layer, fp16 arrays
    arrays = {"length": np.array(2)}
    hv, h, k, v, length = args.n_v_heads, args.n_heads, args.head_dim, args.v_head_dim, args.ring_len
    for i in range(args.n_layers):
        arrays[f"layers.{i}.state"] = np.zeros((1, hv, v, k), dtype=np.float16)
        arrays[f"layers.{i}.delta"] = torch.randn(1, hv, length, v).numpy().astype(np.float16)
        arrays[f"layers.{i}.key"] = torch.randn(1, h, length, k).numpy().astype(np.float16)
        arrays[f"layers.{i}.logdecay"] = (-torch.rand(1, hv, length, k)).numpy().astype(np.float16)
    path = os.path.join(tmp_dir, "prompt_cache.npz")
    np.savez(path, **arrays)
    load_prompt_cache(model, path)
    logits = model(torch.tensor([9, 10]), slots)
    return {"model": model, "saved": saved, "logits": logits}
