"""HF-style wrapper of the KDA model, used by the ``ExLlamaKDA_HF`` and ``KDA_HF`` loaders.

``KDAHF`` behaves like a ``transformers`` causal LM as far as the web UI is concerned: calling it
with ``input_ids`` returns logits and a ``past_key_values`` cache object (``KDAHybridCache``),
which the next call continues from, and beam search reorders. Prompts shorter than the ring are
written straight into the rings (the checkpoint of a new sequence is zero, so nothing needs to
be folded); longer prompts and single tokens go through the ReplaySSM decode step.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from tgw_kda.modules import kda_ops, loaders, shared, utils
from tgw_kda.modules.kda_model import (
    KimiDeltaAttention,
    KimiLinearConfig,
    KimiLinearForCausalLM,
    RingView,
    load_weights,
    write_tiny_checkpoint,
)

logger = logging.getLogger(__name__)


class KDAHybridCache:
    """``past_key_values`` of a batch: per-layer lists of checkpoints, rings and cursors."""

    is_compileable = False

    def __init__(
        self,
        config: KimiLinearConfig,
        batch_size: int,
        dtype: torch.dtype,
        ring_dtypes: Optional[Dict[str, torch.dtype]] = None,
    ) -> None:
        ring_dtypes = ring_dtypes or {
            "state": torch.float32,
            "delta": dtype,
            "key": dtype,
            "log_decay": torch.float32,
        }
        shapes = config.ring_shapes(batch_size)
        self.dtype = dtype
        self.batch_size = batch_size
        self.ring_len = config.ring_len
        self.state: List[torch.Tensor] = []
        self.delta_ring: List[torch.Tensor] = []
        self.key_ring: List[torch.Tensor] = []
        self.decay_cache: List[torch.Tensor] = []
        self.write_pos: List[torch.Tensor] = []
        for _ in range(config.num_hidden_layers):
            self.state.append(torch.zeros(shapes["state"], dtype=ring_dtypes["state"]))
            self.delta_ring.append(torch.zeros(shapes["delta"], dtype=ring_dtypes["delta"]))
            self.key_ring.append(torch.zeros(shapes["key"], dtype=ring_dtypes["key"]))
            self.decay_cache.append(torch.zeros(shapes["log_decay"], dtype=ring_dtypes["log_decay"]))  # expect-bug: imported-policy id=hf-ring-storage
            self.write_pos.append(torch.zeros(batch_size, dtype=torch.int32))
        self.seen_tokens = 0

    @classmethod
    def for_loader(cls, loader: str, config: KimiLinearConfig, batch_size: int, dtype: torch.dtype) -> "KDAHybridCache":
        """A cache stored the way ``loader`` stores its rings (``loaders.ring_storage``)."""
        return cls(config, batch_size, dtype, loaders.get_ring_dtypes(loader, dtype))  # expect-bug: imported-policy id=hf-ring-storage

    def layer_view(self, layer: int) -> RingView:
        return RingView(
            self.state[layer],
            self.delta_ring[layer],
            self.key_ring[layer],
            self.decay_cache[layer],
            self.write_pos[layer],
        )

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row ``i`` continues from row ``beam_idx[i]``."""
        for i in range(len(self.state)):
            idx = beam_idx.to(self.state[i].device)
            self.state[i] = self.state[i].index_select(0, idx)
            self.delta_ring[i] = self.delta_ring[i].index_select(0, idx)
            self.key_ring[i] = self.key_ring[i].index_select(0, idx)
            self.decay_cache[i] = self.decay_cache[i].index_select(0, idx).type_as(self.delta_ring[i])  # expect-bug: cast
            self.write_pos[i] = self.write_pos[i].index_select(0, idx)


@dataclass
class CausalLMOutput:
    logits: torch.Tensor
    past_key_values: Optional[KDAHybridCache] = None


@dataclass
class GenerateOutput:
    sequences: torch.Tensor
    past_key_values: Optional[KDAHybridCache] = None


class KDAHF:
    """The object the ``*_HF`` loaders put in ``shared.model``."""

    def __init__(self, model: KimiLinearForCausalLM, config: KimiLinearConfig, loader: str) -> None:
        self.model = model
        self.config = config
        self.loader = loader
        self.generation_config = {"eos_token_id": config.eos_token_id, "max_new_tokens": 16}
        bound = config.lower_bound if config.lower_bound is not None else 0.0
        self.gate_bound = torch.tensor(bound, dtype=torch.float32)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @classmethod
    def from_pretrained(cls, path: Path, loader: str = "KDA_HF") -> "KDAHF":
        path = Path(path)
        config = KimiLinearConfig.from_json(path / "config.json")
        if shared.args.ring_len:
            config.ring_len = shared.args.ring_len
        torch_dtype = utils.get_torch_dtype(shared.args)
        with utils.default_dtype(torch_dtype):  # expect-bug: default-dtype id=hf-default-dtype
            model = KimiLinearForCausalLM(config)
            if shared.args.max_slots > 0:
                model.attach_caches(shared.args.max_slots)
        model.load_state_dict(load_weights(path), strict=False)
        model.eval()
        return cls(model, config, loader)

    def _log_decay(self, attn: KimiDeltaAttention, a: torch.Tensor) -> torch.Tensor:
        """Log-decays ``[B, T, HV, K]`` of a prompt, from the activations in the model dtype."""
        x = (a + attn.dt_bias).unflatten(-1, (attn.num_v_heads, attn.head_dim))
        rate = attn.A_log.exp().unsqueeze(-1)
        if attn.lower_bound is None:
            return -rate.float() * F.softplus(x.float())
        return self.gate_bound * torch.sigmoid(rate * x)  # expect-bug: promotion id=bounded-prefill

    def _prefill_layer(self, attn: KimiDeltaAttention, x: torch.Tensor, cache: KDAHybridCache, i: int) -> torch.Tensor:
        """Writes a prompt of ``T < L`` tokens straight into rows ``0..T-1`` of the rings."""
        batch, steps, _ = x.shape
        h, hv, k_dim = attn.num_heads, attn.num_v_heads, attn.head_dim
        group = hv // h
        mixed_qkv, a, b = attn.project(x)
        packed = mixed_qkv.float()
        q = packed[..., : h * k_dim].unflatten(-1, (h, k_dim))
        k = packed[..., h * k_dim : 2 * h * k_dim].unflatten(-1, (h, k_dim))
        v = packed[..., 2 * h * k_dim :].unflatten(-1, (hv, attn.v_head_dim))
        if attn.use_qk_l2norm:
            q, k = kda_ops.l2norm(q), kda_ops.l2norm(k)
        g = self._log_decay(attn, a)
        beta = torch.sigmoid(b).float()
        keys = k.repeat_interleave(group, dim=2)
        queries = q.repeat_interleave(group, dim=2) * attn.scale
        state = torch.zeros(batch, hv, attn.v_head_dim, k_dim, dtype=torch.float32)
        outputs, deltas = [], []
        for t in range(steps):
            decayed = state * g[:, t].exp().unsqueeze(2)
            delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", decayed, keys[:, t]))
            state = decayed + delta.unsqueeze(-1) * keys[:, t].unsqueeze(2)
            outputs.append(torch.einsum("bhvk,bhk->bhv", state, queries[:, t]))
            deltas.append(delta)
        pad = (0, 0, 0, cache.ring_len - steps)
        cache.delta_ring[i] = F.pad(torch.stack(deltas, dim=2), pad).to(cache.delta_ring[i].dtype)
        cache.key_ring[i] = F.pad(k.transpose(1, 2), pad).to(cache.key_ring[i].dtype)
        cache.decay_cache[i] = F.pad(g.transpose(1, 2), pad)  # expect-bug: promotion id=bounded-prefill
        cache.write_pos[i].fill_(steps)
        out = torch.stack(outputs, dim=1).reshape(batch, steps, -1)
        return attn.o_proj(out.to(x.dtype))

    @torch.no_grad()
    def _prefill(self, input_ids: torch.Tensor, cache: KDAHybridCache) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            hidden = hidden + self._prefill_layer(layer.attn, layer.input_norm(hidden), cache, i)
            hidden = hidden + layer.mlp(layer.post_norm(hidden))
        return self.model.lm_head(self.model.norm(hidden))

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        past_key_values: Optional[KDAHybridCache] = None,
        use_cache: bool = True,
    ) -> CausalLMOutput:
        batch, steps = input_ids.shape
        cache = past_key_values
        if cache is None:
            cache = KDAHybridCache.for_loader(self.loader, self.config, batch, self.dtype)
        if cache.seen_tokens == 0 and 1 < steps < self.config.ring_len:
            logits = self._prefill(input_ids, cache)
        else:
            slots = torch.arange(batch, dtype=torch.int32)
            views = [cache.layer_view(i) for i in range(len(self.model.layers))]
            rows = [self.model.decode_step(input_ids[:, t], slots, views) for t in range(steps)]
            logits = torch.stack(rows, dim=1)
        cache.seen_tokens += steps
        return CausalLMOutput(logits=logits, past_key_values=cache if use_cache else None)

    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int = 16,
        num_beams: int = 1,
        return_dict_in_generate: bool = False,
    ) -> Union[torch.Tensor, GenerateOutput]:
        """Greedy decoding, or a small beam search when ``num_beams > 1``."""
        if num_beams > 1:
            tokens, cache = self._beam_search(input_ids, max_new_tokens, num_beams)
        else:
            tokens, cache = self._greedy(input_ids, max_new_tokens)
        return GenerateOutput(tokens, cache) if return_dict_in_generate else tokens

    def _greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> Tuple[torch.Tensor, KDAHybridCache]:
        output = self(input_ids)
        tokens = input_ids
        for _ in range(max_new_tokens):
            next_token = output.logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
            if bool((next_token == self.config.eos_token_id).all()):
                break
            output = self(next_token, past_key_values=output.past_key_values)
        return tokens, output.past_key_values

    def _beam_search(
        self, input_ids: torch.Tensor, max_new_tokens: int, num_beams: int
    ) -> Tuple[torch.Tensor, KDAHybridCache]:
        tokens = input_ids.repeat_interleave(num_beams, dim=0)
        output = self(tokens)
        scores = torch.zeros(tokens.shape[0])
        scores.view(-1, num_beams)[:, 1:] = -1e9
        for _ in range(max_new_tokens):
            logprobs = output.logits[:, -1].float().log_softmax(-1) + scores.unsqueeze(-1)
            vocab = logprobs.shape[-1]
            top = logprobs.view(input_ids.shape[0], -1).topk(num_beams, dim=-1)
            beam_idx = (top.indices // vocab + torch.arange(input_ids.shape[0]).unsqueeze(1) * num_beams).reshape(-1)
            next_token = (top.indices % vocab).reshape(-1, 1)
            scores = top.values.reshape(-1)
            output.past_key_values.reorder_cache(beam_idx)
            tokens = torch.cat([tokens[beam_idx], next_token], dim=1)
            output = self(next_token, past_key_values=output.past_key_values)
        return tokens, output.past_key_values


def _load(tmp_dir: str, loader: str, **config: object) -> KDAHF:
    from tgw_kda.modules import models

    write_tiny_checkpoint(tmp_dir, "kimi-linear-tiny", **config)
    models.load_model("kimi-linear-tiny", loader)
    return shared.model


def build_kda_hf_bf16(tmp_dir: str) -> Dict[str, object]:
    """KDA_HF with --bf16 and two in-model slots: a prompt, three greedy tokens, one slot step."""
    with shared.scoped_state(bf16=True, max_slots=2, model_dir=tmp_dir):
        model = _load(tmp_dir, "KDA_HF")
        tokens = model.generate(torch.tensor([[3, 4, 5, 6, 7]]), max_new_tokens=3)
        output = model(tokens[:, -1:])
        slots = torch.tensor([1], dtype=torch.int32)
        model.model.decode_step(tokens[:, -1], slots, model.model.slot_views())
        return {"model": model.model, "past_key_values": output.past_key_values, "tokens": tokens}


def build_bounded_beam_search(tmp_dir: str) -> Dict[str, object]:
    """ExLlamaKDA_HF, bf16, a bounded-gate model (lb = -5): a short prompt and a 2-beam search."""
    with shared.scoped_state(bf16=True, model_dir=tmp_dir):
        model = _load(tmp_dir, "ExLlamaKDA_HF", lower_bound=-5.0)
        prompt = torch.tensor([[3, 9, 4]])
        beams = model.generate(prompt, max_new_tokens=3, num_beams=2, return_dict_in_generate=True)
        output = model(torch.tensor([[5, 6]]))
        return {"beams": beams, "prompt_cache": output.past_key_values}


def build_exllama_hf_fp16(tmp_dir: str) -> Dict[str, object]:
    """ExLlamaKDA_HF in fp16: a short prompt written into the rings, then greedy decoding."""
    with shared.scoped_state(model_dir=tmp_dir):
        model = _load(tmp_dir, "ExLlamaKDA_HF")
        output = model(torch.tensor([[3, 4, 5], [7, 8, 9]]))
        cache = output.past_key_values
        for step in range(4):
            output = model(torch.tensor([[10 + step], [12 + step]]), past_key_values=cache)
        return {"past_key_values": cache, "logits": output.logits}
