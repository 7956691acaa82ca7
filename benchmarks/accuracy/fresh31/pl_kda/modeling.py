"""The Kimi Linear network: KDA mixers, decoder blocks and a decoder that owns its ring caches.

``KimiLinear`` holds only weights; the training/eval ``LightningModule`` (``pl_kda.module``) and
the Fabric predictors (``pl_kda.predict``) own the decode state. ``KDADecoder`` is the export
target for serving: the weights plus one ``ReplayDecodeLayer`` of registered ring buffers per
layer.
"""

from typing import Any, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from pl_kda.config import KDAConfig
from pl_kda.ops import advance_write_pos, fused_recurrent_kda_replayssm_decode


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class KDAMixer(nn.Module):
    """The projections and gate parameters of one Kimi Delta Attention layer."""

    def __init__(self, config: KDAConfig, layer_idx: int, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_v_heads = config.num_heads, config.num_v_heads
        self.head_dim, self.v_head_dim = config.head_dim, config.v_head_dim
        self.lower_bound = config.lower_bound
        self.use_qk_l2norm = config.use_qk_l2norm
        self.scale = config.head_dim**-0.5
        key_width = config.num_heads * config.head_dim
        value_width = config.num_v_heads * config.v_head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 2 * key_width + value_width, bias=False, dtype=dtype)
        self.a_proj = nn.Linear(config.hidden_size, config.num_v_heads * config.head_dim, bias=False, dtype=dtype)
        self.b_proj = nn.Linear(config.hidden_size, config.num_v_heads, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(value_width, config.hidden_size, bias=False, dtype=dtype)
        self.A_log = nn.Parameter(torch.linspace(-1.0, 1.0, config.num_v_heads, dtype=dtype))
        self.dt_bias = nn.Parameter(torch.linspace(-0.5, 0.5, config.num_v_heads * config.head_dim, dtype=dtype))

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.qkv_proj(x), self.a_proj(x), self.b_proj(x)

    def split_heads(self, mixed_qkv: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k [..., H, K]`` (float32, normalised as the kernel does) and ``v [..., HV, V]``."""
        key_width = self.num_heads * self.head_dim
        q, k, v = mixed_qkv.split([key_width, key_width, self.num_v_heads * self.v_head_dim], dim=-1)
        q = q.float().unflatten(-1, (self.num_heads, self.head_dim))
        k = k.float().unflatten(-1, (self.num_heads, self.head_dim))
        if self.use_qk_l2norm:
            q, k = l2norm(q), l2norm(k)
        return q, k, v.unflatten(-1, (self.num_v_heads, self.v_head_dim))

    def prompt_log_decay(self, a: torch.Tensor) -> torch.Tensor:
        """Log-decays ``[..., HV, K]`` of a whole prompt's gate projections ``a [..., HV*K]``.

        The bounded form of the kernel's gate, ``lower_bound * sigmoid(exp(A_log) * (a + dt_bias))``,
        computed for all prompt tokens at once.
        """
        bound = torch.tensor(self.lower_bound if self.lower_bound is not None else -8.0, dtype=torch.float32)
        x = a.unflatten(-1, (self.num_v_heads, self.head_dim)) + self.dt_bias.view(self.num_v_heads, self.head_dim)
        rate = self.A_log.exp().unsqueeze(-1)
        return bound * torch.sigmoid(rate * x)  # expect-bug: promotion id=prompt-prime


class KimiMLP(nn.Module):
    def __init__(self, config: KDAConfig, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False, dtype=dtype)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class KDABlock(nn.Module):
    def __init__(self, config: KDAConfig, layer_idx: int, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.mixer = KDAMixer(config, layer_idx, dtype=dtype)
        self.post_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.mlp = KimiMLP(config, dtype=dtype)


class KimiLinear(nn.Module):
    """Embeddings, KDA blocks, final norm and LM head (weights only)."""

    def __init__(self, config: KDAConfig, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(KDABlock(config, i, dtype=dtype) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)

    def decode_step(
        self,
        input_ids: torch.Tensor,
        layer_rings: Sequence[Mapping[str, torch.Tensor]],
        slots: torch.Tensor,
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Logits of one token per row; ``layer_rings[i]`` holds layer ``i``'s kernel ring arguments
        (``initial_state``, ``d_cache``, ``k_cache``, ``g_cache``) and its ``write_pos`` table."""
        x = self.embed(input_ids)
        for block, rings in zip(self.layers, layer_rings):
            mixer = block.mixer
            mixed_qkv, a, b = mixer.project(block.input_norm(x))
            write_pos = rings["write_pos"]
            positions = write_pos[slots.long()]
            kernel_rings = {name: rings[name] for name in ("initial_state", "d_cache", "k_cache", "g_cache")}
            out, _ = fused_recurrent_kda_replayssm_decode(
                mixed_qkv, a, b, mixer.A_log, mixer.dt_bias, mixer.scale,
                ssm_state_indices=slots, write_pos=positions, force_flush=force_flush,
                use_qk_l2norm_in_kernel=mixer.use_qk_l2norm, lower_bound=mixer.lower_bound,
                **kernel_rings,
            )
            advance_write_pos(write_pos, slots, positions, self.config.ring_len, force_flush)
            x = x + mixer.o_proj(out.flatten(1).to(x.dtype))
            x = x + block.mlp(block.post_norm(x))
        return self.lm_head(self.norm(x))


class ReplayDecodeLayer(nn.Module):
    """The ring caches of one layer for ``num_slots`` sequences, as non-persistent buffers."""

    def __init__(self, config: KDAConfig, num_slots: int, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        shapes = config.ring_shapes(num_slots)
        self.ring_len = config.ring_len
        self.register_buffer("ssm_state", torch.zeros(shapes["state"], dtype=torch.float32), persistent=False)
        self.register_buffer("delta_ring", torch.zeros(shapes["delta"], dtype=dtype), persistent=False)
        self.register_buffer("key_ring", torch.zeros(shapes["key"], dtype=dtype), persistent=False)
        self.register_buffer("gate_log_ring", torch.zeros(shapes["gate"], dtype=torch.float32), persistent=False)
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32), persistent=False)

    def reset_slots(self, slots: Sequence[int]) -> None:
        for slot in slots:
            for buffer in self.buffers():
                buffer[slot].zero_()


class PinnedReplayDecodeLayer(ReplayDecodeLayer):
    """A ``ReplayDecodeLayer`` whose checkpoint and log-decay ring stay float32 through casts.

    ``.to(dtype)``, ``.half()`` and the precision plugins' ``convert_module`` move these two
    buffers to the new device but keep their dtype.
    """

    _keep_fp32 = ("ssm_state", "gate_log_ring")

    def _apply(self, fn: Any, recurse: bool = True) -> "PinnedReplayDecodeLayer":
        kept = {name: self._buffers[name] for name in self._keep_fp32}
        super()._apply(fn, recurse)
        for name, buffer in kept.items():
            self._buffers[name] = buffer.to(device=self._buffers[name].device)
        return self


class KDADecoder(nn.Module):
    """Weights plus registered ring caches: the module that serving workers load."""

    def __init__(
        self,
        config: KDAConfig,
        num_slots: int,
        pin_fp32_rings: bool = False,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.num_slots = num_slots
        self.model = KimiLinear(config, dtype=dtype)
        cache_cls = PinnedReplayDecodeLayer if pin_fp32_rings else ReplayDecodeLayer
        self.caches = nn.ModuleList(cache_cls(config, num_slots, dtype=dtype) for _ in range(config.num_layers))

    @classmethod
    def from_model(cls, model: KimiLinear, num_slots: int, pin_fp32_rings: bool = False) -> "KDADecoder":
        weight = model.embed.weight
        decoder = cls(model.config, num_slots, pin_fp32_rings=pin_fp32_rings, dtype=weight.dtype)
        decoder.model.load_state_dict(model.state_dict())
        return decoder

    def forward(self, input_ids: torch.Tensor, slots: torch.Tensor, force_flush: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.model.embed(input_ids)
        for block, cache in zip(self.model.layers, self.caches):
            mixer = block.mixer
            mixed_qkv, a, b = mixer.project(block.input_norm(x))
            positions = cache.write_pos[slots.long()]
            out, _ = fused_recurrent_kda_replayssm_decode(
                mixed_qkv, a, b, mixer.A_log, mixer.dt_bias, mixer.scale,
                cache.ssm_state, cache.delta_ring, cache.key_ring, cache.gate_log_ring,
                slots, positions, force_flush=force_flush,
                use_qk_l2norm_in_kernel=mixer.use_qk_l2norm, lower_bound=mixer.lower_bound,
            )
            advance_write_pos(cache.write_pos, slots, positions, self.config.ring_len, force_flush)
            x = x + mixer.o_proj(out.flatten(1).to(x.dtype))
            x = x + block.mlp(block.post_norm(x))
        return self.model.lm_head(self.model.norm(x))
