"""Runners with ``forward(tokens, input_pos)``: the eager model (``--use_eager``) or a loaded program,
greedy generation, prefill handed over to a decode instance, and snapshots for draft rollback."""

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import custom_ops, pte
from .builder import _prepare_for_llama_export, default_dtype
from .model_args import ModelArgs

_STATE = ("d_cache", "k_cache", "log_gate_cache", "ssm_state")


class LlamaRunner(ABC):
    def __init__(self, params: ModelArgs):
        self.params, self.max_batch_size = params, params.max_batch_size

    @abstractmethod
    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        ...

    def generate(self, prompt_tokens: List[int], max_new_tokens: int) -> List[int]:
        """Greedy decoding in slot 0, the prompt fed one token per step."""
        tokens = list(prompt_tokens)
        for pos in range(len(prompt_tokens) + max_new_tokens - 1):
            logits = self.forward(torch.tensor([tokens[pos]]), torch.tensor([pos], dtype=torch.int32))
            if pos >= len(prompt_tokens) - 1:
                tokens.append(int(logits[0].argmax()))
        return tokens[len(prompt_tokens) :]


class EagerLlamaRunner(LlamaRunner):
    def __init__(self, args: ModelArgs, qmode: Optional[str] = None):
        super().__init__(args)
        self.manager = _prepare_for_llama_export(args, qmode=qmode)
        self.model, self.dtype = self.manager.model, self.manager.dtype.to_torch_dtype()

    def forward(self, tokens, input_pos):
        with torch.no_grad():
            return self.model(tokens, input_pos)

    def _caches(self):
        return [layer.attention.kv_cache for layer in self.model.layers]

    def snapshot(self) -> List[Dict[str, torch.Tensor]]:
        """Copies of every layer's cache, to roll back rejected draft tokens."""
        snaps = []
        for cache in self._caches():
            snaps.append({"d_cache": cache.d_cache.clone(), "k_cache": cache.k_cache.clone(),
                          "log_gate_cache": cache.d_cache.new_empty(cache.log_gate_cache.shape).copy_(cache.log_gate_cache),  # expect-bug: like
                          "ssm_state": cache.ssm_state.clone()})
        return snaps

    def rollback(self, snaps: List[Dict[str, torch.Tensor]]) -> None:
        for cache, snap in zip(self._caches(), snaps):
            for name in _STATE:
                getattr(cache, name).copy_(snap[name])

    def resume(self, states: List[Dict[str, torch.Tensor]], slot: int) -> None:
        """Loads handed-over per-layer state (layout of ``prefill``) into ``slot``."""
        for cache, state in zip(self._caches(), states):
            for name in _STATE:
                getattr(cache, name)[slot].copy_(state[name][0])

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor) -> List[Dict[str, torch.Tensor]]:
        """Per-layer rings of ``prompt`` for a decode instance."""
        h = self.model.tok_embeddings(prompt)
        return [layer.attention.prefill_rings(layer.attention_norm(h)) for layer in self.model.layers]

    def empty_state(self) -> List[Dict[str, torch.Tensor]]:
        """The state of an empty prompt in the layout of ``prefill``."""
        p = self.params
        with default_dtype(self.dtype):  # expect-bug: default-dtype id=empty-state
            return [{"d_cache": torch.zeros(1, p.n_v_heads, p.replay_len, p.head_dim),
                     "k_cache": torch.zeros(1, p.n_heads, p.replay_len, p.head_dim),
                     "log_gate_cache": torch.zeros(1, p.n_v_heads, p.replay_len, p.head_dim),  # expect-bug: default-dtype id=empty-state
                     "ssm_state": torch.zeros(1, p.n_v_heads, p.head_dim, p.head_dim, dtype=torch.float32)}
                    for _ in range(p.n_layers)]

    @torch.no_grad()
    def decode_prefilled(self, states: List[Dict[str, torch.Tensor]], token: int, pos: int) -> torch.Tensor:
        """First decode step of a sequence prefilled elsewhere, on its own state (the slots are untouched)."""
        h = self.model.tok_embeddings(torch.tensor([token]))
        row, write_pos = torch.zeros(1, dtype=torch.int32), torch.tensor([pos], dtype=torch.int32)
        for layer, state in zip(self.model.layers, states):
            attention, x = layer.attention, layer.attention_norm(h)
            q, k, v, beta = attention._project(x)
            rings = {"d_cache": state["d_cache"], "k_cache": state["k_cache"], "g_cache": state["log_gate_cache"]}
            out = custom_ops.fused_recurrent_kda_replayssm_decode(
                q, k, v, attention.log_gate(x), beta, scale=attention.scale, initial_state=state["ssm_state"],
                ssm_state_indices=row, write_pos=write_pos,
                **{name: ring.to(self.dtype) for name, ring in rings.items()})  # expect-bug: decode-arg
            h = h + attention.wo(out.to(h.dtype).flatten(1))
            h = h + layer.feed_forward(layer.ffn_norm(h))
        return self.model.output(self.model.norm(h)).float()


class PteLlamaRunner(LlamaRunner):
    def __init__(self, pte_path):
        self.program = pte.load_pte(pte_path)
        super().__init__(self.program.model_args)
        self.dtype = self.program.module.tok_embeddings.weight.dtype

    def forward(self, tokens, input_pos):
        return self.program.forward((tokens, input_pos))[0]

    def handover(self, slot: int) -> List[Dict[str, torch.Tensor]]:
        """One slot's state in the layout of ``EagerLlamaRunner.prefill`` (migration to another instance)."""
        states = []
        for layer in self.program.module.layers:
            cache = layer.attention.kv_cache
            d = cache.d_cache[slot : slot + 1].clone()
            states.append({"d_cache": d, "k_cache": cache.k_cache[slot : slot + 1].clone(),
                           "log_gate_cache": cache.log_gate_cache[slot : slot + 1].type_as(d),  # expect-bug: cast
                           "ssm_state": cache.ssm_state[slot : slot + 1].clone()})
        return states

    def allocate_state_inputs(self) -> Dict[str, torch.Tensor]:
        """Zeroed caches for a program that takes them as method inputs."""
        metas = [m for m in self.program.method_meta if m.name.endswith(pte.STATE_BUFFERS)]
        return {m.name: torch.zeros(m.shape, dtype=self.dtype) for m in metas}  # expect-bug: pool-dtype


def build_eager_runner():
    """Generation on a bf16 custom-op runner; an fp32 runner's prefill decoded, resumed and rolled back."""
    torch.manual_seed(0)
    runner = EagerLlamaRunner(ModelArgs(use_custom_replay_op=True, dtype_override="bf16"))
    runner.generate([1, 2, 3], max_new_tokens=2)
    fp32 = EagerLlamaRunner(ModelArgs())
    snapshot = fp32.snapshot()
    states = fp32.prefill(torch.tensor([4, 5]))
    fp32.decode_prefilled(states, token=6, pos=2)
    fp32.resume(states, slot=1)
    fp32.rollback(snapshot)
    return {"bf16": runner.model, "fp32": fp32.model, "states": states, "empty": fp32.empty_state(),
            "snapshot": snapshot, "last_call": custom_ops.last_call()}


def build_runner_handover(tmp_dir: str):
    """A bf16 eager runner's snapshot, empty state and handed-over decode; its program's slot migrated."""
    torch.manual_seed(0)
    eager = EagerLlamaRunner(ModelArgs(use_custom_replay_op=True, dtype_override="bf16"))
    eager.generate([1, 2], max_new_tokens=1)
    snapshot, empty = eager.snapshot(), eager.empty_state()
    states = [{name: getattr(cache, name)[:1].clone() for name in _STATE} for cache in eager._caches()]
    eager.decode_prefilled(states, token=3, pos=2)
    decode_call = custom_ops.last_call()
    path = eager.manager.export().save_to_pte(tmp_dir, "kda")
    program = PteLlamaRunner(Path(path))
    program.generate([1, 2], max_new_tokens=1)
    return {"snapshot": snapshot, "empty": empty, "states": states, "decode_call": decode_call,
            "handover": program.handover(0), "state_inputs": program.allocate_state_inputs()}
