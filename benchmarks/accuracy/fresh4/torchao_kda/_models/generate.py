# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD 3-Clause license found in the
# LICENSE file in the root directory of this source tree.
import json
import os
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import numpy as np
import torch
from torch import Tensor

from torchao_kda.ops import kda_replayssm_decode, last_call
from torchao_kda.utils import alloc_rings, replay_ring_dtypes, torch_default_dtype

from .model import Transformer


def _load_model(checkpoint_path, device="cpu", precision=torch.bfloat16, name="Kimi-Linear-tiny", max_batch_size=None):
    model = Transformer.from_name(name)
    checkpoint = torch.load(checkpoint_path, mmap=True, weights_only=True)
    model.load_state_dict(checkpoint, assign=True)
    if max_batch_size is not None:
        # static shapes for torch.compile: the caches exist before the first forward
        model.setup_caches(max_batch_size, dtype=precision)
    model = model.to(device=device, dtype=precision)  # expect-bug: module-cast
    return model.eval()


def serve(checkpoint_path, precision=torch.bfloat16, max_batch_size=2, name="Kimi-Linear-tiny"):
    # activations and scratch buffers in the serving precision
    torch.set_default_dtype(precision)  # expect-bug: default-dtype id=serve-default
    model = _load_model(checkpoint_path, precision=precision, name=name)
    model.setup_caches(max_batch_size)
    return model


def decode_one_token(model: Transformer, cur_token: Tensor, slots: Tensor) -> Tensor:
    return model(cur_token.view(-1, 1), slots)[:, -1].argmax(-1)


# compiled decode graphs, one per (batch size, dtype)
g_cache: Dict[Tuple[int, torch.dtype], Callable] = {}


def get_decode_fn(batch_size: int, dtype: torch.dtype) -> Callable:
    if (batch_size, dtype) not in g_cache:
        # torch.compile(decode_one_token, mode="reduce-overhead") on CUDA
        g_cache[(batch_size, dtype)] = decode_one_token
    return g_cache[(batch_size, dtype)]


@torch.no_grad()
def generate(model: Transformer, prompt: Tensor, max_new_tokens: int, *, fresh_caches: bool = True, max_batch_size=None) -> Tensor:
    slots = torch.arange(prompt.shape[0], dtype=torch.int32)
    if fresh_caches:
        with torch_default_dtype(model.output.weight.dtype):  # expect-bug: default-dtype id=gen-default
            model.setup_caches(max_batch_size or prompt.shape[0])
    tokens = [model(prompt, slots)[:, -1].argmax(-1)]
    decode = get_decode_fn(prompt.shape[0], model.output.weight.dtype)
    for _ in range(max_new_tokens - 1):
        tokens.append(decode(model, tokens[-1], slots))
    return torch.stack(tokens, 1)


def dump_caches(model: Transformer, path: str):
    torch.save({f"layers.{i}": b.attention.cache.state_dict() for i, b in enumerate(model.layers)}, path)


def restore_caches(model: Transformer, path: str, assign: bool = True):
    snapshot = torch.load(path, mmap=True, weights_only=True)
    for i, b in enumerate(model.layers):
        # assign=True keeps the mmap'd storage instead of copying it
        b.attention.cache.load_state_dict(snapshot[f"layers.{i}"], assign=assign)  # expect-bug: load id=cache-snapshot
    return model


@dataclass
class ReplayDecodeInputs:
    initial_state: Tensor
    d_cache: Tensor
    k_cache: Tensor
    g_cache: Tensor
    write_pos: Tensor
    dtype: torch.dtype = torch.bfloat16

    def __post_init__(self):
        # host rings are read in the activation dtype
        self.d_cache, self.k_cache, self.g_cache = (t.to(self.dtype) for t in (self.d_cache, self.k_cache, self.g_cache))  # expect-bug: decode-arg id=decode-inputs


class HostReplayPool:
    """Host copies of swapped-out slots: for every layer, rings + state of ``n_slots`` slots."""

    def __init__(self, model: Transformer, n_slots: int, precision=torch.bfloat16, compact: bool = False):
        c = model.config
        shapes = {
            "d_cache": (n_slots, c.n_v_head, c.replay_len, c.v_head_dim),
            "k_cache": (n_slots, c.n_head, c.replay_len, c.head_dim),
        }
        gate_shape = (n_slots, c.n_v_head, c.replay_len, c.head_dim)
        d_dtype, _, g_dtype = replay_ring_dtypes(precision)
        self.layers = []
        for _ in model.layers:
            if compact:
                # one allocation per layer, everything in the serving precision
                rings = alloc_rings({**shapes, "gate_ring": gate_shape}, precision)  # expect-bug: pool-dtype id=host-rings
            else:
                rings = alloc_rings(shapes, d_dtype)
                rings["gate_ring"] = torch.zeros(gate_shape, dtype=g_dtype)
            rings["state"] = torch.zeros(n_slots, c.n_v_head, c.v_head_dim, c.head_dim, dtype=torch.float32)
            rings["write_pos"] = torch.zeros(n_slots, dtype=torch.int32)
            self.layers.append(rings)

    # host ring -> ReplaySSMCache buffer
    _PAIRS = (("d_cache", "d_cache"), ("k_cache", "k_cache"), ("gate_ring", "log_alpha"), ("state", "state"), ("write_pos", "write_pos"))

    def page_out(self, model: Transformer, slot: int, row: int):
        for rings, b in zip(self.layers, model.layers):
            for host, name in self._PAIRS:
                rings[host][row] = getattr(b.attention.cache, name)[slot]

    def page_in(self, model: Transformer, slot: int, row: int):
        for rings, b in zip(self.layers, model.layers):
            for host, name in self._PAIRS:
                getattr(b.attention.cache, name)[slot] = rings[host][row]

    def page_in_all(self, model: Transformer):
        for rings, b in zip(self.layers, model.layers):
            cache = b.attention.cache
            cache.state = rings["state"].to(cache.state)
            cache.d_cache, cache.k_cache = rings["d_cache"].to(cache.d_cache), rings["k_cache"].to(cache.k_cache)
            cache.log_alpha = rings["gate_ring"].to(cache.d_cache)  # expect-bug: cast
            cache.write_pos = rings["write_pos"].clone()

    def decode(self, model: Transformer, layer: int, x: Tensor, rows: Tensor) -> Tensor:
        """Decodes one step of ``layer`` straight from the host rings."""
        attn, rings = model.layers[layer].attention, self.layers[layer]
        inputs = ReplayDecodeInputs(rings["state"], rings["d_cache"], rings["k_cache"], rings["gate_ring"], rings["write_pos"], dtype=x.dtype)  # expect-bug: decode-arg id=decode-inputs
        out = torch.empty(x.shape[0], attn.config.n_v_head * attn.config.v_head_dim, dtype=torch.float32)
        out, _ = kda_replayssm_decode(
            attn.wqkv(x), attn.wa(x), attn.wb(x), attn.A_log, attn.dt_bias, attn.config.head_dim**-0.5,
            inputs.initial_state, inputs.d_cache, inputs.k_cache, inputs.g_cache, out, rows, inputs.write_pos,
            use_qk_l2norm_in_kernel=True,
        )
        return out

    def save(self, folder: str, dtype=None):
        index = {}
        for i, rings in enumerate(self.layers):
            for name, t in rings.items():
                if dtype is not None and t.is_floating_point() and name != "state":
                    t = t.to(dtype)  # expect-bug: load id=host-memmap
                t.contiguous().view(torch.uint8).numpy().tofile(os.path.join(folder, f"{i}.{name}.bin"))
                index[f"{i}.{name}"] = {"dtype": str(t.dtype).split(".")[-1], "shape": list(t.shape)}
        with open(os.path.join(folder, "index.json"), "w") as f:
            json.dump(index, f)

    def load(self, folder: str):
        with open(os.path.join(folder, "index.json")) as f:
            index = json.load(f)
        for key, meta in index.items():
            i, name = key.split(".", 1)
            raw = np.memmap(os.path.join(folder, f"{key}.bin"), dtype=np.uint8, mode="r")
            self.layers[int(i)][name] = torch.from_numpy(np.array(raw)).view(getattr(torch, meta["dtype"])).view(meta["shape"])  # expect-bug: load id=host-memmap
        return self


def _checkpoint(tmp_dir, name="Kimi-Linear-tiny"):
    path = os.path.join(tmp_dir, "model.pth")
    torch.save(Transformer.from_name(name).state_dict(), path)
    return path


def build_load_and_generate(tmp_dir):
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    compiled = _load_model(_checkpoint(tmp_dir), max_batch_size=2)
    fresh = _load_model(_checkpoint(tmp_dir))
    tokens = generate(fresh, prompt, 3, max_batch_size=4)
    served = serve(_checkpoint(tmp_dir))
    return {"compiled": compiled, "fresh": fresh, "tokens": tokens, "served": served}


def build_static_generate(tmp_dir):
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    model = _load_model(_checkpoint(tmp_dir, "Kimi-Linear-tiny-static"), name="Kimi-Linear-tiny-static", max_batch_size=1)
    tokens = generate(model, prompt, 4, fresh_caches=False)
    dump_caches(model, os.path.join(tmp_dir, "caches.pt"))
    other = _load_model(_checkpoint(tmp_dir))
    other.setup_caches(1)
    restore_caches(other, os.path.join(tmp_dir, "caches.pt"), assign=False)
    return {"model": model, "tokens": tokens, "restored": other}


def build_host_pool(tmp_dir):
    model = _load_model(_checkpoint(tmp_dir))
    model.setup_caches(2)
    generate(model, torch.tensor([[7, 7, 1, 2, 3], [4, 4, 5, 6, 1]]), 2, fresh_caches=False)
    compact = HostReplayPool(model, 2, compact=True)
    compact.page_out(model, 1, 0)
    pool = HostReplayPool(model, 2)
    pool.page_out(model, 0, 1)
    pool.save(tmp_dir, dtype=torch.float16)
    out = pool.decode(model, 0, torch.randn(2, 32, dtype=torch.bfloat16), torch.tensor([1, 0]))
    decoded = last_call()
    pool.page_in_all(model)
    # snapshots from the bf16 deployment keep every buffer in bfloat16
    torch.save({f"layers.{i}": {k: v.bfloat16() if v.is_floating_point() else v for k, v in b.attention.cache.state_dict().items()} for i, b in enumerate(model.layers)}, os.path.join(tmp_dir, "bf16.pt"))  # expect-bug: load id=cache-snapshot
    other = _load_model(_checkpoint(tmp_dir))
    other.setup_caches(2)
    restore_caches(other, os.path.join(tmp_dir, "bf16.pt"))
    loaded = HostReplayPool(model, 2).load(tmp_dir)
    return {"compact": compact.layers, "decoded": decoded, "out": out, "paged_in": model, "restored": other, "loaded": loaded.layers}


def build_host_pool_roundtrip(tmp_dir):
    model = _load_model(_checkpoint(tmp_dir))
    model.setup_caches(2)
    generate(model, torch.tensor([[1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1]]), 3, fresh_caches=False)
    pool = HostReplayPool(model, 2)
    pool.page_out(model, 0, 1)
    pool.page_out(model, 1, 0)
    pool.page_in(model, 0, 0)
    pool.save(tmp_dir)
    return {"model": model, "pool": HostReplayPool(model, 2).load(tmp_dir).layers}
