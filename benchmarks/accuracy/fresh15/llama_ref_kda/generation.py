# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

import torch

from .args import ModelArgs
from .compat import get_model_parallel_rank, initialize_model_parallel, model_parallel_is_initialized
from .datatypes import DTYPE_BY_NAME, QuantizationMode
from .model import Transformer
from .quantization.loader import convert_to_quantized_model


class SessionRings(NamedTuple):
    """One layer's cache rows for a group of sessions, outside the model."""

    state: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    logdecay: torch.Tensor
    write_pos: torch.Tensor


class ServingDtypes(NamedTuple):
    """Dtypes of serving-side session pools on GPUs without bf16 support."""

    state: torch.dtype = torch.float16
    cache: torch.dtype = torch.float16
    logdecay: torch.dtype = torch.float16  # expect-bug: container


@dataclass
class DecodeArgs:
    """The cache tensors one layer's decode kernel reads and writes."""

    state: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    logdecay: torch.Tensor
    write_pos: torch.Tensor

    @classmethod
    def from_attention(cls, attn) -> "DecodeArgs":
        return cls(attn.cache_state, attn.cache_d, attn.cache_k, attn.cache_logdecay, attn.cache_pos)


class Llama:
    @staticmethod
    def build(
        ckpt_dir: str,
        max_batch_size: int,
        max_seq_len: int,
        model_parallel_size: Optional[int] = None,
        seed: int = 1,
        **overrides,
    ) -> "Llama":
        """
        Build a Llama instance by initializing and loading a model checkpoint.

        Args:
            ckpt_dir (str): Path to the directory containing checkpoint files and params.json.
            max_batch_size (int): Number of cache slots.
            max_seq_len (int): Maximum sequence length a slot is kept for.
            model_parallel_size (Optional[int]): Number of model parallel processes.
            seed (int): Random seed used for initialization.
            overrides: ModelArgs fields that replace the values of params.json.
        """
        if not model_parallel_is_initialized():
            initialize_model_parallel(model_parallel_size or 1)
        torch.manual_seed(seed)
        start_time = time.time()

        checkpoints = sorted(Path(ckpt_dir).glob("*.pth"))
        assert len(checkpoints) > 0, f"no checkpoint files found in {ckpt_dir}"
        ckpt_path = checkpoints[get_model_parallel_rank()]
        checkpoint = torch.load(ckpt_path, map_location="cpu", mmap=True, weights_only=True)
        with open(Path(ckpt_dir) / "params.json", "r") as f:
            params = json.loads(f.read())

        model_args = ModelArgs.from_params(
            params, max_seq_len=max_seq_len, max_batch_size=max_batch_size, **overrides
        )
        if model_args.dtype == "bf16":
            torch.set_default_dtype(torch.bfloat16)
        elif model_args.dtype == "fp16":
            torch.set_default_dtype(torch.float16)

        model = Transformer(model_args)
        model.load_state_dict(checkpoint, strict=True)
        if not model_args.eager_cache:
            model.setup_cache(max_batch_size, max_seq_len)
        if model_args.quantization_mode != QuantizationMode.none:
            model = convert_to_quantized_model(model, model_args)
        llama = Llama(model, model_args)
        llama.load_seconds = time.time() - start_time
        return llama

    def __init__(self, model: Transformer, args: ModelArgs):
        self.model = model
        self.args = args
        self.cache_dtype = DTYPE_BY_NAME[args.cache_dtype]
        self.compute_dtype = args.torch_dtype
        # decode runners bound to static inputs, one per batch size
        self.logdecay_graph_cache: Dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}
        self.graph_rings: Dict[int, List[DecodeArgs]] = {}

    @torch.no_grad()
    def generate(
        self,
        prompt_tokens: List[List[int]],
        max_gen_len: int,
        slots: Optional[List[int]] = None,
    ) -> List[List[int]]:
        """Greedy generation; every prompt token goes through the decode path, one per step.

        Args:
            prompt_tokens (List[List[int]]): Tokenized prompts.
            max_gen_len (int): Number of tokens generated after the longest prompt.
            slots (Optional[List[int]]): Cache slot of each prompt (defaults to 0..n-1).
        """
        params = self.args
        bsz = len(prompt_tokens)
        assert bsz <= params.max_batch_size, (bsz, params.max_batch_size)
        slot_ids = torch.tensor(slots if slots is not None else list(range(bsz)), dtype=torch.int32)
        max_prompt_len = max(len(t) for t in prompt_tokens)
        total_len = min(params.max_seq_len, max_gen_len + max_prompt_len)

        pad_id = -1
        tokens = torch.full((bsz, total_len), pad_id, dtype=torch.long)
        for k, t in enumerate(prompt_tokens):
            tokens[k, : len(t)] = torch.tensor(t, dtype=torch.long)
        input_text_mask = tokens != pad_id
        for cur_pos in range(total_len - 1):
            logits = self.model.forward(tokens[:, cur_pos], slot_ids)
            next_token = torch.argmax(logits, dim=-1)
            next_token = torch.where(input_text_mask[:, cur_pos + 1], tokens[:, cur_pos + 1], next_token)
            tokens[:, cur_pos + 1] = next_token
        return [tokens[k, len(t) :].tolist() for k, t in enumerate(prompt_tokens)]

    # --- cache snapshots ------------------------------------------------------------------

    def save_cache_snapshot(self, path: str) -> None:
        torch.save(self.model.cache_snapshot(), path)

    def restore_cache_snapshot(self, path: str) -> None:
        snapshot = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        self.model.load_cache_snapshot(snapshot)

    def cache_digest(self) -> str:
        """sha256 of every layer's log-decay ring, byte for byte."""
        digest = hashlib.sha256()
        for block in self.model.layers:
            ring = block.attention.cache_logdecay.contiguous()
            digest.update(ring.view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def dump_logdecay(self, path: str) -> None:
        with open(path, "wb") as f:
            for block in self.model.layers:
                f.write(block.attention.cache_logdecay.contiguous().view(torch.uint8).numpy().tobytes())

    def load_logdecay(self, path: str) -> None:
        flat = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.float32)
        offset = 0
        for block in self.model.layers:
            ring = block.attention.cache_logdecay
            ring.copy_(flat[offset : offset + ring.numel()].view(ring.shape))
            offset += ring.numel()

    # --- sessions outside the model -------------------------------------------------------

    def _ring_shapes(self, n_slots: int):
        a = self.args
        return (
            (n_slots, a.n_v_heads, a.v_head_dim, a.head_dim),
            (n_slots, a.n_v_heads, a.ring_len, a.v_head_dim),
            (n_slots, a.n_heads, a.ring_len, a.head_dim),
            (n_slots, a.n_v_heads, a.ring_len, a.head_dim),
        )

    def export_sessions(self, slots: List[int]) -> List[SessionRings]:
        """Copies of ``slots``' caches, per layer, for handing the sessions to another replica."""
        rows = torch.tensor(slots, dtype=torch.long)
        exported = []
        for block in self.model.layers:
            attn = block.attention
            logdecay = attn.cache_logdecay[rows].type(self.cache_dtype)  # expect-bug: cast
            exported.append(
                SessionRings(
                    state=attn.cache_state[rows].to(self.cache_dtype),
                    delta=attn.cache_d[rows].to(self.cache_dtype),
                    key=attn.cache_k[rows].to(self.cache_dtype),
                    logdecay=logdecay,
                    write_pos=attn.cache_pos[rows].clone(),
                )
            )
        return exported

    def spare_sessions(self, n_slots: int) -> List[SessionRings]:
        """Empty per-layer rings that swapped-in sessions are decoded from."""
        shapes = self._ring_shapes(n_slots)
        return [
            SessionRings(
                *(torch.zeros(shape, dtype=self.cache_dtype) for shape in shapes),  # expect-bug: pool-dtype
                write_pos=torch.zeros(n_slots, dtype=torch.int32),
            )
            for _ in self.model.layers
        ]

    def swap_out(self, slots: List[int], path: str) -> None:
        """Writes ``slots``' caches to ``path``; the rings are stored in the cache dtype."""
        rows = torch.tensor(slots, dtype=torch.long)
        payload: Dict[str, torch.Tensor] = {}
        for i, block in enumerate(self.model.layers):
            attn = block.attention
            payload[f"{i}.state"] = attn.cache_state[rows].to(self.cache_dtype)
            payload[f"{i}.delta"] = attn.cache_d[rows].to(self.cache_dtype)
            payload[f"{i}.key"] = attn.cache_k[rows].to(self.cache_dtype)
            payload[f"{i}.logdecay"] = attn.cache_logdecay[rows].to(self.cache_dtype)  # expect-bug: load id=swap
            payload[f"{i}.write_pos"] = attn.cache_pos[rows].clone()
        torch.save(payload, path)

    def swap_in(self, path: str) -> List[SessionRings]:
        payload = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        restored = []
        for i in range(len(self.model.layers)):
            restored.append(
                SessionRings(
                    state=payload[f"{i}.state"].to(self.cache_dtype),
                    delta=payload[f"{i}.delta"].to(self.cache_dtype),
                    key=payload[f"{i}.key"].to(self.cache_dtype),
                    logdecay=payload[f"{i}.logdecay"],  # expect-bug: load id=swap
                    write_pos=payload[f"{i}.write_pos"].to(torch.int32),
                )
            )
        return restored

    def load_sessions(self, sessions: List[SessionRings], slots: List[int]) -> None:
        """Copies per-layer session rows into the model's cache at ``slots``."""
        rows = torch.tensor(slots, dtype=torch.long)
        for block, rings in zip(self.model.layers, sessions):
            attn = block.attention
            attn.cache_state[rows] = rings.state.to(attn.cache_state.dtype)
            attn.cache_d[rows] = rings.delta.to(attn.cache_d.dtype)
            attn.cache_k[rows] = rings.key.to(attn.cache_k.dtype)
            attn.cache_logdecay[rows] = rings.logdecay.to(attn.cache_logdecay.dtype)
            attn.cache_pos[rows] = rings.write_pos.to(torch.int32)

    def serving_pool(self, n_slots: int, dtypes: ServingDtypes = ServingDtypes()) -> List[SessionRings]:
        state, delta, key, logdecay = self._ring_shapes(n_slots)
        return [
            SessionRings(
                state=torch.zeros(state, dtype=dtypes.state),
                delta=torch.zeros(delta, dtype=dtypes.cache),
                key=torch.zeros(key, dtype=dtypes.cache),
                logdecay=torch.zeros(logdecay, dtype=dtypes.logdecay),
                write_pos=torch.zeros(n_slots, dtype=torch.int32),
            )
            for _ in self.model.layers
        ]

    def to_serving(self) -> "Llama":
        """Converts weights, activations and caches to fp16 for GPUs without bf16 support."""
        self.model.half()  # expect-bug: module-cast
        self.compute_dtype = torch.float16
        self.cache_dtype = torch.float16
        return self

    # --- forked decoding ------------------------------------------------------------------

    def fork(self, slots: List[int]) -> List[Dict[str, torch.Tensor]]:
        """Copies of ``slots``' caches in a new pool (one dict per layer), row i for slots[i]."""
        rows = torch.tensor(slots, dtype=torch.long)
        pool = []
        for block in self.model.layers:
            attn = block.attention
            state = torch.empty_like(attn.cache_state[rows])
            delta = torch.empty_like(attn.cache_d[rows])
            key = torch.empty_like(attn.cache_k[rows])
            logdecay = torch.zeros_like(attn.cache_d[rows])  # expect-bug: like
            for dst, src in (
                (state, attn.cache_state),
                (delta, attn.cache_d),
                (key, attn.cache_k),
                (logdecay, attn.cache_logdecay),
            ):
                dst.copy_(src[rows])
            write_pos = attn.cache_pos[rows].clone()
            pool.append({"state": state, "delta": delta, "key": key, "logdecay": logdecay, "write_pos": write_pos})
        return pool

    def _stage(self, rings: Dict[str, torch.Tensor]) -> DecodeArgs:
        """Decode arguments for one layer of a forked pool, on the dtype the model computes in."""
        return DecodeArgs(
            write_pos=rings["write_pos"],
            **{name: ring.to(self.compute_dtype) for name, ring in rings.items() if name != "write_pos"},  # expect-bug: decode-arg
        )

    @torch.no_grad()
    def decode_forked(self, pool: List[Dict[str, torch.Tensor]], tokens: torch.Tensor):
        staged = [self._stage(rings) for rings in pool]
        slots = torch.arange(tokens.shape[0], dtype=torch.int32)
        return self.model(tokens, slots, rings=staged), staged

    # --- static decode runners ------------------------------------------------------------

    def capture_decode(self, batch_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """A decode runner for slots 0..batch_size-1 with static inputs, cached per batch size."""
        if batch_size in self.logdecay_graph_cache:
            return self.logdecay_graph_cache[batch_size]
        static_tokens = torch.zeros(batch_size, dtype=torch.long)
        static_slots = torch.arange(batch_size, dtype=torch.int32)
        rings = [DecodeArgs.from_attention(block.attention) for block in self.model.layers]

        def replay(tokens: torch.Tensor) -> torch.Tensor:
            static_tokens.copy_(tokens)
            return self.model(static_tokens, static_slots, rings=rings)

        self.logdecay_graph_cache[batch_size] = replay
        self.graph_rings[batch_size] = rings
        return replay


# --- builders ---------------------------------------------------------------------------

TINY_PARAMS = {
    "dim": 32,
    "n_layers": 2,
    "n_heads": 2,
    "n_v_heads": 4,
    "head_dim": 8,
    "ring_len": 4,
    "vocab_size": 64,
    "multiple_of": 16,
    "norm_eps": 1e-5,
    "dtype": "bf16",
    "cache_dtype": "bf16",
    "rope_theta": 500000.0,
}


def write_checkpoint(ckpt_dir: str, seed: int = 0, **params) -> str:
    """A consolidated bf16 checkpoint and its params.json, as a tiny stand-in release."""
    os.makedirs(ckpt_dir, exist_ok=True)
    params = {**TINY_PARAMS, **params}
    torch.manual_seed(seed)
    model = Transformer(ModelArgs.from_params(params))
    state_dict = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    torch.save(state_dict, os.path.join(ckpt_dir, "consolidated.00.pth"))
    with open(os.path.join(ckpt_dir, "params.json"), "w") as f:
        json.dump(params, f)
    return ckpt_dir


PROMPTS = [[3, 17, 5], [9, 2]]


def build_llama(tmp_dir: str):
    """Load, generate, snapshot the cache to disk and restore it."""
    torch.manual_seed(0)
    ckpt = write_checkpoint(os.path.join(tmp_dir, "ckpt"))
    llama = Llama.build(ckpt, max_batch_size=3, max_seq_len=16)
    out = llama.generate(PROMPTS, max_gen_len=2, slots=[0, 2])
    snapshot = os.path.join(tmp_dir, "cache.pth")
    llama.save_cache_snapshot(snapshot)
    before = llama.cache_digest()
    llama.dump_logdecay(os.path.join(tmp_dir, "logdecay.bin"))
    llama.generate([[1], [4]], max_gen_len=1, slots=[0, 2])
    llama.restore_cache_snapshot(snapshot)
    llama.load_logdecay(os.path.join(tmp_dir, "logdecay.bin"))
    assert llama.cache_digest() == before
    return {"model": llama.model, "tokens": torch.tensor(sum(out, []))}


def build_llama_eager(tmp_dir: str):
    """A checkpoint whose params ask for caches allocated with the layers; sessions exported."""
    torch.manual_seed(0)
    ckpt = write_checkpoint(os.path.join(tmp_dir, "ckpt"), eager_cache=True)
    llama = Llama.build(ckpt, max_batch_size=2, max_seq_len=16)
    out = llama.generate(PROMPTS, max_gen_len=2)
    exported = llama.export_sessions([1])
    return {"model": llama.model, "exported": exported, "tokens": torch.tensor(out[0])}


def build_session_swap(tmp_dir: str):
    """Two sessions swapped to disk and back, next to a spare pool for them."""
    torch.manual_seed(0)
    ckpt = write_checkpoint(os.path.join(tmp_dir, "ckpt"))
    llama = Llama.build(ckpt, max_batch_size=2, max_seq_len=16)
    llama.generate(PROMPTS, max_gen_len=2)
    path = os.path.join(tmp_dir, "swap.pt")
    llama.swap_out([0, 1], path)
    spare = llama.spare_sessions(2)
    restored = llama.swap_in(path)
    llama.load_sessions(restored, [1, 0])
    return {"model": llama.model, "spare": spare, "restored": restored}


def build_forked_decode(tmp_dir: str):
    """Two slots forked into a side pool and decoded there for one step."""
    torch.manual_seed(0)
    ckpt = write_checkpoint(os.path.join(tmp_dir, "ckpt"))
    llama = Llama.build(ckpt, max_batch_size=2, max_seq_len=16)
    llama.generate(PROMPTS, max_gen_len=1)
    pool = llama.fork([1, 0])
    logits, staged = llama.decode_forked(pool, torch.tensor([6, 7]))
    return {"model": llama.model, "pool": pool, "staged": staged, "logits": logits}


def build_fp16_serving(tmp_dir: str):
    """A bf16 checkpoint converted for fp16 serving, with a serving-side session pool."""
    torch.manual_seed(0)
    ckpt = write_checkpoint(os.path.join(tmp_dir, "ckpt"))
    llama = Llama.build(ckpt, max_batch_size=2, max_seq_len=16).to_serving()
    out = llama.generate(PROMPTS, max_gen_len=1)
    pool = llama.serving_pool(2)
    return {"model": llama.model, "pool": pool, "tokens": torch.tensor(sum(out, []))}


def build_static_decode():
    """Static decode runners over the model's own cache, replayed for three steps."""
    torch.manual_seed(0)
    args = ModelArgs.from_params(TINY_PARAMS, max_batch_size=2)
    model = Transformer(args)
    model.setup_cache(args.max_batch_size, args.max_seq_len)
    llama = Llama(model, args)
    run = llama.capture_decode(2)
    logits = [run(torch.tensor([4, 8])), run(torch.tensor([1, 2])), llama.capture_decode(2)(torch.tensor([3, 3]))]
    return {"llama": llama, "logits": torch.stack(logits)}
