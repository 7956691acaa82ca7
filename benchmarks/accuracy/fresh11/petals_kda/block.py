"""The KDA block as petals_kda servers run it, and the replay decode entry point.

``replayssm_decode`` has the signature of the fused kernel in the server extension; this CPU version is what
servers without the extension run. A session keeps a checkpoint state and three rings: deltas and keys in the
block dtype, log-gates (per-step log-decays) in float32, since the replay sums them over the ring.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

DTYPE_MAP = dict(bfloat16=torch.bfloat16, float16=torch.float16, float32=torch.float32, auto="auto")
GATE_CACHE_DTYPE = torch.float32
RING_NAMES = ("delta", "key", "log_gate")


@dataclasses.dataclass
class KDAConfig:
    """What blocks and servers read of ``DistributedKDAConfig``."""

    hidden_size: int = 8
    num_heads: int = 2
    num_v_heads: int = 2
    head_dim: int = 4
    ring_len: int = 4
    num_hidden_layers: int = 2
    torch_dtype: str = "bfloat16"
    dht_prefix: str = "kda-tiny-hf"
    tuning_mode: Optional[str] = None
    pre_seq_len: int = 2

    @property
    def block_uids(self) -> list[str]:
        return [f"{self.dht_prefix}.{index}" for index in range(self.num_hidden_layers)]

    def ring_shapes(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        h, hv, d, length = self.num_heads, self.num_v_heads, self.head_dim, self.ring_len
        return {"delta": (batch_size, hv, length, d), "key": (batch_size, h, length, d),
                "log_gate": (batch_size, hv, length, d)}

    def state_shape(self, batch_size: int) -> tuple[int, ...]:
        return (batch_size, self.num_v_heads, self.head_dim, self.head_dim)


LAST_LAUNCH: dict[str, torch.Tensor] = {}


@torch.no_grad()
def replayssm_decode(q, k, v, a, beta, *, A_log, dt_bias, ssm_state, delta_cache, key_cache, log_gate_cache,
                     cache_positions, scale=None):
    """Writes each row's step at ``cache_positions[row]`` of its rings and replays the rings on ``ssm_state``;
    a full ring is folded into the state. q, k: [B, H, K]; v: [B, HV, V]; a: [B, HV * K]; beta: [B, HV]."""
    batch, hv, ring_len, dk = log_gate_cache.shape
    rep = hv // key_cache.shape[1]
    scale = dk**-0.5 if scale is None else scale
    gate = a.float().view(batch, hv, dk) + dt_bias.float().view(1, hv, dk)
    step_log_gate = -A_log.float().exp().view(1, hv, 1) * F.softplus(gate)
    out = torch.zeros(batch, hv, v.shape[-1], dtype=torch.float32)
    for row in range(batch):
        pos = int(cache_positions[row]) % ring_len
        log_gate_cache[row, :, pos] = step_log_gate[row]
        key_cache[row, :, pos] = k[row]
        delta_cache[row, :, pos] = beta[row].float().unsqueeze(-1) * v[row].float()
        cum = log_gate_cache[row, :, : pos + 1].float().cumsum(dim=1)
        keys = key_cache[row, :, : pos + 1].float().repeat_interleave(rep, dim=0) * (cum[:, -1:] - cum).exp()
        state = ssm_state[row].float() * cum[:, -1:].exp()
        state = state + torch.einsum("htv,htk->hvk", delta_cache[row, :, : pos + 1].float(), keys)
        out[row] = torch.einsum("hvk,hk->hv", state, q[row].float().repeat_interleave(rep, dim=0)) * scale
        if pos == ring_len - 1:
            ssm_state[row] = state
    LAST_LAUNCH.clear()
    LAST_LAUNCH.update(delta_cache=delta_cache, key_cache=key_cache, log_gate_cache=log_gate_cache, ssm_state=ssm_state)
    return out.to(q.dtype)


def cast_projections(block: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Casts the linear layers only, which is what swapping them for quantized layers does to a block."""
    for module in block.modules():
        if isinstance(module, nn.Linear):
            module.to(dtype)
    return block


class WrappedKDABlock(nn.Module):
    """One KDA layer. Sessions bring their caches from the server's MemoryCache; the block's own rings
    serve ``rpc_forward`` calls, which have no session."""

    def __init__(self, config: KDAConfig, layer_idx: int = 0, ring_batch: int = 1):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        h, hv, d, hidden = config.num_heads, config.num_v_heads, config.head_dim, config.hidden_size
        self.q_proj = nn.Linear(hidden, h * d, bias=False)
        self.k_proj = nn.Linear(hidden, h * d, bias=False)
        self.v_proj = nn.Linear(hidden, hv * d, bias=False)
        self.a_proj = nn.Linear(hidden, hv * d, bias=False)
        self.b_proj = nn.Linear(hidden, hv, bias=False)
        self.o_proj = nn.Linear(hv * d, hidden, bias=False)
        self.A_log = nn.Parameter(torch.linspace(1.0, 8.0, hv).log())
        self.dt_bias = nn.Parameter(torch.full((hv * d,), -1.0))
        shapes, dtype = config.ring_shapes(ring_batch), self.q_proj.weight.dtype
        self.register_buffer("delta_ring", torch.zeros(shapes["delta"], dtype=dtype), persistent=False)
        self.register_buffer("key_ring", torch.zeros(shapes["key"], dtype=dtype), persistent=False)
        self.register_buffer("log_gate_ring", torch.zeros(shapes["log_gate"]), persistent=False)  # expect-bug: default-dtype id=block-init
        self.register_buffer("ssm_state", torch.zeros(config.state_shape(ring_batch), dtype=torch.float32),
                             persistent=False)
        self.register_buffer("ring_positions", torch.zeros(ring_batch, dtype=torch.int32), persistent=False)

    @property
    def cache_dtypes(self) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
        """(delta, key, log_gate) dtypes of this block's session caches."""
        dtype = self.q_proj.weight.dtype
        return dtype, dtype, dtype  # expect-bug: container id=cache-dtypes

    def project(self, x: torch.Tensor):
        c, batch = self.config, x.shape[0]
        q = self.q_proj(x).view(batch, c.num_heads, c.head_dim)
        k = F.normalize(self.k_proj(x).view(batch, c.num_heads, c.head_dim), dim=-1)
        v = self.v_proj(x).view(batch, c.num_v_heads, c.head_dim)
        return q, k, v, self.a_proj(x), self.b_proj(x).sigmoid()

    def forward(self, hidden_states, cache=None, positions=None):
        """``hidden_states`` [batch, hidden]; ``cache`` a client's (delta, key, log_gate, state) and
        ``positions`` its ring positions, or the block's own rings when there is no session."""
        own = cache is None
        delta, key, log_gate, state = (self.delta_ring, self.key_ring, self.log_gate_ring, self.ssm_state) if own else cache
        positions = self.ring_positions if positions is None else positions
        q, k, v, a, beta = self.project(hidden_states.to(self.q_proj.weight.dtype))
        out = replayssm_decode(q, k, v, a, beta, A_log=self.A_log, dt_bias=self.dt_bias, ssm_state=state,
                               delta_cache=delta, key_cache=key, log_gate_cache=log_gate, cache_positions=positions)
        if own:
            self.ring_positions += 1
        return hidden_states + self.o_proj(out.flatten(1)).to(hidden_states.dtype)

    def reset_rings(self, batch_size: int) -> None:
        """Re-allocates the session-less rings for ``batch_size`` rows (``rpc_forward`` with a new batch size)."""
        device, dtype = self.q_proj.weight.device, self.q_proj.weight.dtype
        for name, shape in self.config.ring_shapes(batch_size).items():
            setattr(self, f"{name}_ring", torch.zeros(shape, dtype=dtype, device=device))  # expect-bug: pool-dtype
        self.ssm_state = torch.zeros(self.config.state_shape(batch_size), dtype=torch.float32, device=device)
        self.ring_positions = torch.zeros(batch_size, dtype=torch.int32, device=device)

    @torch.no_grad()
    def prefill_rings(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor]:
        """Session caches for a prompt of ``T <= ring_len`` tokens ([batch, T, hidden]) in one pass; the slots
        past the prompt get log-gate 0 (no decay), and the first decode step writes at ``T``."""
        c, (batch, length, _) = self.config, hidden_states.shape
        q, k, v, a, beta = self.project(hidden_states.flatten(0, 1).to(self.q_proj.weight.dtype))
        shapes, (delta_dtype, key_dtype, _) = c.ring_shapes(batch), self.cache_dtypes
        delta, key = torch.zeros(shapes["delta"], dtype=delta_dtype), torch.zeros(shapes["key"], dtype=key_dtype)
        delta[:, :, :length] = (beta.unsqueeze(-1) * v).view(batch, length, c.num_v_heads, c.head_dim).transpose(1, 2)
        key[:, :, :length] = k.view(batch, length, c.num_heads, c.head_dim).transpose(1, 2)
        a = F.pad(a.view(batch, length, c.num_v_heads, c.head_dim), (0, 0, 0, 0, 0, c.ring_len - length))
        step = -self.A_log.exp().view(1, -1, 1, 1) * F.softplus(a.transpose(1, 2) + self.dt_bias.view(1, -1, 1, c.head_dim))
        filled = torch.arange(c.ring_len).view(1, 1, -1, 1) < length
        log_gate = torch.where(filled, step, torch.tensor(0.0))  # expect-bug: promotion
        return {"delta_cache": delta, "key_cache": key, "log_gate_cache": log_gate,
                "positions": torch.full((batch,), length, dtype=torch.int32)}


class PinnedGateKDABlock(WrappedKDABlock):
    """A block whose log-gate ring and checkpoint state stay float32 however the block is cast."""

    _fp32_buffers = ("log_gate_ring", "ssm_state")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_gate_ring = self.log_gate_ring.float()  # also when built under another default dtype

    @property
    def cache_dtypes(self) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
        dtype = self.q_proj.weight.dtype
        return dtype, dtype, GATE_CACHE_DTYPE

    def reset_rings(self, batch_size: int) -> None:
        super().reset_rings(batch_size)
        self.log_gate_ring = self.log_gate_ring.to(GATE_CACHE_DTYPE)

    def _apply(self, fn, recurse=True):
        held = {name: self._buffers.pop(name) for name in self._fp32_buffers}
        try:
            super()._apply(fn, recurse)
        finally:
            device = self.q_proj.weight.device
            self._buffers.update({name: buf.to(device=device) for name, buf in held.items()})
        return self


def build_reference_blocks() -> dict:
    """An fp32 block, and pinned blocks cast to bf16 and fp16 (the second resized), one step each."""
    torch.manual_seed(3)
    config = KDAConfig()
    block, pinned = WrappedKDABlock(config), PinnedGateKDABlock(config).to(torch.bfloat16)
    half = PinnedGateKDABlock(config, ring_batch=2).half()
    hidden = torch.randn(1, config.hidden_size)
    block(hidden)
    pinned(hidden.bfloat16())
    launch = dict(LAST_LAUNCH)
    half.reset_rings(1)
    half(hidden.half())
    return {"block": block, "pinned": pinned, "half": half, "launch": launch}


def build_forward_rings() -> dict:
    """Prompt caches of an fp32 and a bf16 block, and a block with bf16 projections resized to two rows."""
    torch.manual_seed(5)
    config = KDAConfig()
    prompt = torch.randn(1, 3, config.hidden_size)
    fp32_block, bf16_block = WrappedKDABlock(config), PinnedGateKDABlock(config).to(torch.bfloat16)
    resized = cast_projections(WrappedKDABlock(config), torch.bfloat16)
    resized.reset_rings(2)
    resized(torch.randn(2, config.hidden_size))
    return {"fp32_prompt": fp32_block.prefill_rings(prompt), "bf16_prompt": bf16_block.prefill_rings(prompt.bfloat16()),
            "resized": resized}
