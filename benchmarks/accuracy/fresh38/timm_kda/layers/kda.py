""" Kimi Delta Attention (KDA) token mixer w/ ReplaySSM decode caches

Paper: `Kimi Linear: An Expressive, Efficient Attention Architecture` - https://arxiv.org/abs/2510.26692

Prompt / training path runs the chunked delta rule from a zero state. Decode runs one token per
slot through ``fused_recurrent_kda_replayssm_decode`` on either the module's own cache buffers
(``init_cache``) or rings handed in by the caller (``models._cache.ReplayCache``).
"""
import math
from typing import Dict, Mapping, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.replayssm import advance_write_pos, chunk_kda, fused_recurrent_kda_replayssm_decode
from .config import use_fused_attn
from .create_norm import get_norm_layer

__all__ = ['KimiDeltaAttention', 'RING_BUFFER_NAMES']

# buffer names, in kernel argument order
RING_BUFFER_NAMES = ('ssm_state', 'delta_ring', 'key_ring', 'decay_log_ring', 'ring_pos')


class KimiDeltaAttention(nn.Module):
    fused_attn: bool

    def __init__(
            self,
            dim: int,
            num_heads: int = 2,
            num_v_heads: Optional[int] = None,
            head_dim: Optional[int] = None,
            gate_fn: str = 'softplus',
            gate_lower_bound: float = -5.0,
            gate_rank: Optional[int] = None,
            qkv_bias: bool = False,
            proj_bias: bool = False,
            qk_l2norm: bool = True,
            norm_layer: str = 'rmsnorm',
            device=None,
            dtype=None,
            **kwargs,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads or num_heads
        assert self.num_v_heads % self.num_heads == 0, 'num_v_heads should be a multiple of num_heads'
        self.head_dim = head_dim or dim // num_heads
        self.gate_fn = gate_fn
        self.gate_lower_bound = gate_lower_bound
        self.qk_l2norm = qk_l2norm
        self.fused_attn = use_fused_attn()
        qk_dim = self.num_heads * self.head_dim
        v_dim = self.num_v_heads * self.head_dim
        gate_rank = gate_rank or self.head_dim

        self.q_proj = nn.Linear(dim, qk_dim, bias=qkv_bias, **dd)
        self.k_proj = nn.Linear(dim, qk_dim, bias=qkv_bias, **dd)
        self.v_proj = nn.Linear(dim, v_dim, bias=qkv_bias, **dd)
        self.f_proj = nn.Sequential(
            nn.Linear(dim, gate_rank, bias=False, **dd),
            nn.Linear(gate_rank, v_dim, bias=False, **dd),
        )
        self.b_proj = nn.Linear(dim, self.num_v_heads, bias=False, **dd)
        self.g_proj = nn.Sequential(
            nn.Linear(dim, gate_rank, bias=False, **dd),
            nn.Linear(gate_rank, v_dim, bias=True, **dd),
        )
        self.o_norm = get_norm_layer(norm_layer)(self.head_dim, **dd)
        self.o_proj = nn.Linear(v_dim, dim, bias=proj_bias, **dd)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads, **dd))
        self.dt_bias = nn.Parameter(torch.empty(v_dim, **dd))
        self.cache_slots = 0
        self.ring_len = 0
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, dt_min: float = 1e-3, dt_max: float = 0.1):
        self.A_log.copy_(torch.linspace(1., 16., self.num_v_heads).log())
        dt = torch.exp(torch.rand(self.dt_bias.shape) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def log_decay(self, f: torch.Tensor) -> torch.Tensor:
        """ Per-channel log-decay ``(..., HV, K)`` from the gate projection ``f (..., HV*K)``. """
        f = f.unflatten(-1, (self.num_v_heads, self.head_dim))
        dt_bias = self.dt_bias.view(self.num_v_heads, self.head_dim)
        if self.gate_fn == 'sigmoid':
            # bounded ("safe") gate, log-decay in (lower_bound, 0)
            return self.gate_lower_bound * torch.sigmoid(self.A_log.exp().unsqueeze(-1) * (f + dt_bias))  # expect-bug: promotion
        return -self.A_log.float().exp().unsqueeze(-1) * F.softplus(f.float() + dt_bias.float())

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.num_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.num_v_heads, self.head_dim)
        g = self.log_decay(self.f_proj(x))
        beta = self.b_proj(x).float().sigmoid()
        return q, k, v, g, beta

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        gate = self.g_proj(x).view(*x.shape[:2], self.num_v_heads, self.head_dim)
        o = self.o_norm(o.to(x.dtype)) * gate.sigmoid()
        return self.o_proj(o.flatten(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, g, beta = self.project(x)
        o, _, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm=self.qk_l2norm)
        return self._output(o, x)

    # --- ReplaySSM decode cache -------------------------------------------------------------

    def ring_shapes(self, ring_len: int) -> Dict[str, Tuple[int, ...]]:
        """ Per-slot shapes of the cache tensors. """
        H, HV, D = self.num_heads, self.num_v_heads, self.head_dim
        return dict(ssm_state=(HV, D, D), delta_ring=(HV, ring_len, D), key_ring=(H, ring_len, D), decay_log_ring=(HV, ring_len, D))

    def init_cache(self, num_slots: int, ring_len: int = 8, device=None, dtype=None):
        """ (Re)allocate the module's decode cache; d / k rings in ``dtype`` (default: weights). """
        dtype = dtype or self.v_proj.weight.dtype
        device = device or self.v_proj.weight.device
        shapes = self.ring_shapes(ring_len)
        self.register_buffer('ssm_state', torch.zeros(num_slots, *shapes['ssm_state'], device=device, dtype=torch.float32), persistent=False)
        self.register_buffer('delta_ring', torch.zeros(num_slots, *shapes['delta_ring'], device=device, dtype=dtype), persistent=False)
        self.register_buffer('key_ring', torch.zeros(num_slots, *shapes['key_ring'], device=device, dtype=dtype), persistent=False)
        self.register_buffer('decay_log_ring', torch.zeros(num_slots, *shapes['decay_log_ring'], device=device), persistent=False)  # expect-bug: default-dtype id=layer-cfg-dtype; default-dtype id=script-default
        self.register_buffer('ring_pos', torch.zeros(num_slots, device=device, dtype=torch.int32), persistent=False)
        self.cache_slots, self.ring_len = num_slots, ring_len

    def reset_cache(self, slots: Optional[torch.Tensor] = None):
        if not self.cache_slots:
            return
        for name in RING_BUFFER_NAMES:
            buf = getattr(self, name)
            if slots is None:
                buf.zero_()
            else:
                buf[slots.long()] = 0

    def ring_buffers(self) -> Dict[str, torch.Tensor]:
        if not self.cache_slots:
            raise RuntimeError('init_cache() must be called before decoding with the module cache')
        return {name: getattr(self, name) for name in RING_BUFFER_NAMES}

    def forward_decode(
            self,
            x: torch.Tensor,
            slot_idx: torch.Tensor,
            rings: Optional[Mapping[str, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """ One token per row, ``x (B, C)``, ``slot_idx`` int32 (B,) (negative == padding). """
        rings = self.ring_buffers() if rings is None else rings
        x = x.unsqueeze(1)
        q, k, v, g, beta = self.project(x)
        ring_pos = rings['ring_pos']
        write_pos = ring_pos[slot_idx.clamp(min=0).long()]
        o = fused_recurrent_kda_replayssm_decode(
            q, k, v, g, beta,
            initial_state=rings['ssm_state'],
            d_cache=rings['delta_ring'],
            k_cache=rings['key_ring'],
            g_cache=rings['decay_log_ring'],
            ssm_state_indices=slot_idx,
            write_pos=write_pos,
            use_qk_l2norm_in_kernel=self.qk_l2norm,
        )
        advance_write_pos(ring_pos, slot_idx, write_pos, rings['delta_ring'].shape[2])
        return self._output(o, x).squeeze(1)

    def extra_repr(self) -> str:
        return f'heads={self.num_heads}, v_heads={self.num_v_heads}, head_dim={self.head_dim}, gate={self.gate_fn}'


def build_attention_cache():
    """ A bf16 mixer with its own 3-slot cache, five decode steps (slot 2 folds at step 4). """
    torch.manual_seed(0)
    attn = KimiDeltaAttention(32, num_heads=2, num_v_heads=4, head_dim=8, dtype=torch.bfloat16)
    attn.init_cache(3, ring_len=4)
    idx = torch.tensor([2, 0, -1], dtype=torch.int32)
    with torch.no_grad():
        for _ in range(5):
            attn.forward_decode(torch.randn(3, 32, dtype=torch.bfloat16), idx)
    return attn
