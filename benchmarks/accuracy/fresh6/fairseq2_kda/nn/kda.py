"""Kimi Delta Attention with a ReplaySSM incremental decode step."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import DataType, Device, KDAConfig
from .incremental_state import IncrementalStateBag, ReplayRingState

# What the decode op was last given (read by the profiler and by the debug dumps).
LAST_DECODE: dict[str, Tensor] = {}


@torch.no_grad()
def kda_replayssm_decode(
    mixed_qkv: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, scale: float,
    initial_state: Tensor, d_cache: Tensor, k_cache: Tensor, g_cache: Tensor, out: Tensor,
    ssm_state_indices: Tensor, write_pos: Tensor, force_flush: Tensor | None = None,
) -> Tensor:
    """CPU reference of the fused kernel: appends the step to the slot's rings and replays them
    on top of the checkpoint state; ``force_flush`` folds the replayed state into the checkpoint."""
    hv, hk, d = g_cache.shape[1], k_cache.shape[1], g_cache.shape[-1]
    q, k, v = mixed_qkv.float().split([hk * d, hk * d, hv * d], dim=-1)
    q = q.view(-1, hk, d).repeat_interleave(hv // hk, dim=1)
    k, v = k.view(-1, hk, d), v.view(-1, hv, d)
    gate = a.float().view(-1, hv, d) + dt_bias.float().view(1, hv, d)
    log_decay = -A_log.float().exp().view(1, hv, 1) * F.softplus(gate)
    beta = b.float().sigmoid().view(-1, hv, 1)
    for i, slot in enumerate(ssm_state_indices.tolist()):
        pos = int(write_pos[i])
        g_cache[slot, :, pos] = log_decay[i]
        k_cache[slot, :, pos] = k[i]
        d_cache[slot, :, pos] = beta[i] * v[i]
        decay = g_cache[slot, :, : pos + 1].cumsum(dim=1).exp().float()
        keys = k_cache[slot, :, : pos + 1].float().repeat_interleave(hv // hk, dim=0)
        state = initial_state[slot].float() * decay[:, -1].unsqueeze(1)
        replay = torch.einsum("htv,htk->hvk", d_cache[slot, :, : pos + 1].float(), keys * decay[:, -1:] / decay)
        state = state + replay
        out[i] = torch.einsum("hvk,hk->hv", state, q[i]) * scale
        if force_flush is not None and bool(force_flush[i]):
            initial_state[slot] = state
    LAST_DECODE.clear()
    LAST_DECODE.update(alpha_log=g_cache, d_ring=d_cache, k_ring=k_cache, checkpoint=initial_state)
    return out


_DECODE_OPS: dict[str, Callable[..., Tensor]] = {"replayssm": kda_replayssm_decode}


def get_decode_op(name: str) -> Callable[..., Tensor]:
    return _DECODE_OPS[name]


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: KDAConfig, *, device: Device | None = None, dtype: DataType | None = None) -> None:
        super().__init__()
        self.config = config
        hv, d, kw = config.num_v_heads, config.head_dim, {"device": device, "dtype": dtype}
        self.qkv_proj = nn.Linear(config.model_dim, config.qkv_dim, bias=False, **kw)
        self.a_proj = nn.Linear(config.model_dim, hv * d, bias=False, **kw)
        self.b_proj = nn.Linear(config.model_dim, hv, bias=False, **kw)
        self.output_proj = nn.Linear(hv * d, config.model_dim, bias=False, **kw)
        self.A_log = nn.Parameter(torch.empty(hv, **kw))
        self.dt_bias = nn.Parameter(torch.empty(hv * d, **kw))
        self.scale = d**-0.5
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for proj in (self.qkv_proj, self.a_proj, self.b_proj, self.output_proj):
                nn.init.normal_(proj.weight, std=0.3)
            self.A_log.copy_(torch.linspace(1.0, 4.0, self.A_log.numel()).log())
            self.dt_bias.fill_(-0.5)

    def projections(self, seqs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.qkv_proj(seqs), self.a_proj(seqs), self.b_proj(seqs)

    def forward(self, seqs: Tensor, state_bag: IncrementalStateBag) -> Tensor:
        """One decode step; ``seqs`` is [batch, model_dim]."""
        state = state_bag.get_state(self, ReplayRingState)
        if state is None:
            state = ReplayRingState.allocate(self.config, seqs.size(0), dtype=seqs.dtype)
            state_bag.set_state(self, state)
        decode = get_decode_op(self.config.decode_op)
        out = seqs.new_empty(seqs.size(0), self.config.num_v_heads, self.config.head_dim)
        qkv, a, b = self.projections(seqs)
        flush = state.write_pos == self.config.replay_len - 1
        decode(qkv, a, b, self.A_log, self.dt_bias, self.scale, state.checkpoint, state.d_ring, state.k_ring,
               state.log_alpha_ring, out, state.slots, state.write_pos, force_flush=flush)
        state.write_pos = (state.write_pos + 1) % self.config.replay_len
        return self.output_proj(out.flatten(1))

    @torch.no_grad()
    def seed_from_prompt(self, prompt: Tensor) -> ReplayRingState:
        """Prefill: fills the rings from the last ``replay_len`` steps of ``prompt`` [batch, steps, dim]."""
        hv, hk, d, n = self.config.num_v_heads, self.config.num_k_heads, self.config.head_dim, self.config.replay_len
        tail = prompt[:, -n:]
        gates = self.a_proj(tail).unflatten(-1, (hv, d)).transpose(1, 2)
        log_alpha = -torch.exp(self.A_log).view(1, hv, 1, 1) * F.softplus(gates + self.dt_bias.view(1, hv, 1, d))  # expect-bug: promotion id=fs2-prompt-gates
        state = ReplayRingState.allocate(self.config, prompt.size(0), dtype=prompt.dtype)
        _, k, v = self.qkv_proj(tail).split([hk * d, hk * d, hv * d], dim=-1)
        beta = self.b_proj(tail).sigmoid().transpose(1, 2).unsqueeze(-1)
        state.k_ring.copy_(k.unflatten(-1, (hk, d)).transpose(1, 2))
        state.d_ring.copy_(beta * v.unflatten(-1, (hv, d)).transpose(1, 2))
        state.log_alpha_ring = log_alpha  # expect-bug: promotion id=fs2-prompt-gates
        return state


def decode_with_static_rings(layer: KimiDeltaAttention, seqs: Tensor, rings: dict[str, Tensor], write_pos: Tensor) -> Tensor:
    """A decode step against rings owned by a captured graph (fixed addresses, no state bag)."""
    out = seqs.new_zeros(seqs.size(0), layer.config.num_v_heads, layer.config.head_dim)
    qkv, a, b = layer.projections(seqs)
    slots = torch.arange(seqs.size(0))
    alpha_log = rings["alpha_log"].to(seqs.dtype)  # expect-bug: decode-arg id=fs2-static-arg
    kda_replayssm_decode(
        qkv, a, b, layer.A_log, layer.dt_bias, layer.scale, rings["checkpoint"],
        rings["delta"], rings["key"], alpha_log, out, slots, write_pos,  # expect-bug: decode-arg id=fs2-static-arg
    )
    return out


def _layer_and_inputs() -> tuple[KimiDeltaAttention, Tensor]:
    layer = KimiDeltaAttention(KDAConfig(), dtype=torch.bfloat16)
    return layer, torch.linspace(-1.0, 1.0, 80).view(5, 2, 8).to(torch.bfloat16)


def build_layer_decode() -> dict[str, object]:
    layer, seqs = _layer_and_inputs()
    bag = IncrementalStateBag(max_num_steps=8)
    for step in seqs:
        layer(step, bag)
    return {"kernel": dict(LAST_DECODE), "state": bag.get_state(layer, ReplayRingState)}


def build_prompt_seed() -> ReplayRingState:
    layer, seqs = _layer_and_inputs()
    return layer.seed_from_prompt(seqs.transpose(0, 1))
