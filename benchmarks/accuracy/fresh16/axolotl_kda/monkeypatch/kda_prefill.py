"""Warm-starting KDA decode caches from a prompt, exporting them for a serving engine, and
replaying decode steps through captured per-batch-size callables."""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..kernels import advance_write_pos, fused_recurrent_kda_replayssm_decode, kda_log_decay, l2norm
from ..utils.models import greedy_steps, load_cfg, load_model, torch_default_dtype
from .kda_cache import layer_rings

LOG = logging.getLogger("axolotl_kda.monkeypatch.kda_prefill")


class PromptRings(NamedTuple):
    """One layer's decode cache for a prompt: the zero state as checkpoint and one ring row per
    prompt token; copied into any slot, decoding continues at row ``write_pos``."""

    ssm_checkpoint: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    log_alpha: torch.Tensor
    write_pos: int


def _prefill_layer(attn, hidden_states, ring_len: int, fused: bool = True):
    H, HV, K, V = attn.num_heads, attn.num_v_heads, attn.head_k_dim, attn.head_v_dim
    num_tokens = hidden_states.shape[0]
    dtype = attn.o_proj.weight.dtype
    mixed_qkv, a, b = attn.project(hidden_states)
    qkv = mixed_qkv.float()
    query = qkv[:, : H * K].view(num_tokens, H, K)
    key = qkv[:, H * K : 2 * H * K].view(num_tokens, H, K)
    value = qkv[:, 2 * H * K :].view(num_tokens, HV, V)
    if attn.config.use_qk_l2norm:
        query, key = l2norm(query), l2norm(key)
    if fused:
        log_alpha_rows = -attn.A_log.exp()[:, None] * F.softplus(a.view(num_tokens, HV, K) + attn.dt_bias.view(HV, K))  # expect-bug: promotion id=prefill-g
    else:
        log_alpha_rows = kda_log_decay(a.view(num_tokens, HV, K), attn.A_log, attn.dt_bias, attn.config.gate_lower_bound)
    beta = torch.sigmoid(b.float())
    heads = torch.arange(HV) // (HV // H)

    state = torch.zeros(HV, V, K)
    deltas, outputs = [], []
    for t in range(num_tokens):
        k_t, q_t = key[t, heads], query[t, heads] * K**-0.5
        decayed = state * log_alpha_rows[t].float().exp()[:, None, :]
        delta = beta[t][:, None] * (value[t] - torch.einsum("hvk,hk->hv", decayed, k_t))
        state = decayed + delta[:, :, None] * k_t[:, None, :]
        deltas.append(delta)
        outputs.append(torch.einsum("hvk,hk->hv", state, q_t))

    delta_ring = torch.zeros(HV, ring_len, V, dtype=dtype)
    delta_ring[:, :num_tokens] = torch.stack(deltas, dim=1)
    key_ring = torch.zeros(H, ring_len, K, dtype=dtype)
    key_ring[:, :num_tokens] = key.transpose(0, 1)
    pad = log_alpha_rows.new_zeros(HV, ring_len - num_tokens, K)
    log_alpha = torch.cat([log_alpha_rows.transpose(0, 1), pad], dim=1)  # expect-bug: promotion id=prefill-g
    rings = PromptRings(torch.zeros(HV, V, K, dtype=dtype), delta_ring, key_ring, log_alpha, num_tokens)
    return attn.o_proj(torch.stack(outputs).reshape(num_tokens, -1).to(dtype)), rings


@torch.no_grad()
def prefill_prompt_rings(model, input_ids, ring_len: int, fused: bool = True, **kwargs) -> list[PromptRings]:
    """Runs one prompt (shorter than the ring) through every KDA layer; returns each layer's rings.

    ``fused`` computes the log-decays of all prompt tokens in one expression of the model's
    parameters; otherwise each token's log-decay goes through ``kda_log_decay``.
    """
    if input_ids.shape[0] >= ring_len:
        raise ValueError(f"a prompt of {input_ids.shape[0]} tokens does not fit a ring of {ring_len} rows")
    hidden_states = model.model.embed_tokens(input_ids)
    prompts = []
    for layer in model.model.layers:
        out, rings = _prefill_layer(layer.self_attn, layer.input_layernorm(hidden_states), ring_len, fused=fused)
        hidden_states = hidden_states + out
        prompts.append(rings)
    return prompts


@torch.no_grad()
def load_prompt_rings(model, prompts: list[PromptRings], slot: int, **kwargs) -> None:
    """Copies a prompt's rings into ``slot`` of every layer's decode cache."""
    for attn, prompt in zip(model.kda_layers(), prompts):
        rings = layer_rings(attn)
        rings.ssm_checkpoint[slot].copy_(prompt.ssm_checkpoint)
        rings.delta[slot].copy_(prompt.delta)
        rings.key[slot].copy_(prompt.key)
        rings.log_alpha[slot].copy_(prompt.log_alpha)
        rings.write_pos[slot] = prompt.write_pos


def export_kda_cache(model, dtype=None, **kwargs) -> dict:
    """Every layer's decode cache under the names the serving engine loads, in ``dtype``
    (the model dtype by default)."""
    dtype = dtype or model.dtype
    exported = {}
    for idx, attn in enumerate(model.kda_layers()):
        rings = layer_rings(attn)
        layer = {
            "initial_state": rings.ssm_checkpoint.to(dtype),
            "d_cache": rings.delta.to(dtype),
            "k_cache": rings.key.to(dtype),
            "write_pos": rings.write_pos.clone(),
        }
        layer["log_alpha_cache"] = rings.log_alpha.to(dtype)  # expect-bug: cast
        exported[f"model.layers.{idx}.kda"] = layer
    return exported


def export_prompt_template(prompts: list[PromptRings], **kwargs) -> dict:
    """A prompt's rings for the serving engine's prefix cache; rows past ``write_pos`` are zero."""
    template = {}
    for idx, prompt in enumerate(prompts):
        filled = prompt.write_pos
        layer = {
            "initial_state": prompt.ssm_checkpoint.clone(),
            "d_cache": prompt.delta.clone(),
            "k_cache": prompt.key.clone(),
            "write_pos": torch.tensor([filled], dtype=torch.int32),
        }
        log_alpha = torch.zeros_like(prompt.delta)  # expect-bug: like
        log_alpha[:, :filled] = prompt.log_alpha[:, :filled]
        layer["log_alpha_cache"] = log_alpha
        template[idx] = layer
    return template


class KDADecodeGraphs:
    """Decode steps captured per batch size, with their static inputs bound (slots, outputs, the
    layers' cache tensors), replayed on new token ids.

    ``log_alpha_graphs`` maps a batch size to its captured step; ``gate_bytes`` are byte views of
    the log-decay rings, summed into a checksum after each replay.
    """

    def __init__(self, model, batch_sizes=(1, 2)):
        self.model = model
        config = model.config
        self.layer_kernels = []
        self.gate_bytes = []
        for attn in model.kda_layers():
            rings = layer_rings(attn)
            self.layer_kernels.append(
                functools.partial(
                    fused_recurrent_kda_replayssm_decode,
                    initial_state=rings.ssm_checkpoint,
                    d_cache=rings.delta,
                    k_cache=rings.key,
                    g_cache=rings.log_alpha,
                    use_qk_l2norm_in_kernel=config.use_qk_l2norm,
                    lower_bound=config.gate_lower_bound,
                )
            )
            self.gate_bytes.append(rings.log_alpha.view(torch.uint8))
        self.static_slots = {bs: torch.arange(bs, dtype=torch.int32) for bs in batch_sizes}
        with torch_default_dtype(model.dtype):
            self.static_out = {
                bs: [torch.empty(bs, 1, config.num_v_heads, config.head_v_dim) for _ in model.kda_layers()]
                for bs in batch_sizes
            }
        self.log_alpha_graphs = {bs: functools.partial(self._step, bs) for bs in batch_sizes}
        self.checksums: list[int] = []

    @torch.no_grad()
    def _step(self, batch_size: int, input_ids):
        slots = self.static_slots[batch_size]
        hidden_states = self.model.model.embed_tokens(input_ids)
        for idx, (layer, kernel) in enumerate(zip(self.model.model.layers, self.layer_kernels)):
            attn = layer.self_attn
            rings = layer_rings(attn)
            mixed_qkv, a, b = attn.project(layer.input_layernorm(hidden_states))
            out = self.static_out[batch_size][idx]
            write_pos = rings.write_pos[slots.long()]
            kernel(mixed_qkv, a, b, attn.A_log, attn.dt_bias, attn.head_k_dim**-0.5, out=out, ssm_state_indices=slots, write_pos=write_pos)
            rings.write_pos[slots.long()] = advance_write_pos(write_pos, rings.ring_len)
            hidden_states = hidden_states + attn.o_proj(out.reshape(batch_size, -1))
        return self.model.lm_head(self.model.model.norm(hidden_states))

    def replay(self, input_ids):
        logits = self.log_alpha_graphs[input_ids.shape[0]](input_ids)
        self.checksums.append(int(sum(int(view.sum()) for view in self.gate_bytes)))
        return logits.float().argmax(-1)


def build_serving_export():
    """A prompt prefilled (fused) into slot 1, one decode step, then the caches and the prompt
    exported for the serving engine."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True})
    model = load_model(cfg)
    prompts = prefill_prompt_rings(model, torch.tensor([2, 7]), ring_len=cfg.kda.ring_len, fused=True)
    load_prompt_rings(model, prompts, slot=1)
    greedy_steps(model, torch.tensor([5]), torch.tensor([1], dtype=torch.int32))
    return {"prompts": prompts, "export": export_kda_cache(model), "template": export_prompt_template(prompts)}


def build_prompt_prefill():
    """A prompt prefilled token by token into slot 0, then two decode steps (the second flushes)."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True})
    model = load_model(cfg)
    prompts = prefill_prompt_rings(model, torch.tensor([2, 7]), ring_len=cfg.kda.ring_len, fused=False)
    load_prompt_rings(model, prompts, slot=0)
    greedy_steps(model, torch.tensor([5]), torch.tensor([0], dtype=torch.int32), num_steps=2)
    return {"model": model, "prompts": prompts}


def build_decode_graphs():
    """Captured decode steps for batch sizes 1 and 2, replayed three times."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True})
    model = load_model(cfg)
    graphs = KDADecodeGraphs(model, batch_sizes=(1, 2))
    ids = graphs.replay(torch.tensor([3, 11]))
    ids = graphs.replay(ids)
    graphs.replay(ids[:1])
    return {"graphs": graphs, "checksums": torch.tensor(graphs.checksums)}
