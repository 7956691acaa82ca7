"""KDA decode op and layers. The op has the kernel extension's signature; this is the CPU reference
used where the extension is not built (tests, KIND_CPU instances)."""

import torch
import torch.nn.functional as F
from torch import nn

from .state import RingGeometry

DECODE_TRACE: dict[str, torch.Tensor] = {}  # inputs of the last launch, for the metrics

@torch.no_grad()
def fused_recurrent_kda_replayssm_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache,
                                         g_cache, out, ssm_state_indices, write_pos, force_flush=None):
    """Appends each row's step to its slot's rings and replays the rings on the checkpoint state."""
    h, hv, dk, dv = k_cache.shape[1], g_cache.shape[1], k_cache.shape[-1], d_cache.shape[-1]
    q, k, v = mixed_qkv.float().split([h * dk, h * dk, hv * dv], dim=-1)
    rep = hv // h
    q, k, v = q.reshape(-1, h, dk).repeat_interleave(rep, dim=1), k.reshape(-1, h, dk), v.reshape(-1, hv, dv)
    gate = a.float().view(-1, hv, dk) + dt_bias.float().view(1, hv, dk)
    step_decay, beta = -A_log.float().exp().view(1, hv, 1) * F.softplus(gate), b.float().sigmoid().view(-1, hv, 1)
    for row, slot in enumerate(ssm_state_indices.tolist()):
        pos = int(write_pos[row]) % g_cache.shape[2]
        g_cache[slot, :, pos], k_cache[slot, :, pos], d_cache[slot, :, pos] = step_decay[row], k[row], beta[row] * v[row]
        cum = g_cache[slot, :, : pos + 1].cumsum(dim=1)
        keys = k_cache[slot, :, : pos + 1].float().repeat_interleave(rep, dim=0) * (cum[:, -1:] - cum).exp().float()
        state = initial_state[slot].float() * cum[:, -1:].exp().float()
        state = state + torch.einsum("htv,htk->hvk", d_cache[slot, :, : pos + 1].float(), keys)
        out[row] = torch.einsum("hvk,hk->hv", state, q[row]) * scale
        if force_flush is not None and bool(force_flush[row]):
            initial_state[slot] = state
    DECODE_TRACE.update(delta=d_cache, key=k_cache, decay_log=g_cache, ssm_state=initial_state)
    return out

class KDAReplayLayer(nn.Module):
    """One KDA layer's projections, with its replay rings as buffers (``state_mode: module``)."""

    def __init__(self, hidden: int, geometry: RingGeometry, slots: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        h, hv, d, L = geometry.num_heads, geometry.num_v_heads, geometry.head_dim, geometry.ring_len
        self.qkv = nn.Linear(hidden, (2 * h + hv) * d, bias=False, dtype=dtype)
        self.a_proj = nn.Linear(hidden, hv * d, bias=False, dtype=dtype)
        self.b_proj = nn.Linear(hidden, hv, bias=False, dtype=dtype)
        self.A_log = nn.Parameter(torch.linspace(1.0, 4.0, hv, dtype=dtype).log())
        self.dt_bias = nn.Parameter(torch.full((hv * d,), -0.5, dtype=dtype))
        self.scale, act = d**-0.5, self.qkv.weight.dtype
        self.register_buffer("delta_ring", torch.zeros(slots, hv, L, d, dtype=act))
        self.register_buffer("key_ring", torch.zeros(slots, h, L, d, dtype=act))
        self.register_buffer("decay_log_ring", torch.zeros(slots, hv, L, d, dtype=torch.float32))
        self.register_buffer("ssm_state", torch.zeros(slots, hv, d, d, dtype=torch.float32))

    def forward(self, hidden, slots, write_pos, flush=None, rings=None):
        """One decode step; ``rings`` (delta, key, decay_log, ssm_state) stands in for the buffers."""
        delta, key, decay, state = rings or (self.delta_ring, self.key_ring, self.decay_log_ring, self.ssm_state)
        out = hidden.new_zeros(hidden.shape[0], decay.shape[1], delta.shape[-1])
        fused_recurrent_kda_replayssm_decode(self.qkv(hidden), self.a_proj(hidden), self.b_proj(hidden), self.A_log,
                                             self.dt_bias, self.scale, state, delta, key, decay, out, slots, write_pos, flush)
        return hidden + out.flatten(1)

class PinnedDecayLayer(KDAReplayLayer):
    """Keeps the decay ring and the checkpoint state fp32 when the whole model is cast."""

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers[name] for name in ("decay_log_ring", "ssm_state")}
        super()._apply(fn, recurse)
        for name, buf in kept.items():
            self._buffers[name] = buf.to(device=self._buffers[name].device)
        return self

class KDAStack(nn.Module):
    def __init__(self, geometry: RingGeometry, num_layers: int, hidden: int, slots: int,
                 dtype: torch.dtype | None = None, layer_cls: type[KDAReplayLayer] = KDAReplayLayer) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layer_cls(hidden, geometry, slots, dtype) for _ in range(num_layers))

def build_layer_bank() -> dict:
    """A pinned stack cast to bf16 after two decode steps, and a bf16 layer moved with ``.to('cpu')``."""
    torch.manual_seed(11)
    stack = KDAStack(RingGeometry(), 2, 8, slots=2, layer_cls=PinnedDecayLayer).to(torch.bfloat16)
    hidden, slots = torch.randn(2, 8, dtype=torch.bfloat16), torch.tensor([1, 0], dtype=torch.int32)
    for step in range(2):
        for layer in stack.layers:
            hidden = layer(hidden, slots, torch.full((2,), step, dtype=torch.int32))
    single = KDAReplayLayer(8, RingGeometry(), slots=1, dtype=torch.bfloat16).to("cpu")
    return {"stack": stack, "single": single, "last_launch": dict(DECODE_TRACE)}
