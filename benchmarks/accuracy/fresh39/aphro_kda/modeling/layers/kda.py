"""Kimi Delta Attention (KDA) token mixer with ReplaySSM decode."""
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...common.logger import init_logger
from ...ops.replayssm import fused_kda_gate, fused_recurrent_kda_replayssm_decode
from .quantization import QuantizationConfig

logger = init_logger(__name__)


class KimiDeltaAttention(nn.Module):
    is_kv_cache_layer = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_v_heads: int,
        head_dim: int,
        v_head_dim: int,
        layer_idx: int = 0,
        gate_lower_bound: Optional[float] = None,
        quant_config: Optional[QuantizationConfig] = None,
        params_dtype: Optional[torch.dtype] = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_v_heads = num_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_dim, v_head_dim
        self.gate_lower_bound = gate_lower_bound
        self.prefix = prefix
        kw = {"bias": False, "dtype": params_dtype}
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, **kw)
        self.k_proj = nn.Linear(hidden_size, num_heads * head_dim, **kw)
        self.v_proj = nn.Linear(hidden_size, num_v_heads * v_head_dim, **kw)
        self.f_a_proj = nn.Linear(hidden_size, head_dim, **kw)
        self.f_b_proj = nn.Linear(head_dim, num_v_heads * head_dim, **kw)
        self.b_proj = nn.Linear(hidden_size, num_v_heads, **kw)
        self.o_proj = nn.Linear(num_v_heads * v_head_dim, hidden_size, **kw)
        self.A_log = nn.Parameter(torch.linspace(-1.0, 0.5, num_v_heads, dtype=params_dtype))
        self.dt_bias = nn.Parameter(torch.linspace(-0.5, 0.5, num_v_heads * head_dim, dtype=params_dtype))
        self.kv_cache_method = quant_config.get_quant_method(self, prefix) if quant_config is not None else None
        if self.kv_cache_method is not None:
            self.kv_cache_method.create_weights(self)

    def _project(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        n = x.shape[0]
        q = self.q_proj(x).view(n, 1, self.num_heads, self.head_k_dim)
        k = self.k_proj(x).view(n, 1, self.num_heads, self.head_k_dim)
        v = self.v_proj(x).view(n, 1, self.num_v_heads, self.head_v_dim)
        a = self.f_b_proj(self.f_a_proj(x))
        beta = torch.sigmoid(self.b_proj(x).float()).view(n, 1, self.num_v_heads)
        return q, k, v, a, beta

    def gate(self, a: torch.Tensor) -> torch.Tensor:
        """Per-channel log-decays ``[N, HV, K]`` from the raw gate projection."""
        if self.gate_lower_bound is not None:
            # "safe gate" checkpoints: log-decay bounded to (lower_bound, 0)
            a = a.unflatten(-1, (self.num_v_heads, self.head_k_dim)) + self.dt_bias.view(self.num_v_heads, -1)
            return self.gate_lower_bound * torch.sigmoid(self.A_log.exp().unsqueeze(-1) * a)  # expect-bug: promotion id=safe-gate
        return fused_kda_gate(a, self.A_log, self.head_k_dim, g_bias=self.dt_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        ssm_state_indices: torch.Tensor,
        write_pos: torch.Tensor,
        **ring_kwargs: torch.Tensor,
    ) -> torch.Tensor:
        q, k, v, a, beta = self._project(hidden_states)
        g = self.gate(a).unsqueeze(1)
        o = fused_recurrent_kda_replayssm_decode(
            q, k, v, g, beta,
            ssm_state_indices=ssm_state_indices,
            write_pos=write_pos,
            use_qk_l2norm_in_kernel=True,
            **ring_kwargs,
        )
        return self.o_proj(o.flatten(1).to(hidden_states.dtype))

    @torch.no_grad()
    def prefill_rings(self, hidden_states: torch.Tensor, ring_len: int) -> Dict[str, torch.Tensor]:
        """The cache contents a ``[T, hidden]`` prompt leaves in an empty slot, and its outputs.

        Prompts shorter than the ring keep their rows in the rings (``write_pos = T``); longer
        ones are folded into the checkpoint."""
        q, k, v, a, beta = self._project(hidden_states)
        steps, group = hidden_states.shape[0], self.num_v_heads // self.num_heads
        g = self.gate(a)
        qf = F.normalize(q[:, 0].float(), dim=-1) * self.head_k_dim**-0.5
        kf = F.normalize(k[:, 0].float(), dim=-1)
        s = torch.zeros(self.num_v_heads, self.head_v_dim, self.head_k_dim, dtype=torch.float32)
        deltas, outs = [], []
        for t in range(steps):
            key = kf[t].repeat_interleave(group, dim=0)
            s = s * g[t].float().exp().unsqueeze(1)
            delta = beta[t, 0].unsqueeze(-1) * (v[t, 0].float() - torch.einsum("hvk,hk->hv", s, key))
            s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
            outs.append(torch.einsum("hvk,hk->hv", s, qf[t].repeat_interleave(group, dim=0)))
            deltas.append(delta)
        out = self.o_proj(torch.stack(outs).flatten(1).to(hidden_states.dtype))
        pad = ring_len - steps
        if pad <= 0:
            logger.debug("prompt of %d tokens folded into the checkpoint (layer %d)", steps, self.layer_idx)
            zero = torch.zeros(self.num_v_heads, ring_len, self.head_k_dim, dtype=torch.float32)
            return {
                "ssm_state": s,
                "delta_cache": torch.zeros(self.num_v_heads, ring_len, self.head_v_dim, dtype=hidden_states.dtype),
                "key_cache": torch.zeros(self.num_heads, ring_len, self.head_k_dim, dtype=hidden_states.dtype),
                "alpha_log_cache": zero,
                "write_pos": torch.tensor(0, dtype=torch.int32),
                "out": out,
            }
        return {
            "ssm_state": torch.zeros_like(s),
            "delta_cache": F.pad(torch.stack(deltas, dim=1), (0, 0, 0, pad)).to(hidden_states.dtype),
            "key_cache": F.pad(kf.transpose(0, 1), (0, 0, 0, pad)).to(hidden_states.dtype),
            "alpha_log_cache": F.pad(g.transpose(0, 1), (0, 0, 0, pad)),  # expect-bug: promotion id=safe-gate
            "write_pos": torch.tensor(steps, dtype=torch.int32),
            "out": out,
        }


def _prompt_layer(lower_bound: Optional[float]) -> Tuple[KimiDeltaAttention, torch.Tensor]:
    torch.manual_seed(0)
    layer = KimiDeltaAttention(16, 2, 4, 4, 4, gate_lower_bound=lower_bound, params_dtype=torch.bfloat16)
    return layer, torch.randn(3, 16, dtype=torch.bfloat16)


def build_softplus_gate_prefill() -> Dict[str, torch.Tensor]:
    layer, prompt = _prompt_layer(None)
    return layer.prefill_rings(prompt, ring_len=4)


def build_safe_gate_prefill() -> Dict[str, torch.Tensor]:
    layer, prompt = _prompt_layer(-5.0)
    return layer.prefill_rings(prompt, ring_len=4)
