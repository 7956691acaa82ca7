import logging
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import kda_ops
from .replay_cache import KDADecodeConfig, ReplayCache

logger = logging.getLogger(__name__)


class ReplayBuffers(NamedTuple):
    """Decode state handed to the op for one step."""

    initial_state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention (KDA) layer with ReplaySSM decoding.

    Args:
        embed_dim (int): embedding dimension for the model
        num_heads, num_k_heads (int): value heads (HV) and query/key heads (H)
        head_dim (int): dimension of each head (K = V)
        q_proj, k_proj, v_proj, output_proj (nn.Module): projection layers
        f_proj, b_proj (nn.Module): projections of the decay logits and of beta
        decode_cfg (Optional[KDADecodeConfig]): decode-time settings.
    """

    def __init__(
        self,
        *,
        embed_dim: int,
        num_heads: int,
        num_k_heads: int,
        head_dim: int,
        q_proj: nn.Module,
        k_proj: nn.Module,
        v_proj: nn.Module,
        f_proj: nn.Module,
        b_proj: nn.Module,
        output_proj: nn.Module,
        decode_cfg: KDADecodeConfig | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_k_heads = num_k_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.decode_cfg = decode_cfg or KDADecodeConfig()
        self.q_proj = q_proj
        self.k_proj = k_proj
        self.v_proj = v_proj
        self.f_proj = f_proj
        self.b_proj = b_proj
        self.output_proj = output_proj
        a_init = torch.arange(1, num_heads + 1, dtype=torch.float32)
        self.A_log = nn.Parameter(torch.log(a_init))
        self.dt_bias = nn.Parameter(torch.zeros(num_heads * head_dim))
        bound = None
        if self.decode_cfg.lower_bound is not None:
            bound = torch.tensor(self.decode_cfg.lower_bound, dtype=torch.float32)
        self.register_buffer("lower_bound", bound, persistent=False)
        self.kv_cache: ReplayCache | None = None

    def setup_cache(
        self, batch_size: int, dtype: torch.dtype, gate_dtype: torch.dtype | None = None
    ) -> None:
        """Setup the ReplaySSM cache for decoding; ``dtype`` is the dtype of the delta and key
        rings, ``gate_dtype`` (the decode config's by default) that of the log-decay ring."""
        if self.kv_cache is not None:
            logger.warning("Key value caches are already setup. Skipping.")
            return
        self.kv_cache = ReplayCache.from_config(
            self.decode_cfg,
            batch_size,
            self.num_heads,
            self.num_k_heads,
            self.head_dim,
            dtype,
            gate_dtype=gate_dtype,
        )

    def _buffers_for_step(self, x: torch.Tensor) -> ReplayBuffers:
        if self.kv_cache is not None:
            cache = self.kv_cache
            return ReplayBuffers(
                cache.state, cache.d_cache, cache.k_cache, cache.g_cache, cache.write_pos
            )
        # No cache: a single step from an empty state (scoring one token).
        bsz, hv, h, dim = x.shape[0], self.num_heads, self.num_k_heads, self.head_dim
        ring_len = self.decode_cfg.ring_len
        return ReplayBuffers(
            initial_state=x.new_zeros(bsz, hv, dim, dim, dtype=torch.float32),
            d_cache=x.new_zeros(bsz, hv, ring_len, dim),
            k_cache=x.new_zeros(bsz, h, ring_len, dim),
            g_cache=torch.zeros(bsz, hv, ring_len, dim, dtype=x.dtype),  # expect-bug: decode-arg
            write_pos=torch.zeros(bsz, dtype=torch.int32),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): input tensor with shape [b x 1 x d] (one decode step)

        Returns:
            torch.Tensor: output tensor with shape [b x 1 x d]
        """
        bsz = x.shape[0]
        mixed_qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        out = x.new_zeros(bsz, 1, self.num_heads, self.head_dim)
        bufs = self._buffers_for_step(x)
        kda_ops.kda_replayssm_decode(
            mixed_qkv.squeeze(1),
            self.f_proj(x).squeeze(1),
            self.b_proj(x).squeeze(1),
            self.A_log,
            self.dt_bias,
            self.scale,
            out=out,
            ssm_state_indices=torch.arange(bsz, dtype=torch.int32),
            use_qk_l2norm_in_kernel=self.decode_cfg.use_qk_l2norm,
            lower_bound=self.decode_cfg.lower_bound,
            **bufs._asdict(),
        )
        return self.output_proj(out.view(bsz, 1, -1))

    def gate_ring_from_prefill(self, gate_logits: torch.Tensor) -> torch.Tensor:
        """Log-decay ring [b, hv, L, k] of the last ``ring_len`` steps of a prefill.

        Args:
            gate_logits (torch.Tensor): decay logits [b, s, hv, k] in the activation dtype.
        """
        tail = gate_logits[:, -self.decode_cfg.ring_len :].transpose(1, 2)
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(tail)  # expect-bug: promotion
        a = self.A_log.exp().view(1, -1, 1, 1)
        return -a * F.softplus(tail + self.dt_bias.view(1, self.num_heads, 1, self.head_dim))


def kda_attention(
    embed_dim: int,
    num_heads: int,
    num_k_heads: int,
    head_dim: int,
    decode_cfg: KDADecodeConfig | None = None,
) -> KimiDeltaAttention:
    return KimiDeltaAttention(
        embed_dim=embed_dim,
        num_heads=num_heads,
        num_k_heads=num_k_heads,
        head_dim=head_dim,
        q_proj=nn.Linear(embed_dim, num_k_heads * head_dim, bias=False),
        k_proj=nn.Linear(embed_dim, num_k_heads * head_dim, bias=False),
        v_proj=nn.Linear(embed_dim, num_heads * head_dim, bias=False),
        f_proj=nn.Linear(embed_dim, num_heads * head_dim, bias=False),
        b_proj=nn.Linear(embed_dim, num_heads, bias=False),
        output_proj=nn.Linear(num_heads * head_dim, embed_dim, bias=False),
        decode_cfg=decode_cfg,
    )


def _attn(lower_bound: float | None = None) -> KimiDeltaAttention:
    cfg = KDADecodeConfig(ring_len=4, gate_dtype=torch.float32, lower_bound=lower_bound)
    return kda_attention(8, num_heads=2, num_k_heads=1, head_dim=4, decode_cfg=cfg)


def build_stateless_step() -> dict[str, torch.Tensor]:
    attn = _attn().to(torch.bfloat16)
    attn(torch.randn(2, 1, 8, dtype=torch.bfloat16))
    return dict(kda_ops.LAST_CALL)


def build_cached_step() -> dict[str, object]:
    attn = _attn()
    attn.setup_cache(batch_size=2, dtype=torch.bfloat16)
    attn.to(torch.bfloat16)
    attn(torch.randn(2, 1, 8, dtype=torch.bfloat16))
    return {"attn": attn, "op_inputs": dict(kda_ops.LAST_CALL)}


def _gate_logits() -> torch.Tensor:
    return torch.randn(2, 6, 2, 4).to(torch.bfloat16)


def build_prefill_gate_ring_bounded() -> dict[str, torch.Tensor]:
    return {"g_cache": _attn(lower_bound=-5.0).gate_ring_from_prefill(_gate_logits())}


def build_prefill_gate_ring() -> dict[str, torch.Tensor]:
    return {"g_cache": _attn().gate_ring_from_prefill(_gate_logits())}
