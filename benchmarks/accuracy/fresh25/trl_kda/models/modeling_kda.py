# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""A small Kimi Linear causal LM (KDA mixers) with ReplaySSM decode caches.

Training runs the plain KDA recurrence over whole sequences (:meth:`KDAForCausalLM.forward`).
Generation runs one token at a time through :func:`fused_recurrent_kda_replayssm_decode`, with
the decode state of each sequence kept either in a :class:`ReplayCache` submodule per layer
(``setup_replay_cache``) or, when ``config.preallocate_replay_cache`` is set, in buffers the
attention layer registers itself. ``from_pretrained`` resolves ``torch_dtype`` the way
``transformers`` does and keeps ``A_log``/``dt_bias`` in float32.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn

from trl_kda.models.replayssm import (
    advance_write_pos,
    fused_recurrent_kda_replayssm_decode,
    kda_log_decay,
    l2_normalize,
    split_mixed_qkv,
)

TINY_MODEL_ID = "trl-internal-testing/tiny-KimiLinearForCausalLM"

_DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Hub stand-in: model ids and the config overrides their checkpoints were trained with.
PRETRAINED_CONFIGS: dict[str, dict[str, Any]] = {
    TINY_MODEL_ID: {},
    f"{TINY_MODEL_ID}-bounded": {"lower_bound": -5.0},
}


@dataclass
class KDAConfig:
    """Configuration of :class:`KDAForCausalLM` (names follow the Kimi Linear HF config)."""

    vocab_size: int = 32
    hidden_size: int = 16
    intermediate_size: int = 32
    num_hidden_layers: int = 2
    num_heads: int = 2
    num_v_heads: int = 4
    head_dim: int = 8
    v_head_dim: int = 8
    rms_norm_eps: float = 1e-6
    lower_bound: float | None = None
    use_qk_l2norm: bool = True
    replay_ring_len: int = 4
    max_replay_slots: int = 4
    preallocate_replay_cache: bool = False
    torch_dtype: str | None = "bfloat16"
    keep_in_fp32_params: tuple[str, ...] = ("A_log", "dt_bias")
    model_type: str = "kimi_linear"

    @property
    def mixer_width(self) -> int:
        """Width of the fused ``q, k, v`` projection: ``2*H*K + HV*V``."""
        return 2 * self.num_heads * self.head_dim + self.num_v_heads * self.v_head_dim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextlib.contextmanager
def _set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Instantiates modules directly in ``dtype`` (what ``from_pretrained`` does)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def keep_params_in_fp32(model: nn.Module, names: tuple[str, ...] = ("A_log", "dt_bias")) -> None:
    """Moves the decay parameters back to float32 after a model was built in half precision."""
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[-1] in names and param.dtype != torch.float32:
            param.data = param.data.float()


class KDARMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(hidden.dtype)


class _ReplayBuffers(nn.Module):
    """Buffers of one KDA layer's decode state for ``num_slots`` sequences.

    The checkpoint ``state [slots, HV, V, K]`` (float32), the rings ``delta_buf [slots, HV, L, V]``
    and ``key_buf [slots, H, L, K]`` (``dtype``) and ``decay_log [slots, HV, L, K]`` (float32),
    and the int32 cursors ``write_pos``.
    """

    persistent = False

    def __init__(
        self, num_slots: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
        ring_len: int, dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        self.ring_len = ring_len
        keep = self.persistent
        self.register_buffer("state", torch.zeros(num_slots, num_v_heads, head_v_dim, head_k_dim, dtype=torch.float32), keep)
        self.register_buffer("delta_buf", torch.zeros(num_slots, num_v_heads, ring_len, head_v_dim, dtype=dtype), keep)
        self.register_buffer("key_buf", torch.zeros(num_slots, num_k_heads, ring_len, head_k_dim, dtype=dtype), keep)
        self.register_buffer("decay_log", torch.zeros(num_slots, num_v_heads, ring_len, head_k_dim, dtype=torch.float32), keep)
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32), keep)

    def reset(self) -> None:
        for buffer in (self.state, self.delta_buf, self.key_buf, self.decay_log, self.write_pos):
            buffer.zero_()


class ReplayCache(_ReplayBuffers):
    """The decode cache of a generation run (buffers not persistent).

    Module casts (``.to(dtype)``, ``.half()``, ``.bfloat16()``) reach the checkpoint and the d/k
    rings; ``decay_log`` keeps its float32 storage and only follows device moves.
    """

    fp32_buffers: tuple[str, ...] = ("decay_log",)

    def _apply(self, fn: Any, recurse: bool = True) -> ReplayCache:
        kept = {name: self._buffers[name] for name in self.fp32_buffers}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if before is not None and after is not None and after.dtype != torch.float32:
                self._buffers[name] = before.to(device=after.device)
        return self


class StaticReplayCache(_ReplayBuffers):
    """A decode cache whose buffers are persistent: ``state_dict()`` carries the rings, so a
    rollout can be checkpointed with the model and resumed. Its buffers follow module casts.
    """

    persistent = True


class KDAAttention(nn.Module):
    """Kimi Delta Attention mixer: fused projections, per-channel gates, ReplaySSM decode."""

    def __init__(self, config: KDAConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_v_heads = config.num_v_heads
        self.head_dim = config.head_dim
        self.v_head_dim = config.v_head_dim
        self.ring_len = config.replay_ring_len
        self.lower_bound = config.lower_bound
        self.use_qk_l2norm = config.use_qk_l2norm
        self.scale = self.head_dim**-0.5
        gate_width = self.num_v_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, config.mixer_width, bias=False)
        self.a_proj = nn.Linear(config.hidden_size, gate_width, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, self.num_v_heads, bias=False)
        self.o_proj = nn.Linear(self.num_v_heads * self.v_head_dim, config.hidden_size, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 8.0, self.num_v_heads)))
        self.dt_bias = nn.Parameter(torch.full((gate_width,), -1.0))
        self.replay_cache: ReplayCache | StaticReplayCache | None = None
        if config.preallocate_replay_cache:
            self._preallocate_replay_buffers(config.max_replay_slots)

    def geometry(self) -> tuple[int, int, int, int]:
        """``(H, HV, K, V)``."""
        return self.num_heads, self.num_v_heads, self.head_dim, self.v_head_dim

    def _preallocate_replay_buffers(self, num_slots: int) -> None:
        H, HV, K, V = self.geometry()
        L = self.ring_len
        self.register_buffer("replay_state", torch.zeros(num_slots, HV, V, K), persistent=False)
        self.register_buffer("delta_buf", torch.zeros(num_slots, HV, L, V), persistent=False)
        self.register_buffer("key_buf", torch.zeros(num_slots, H, L, K), persistent=False)
        self.register_buffer("decay_log", torch.zeros(num_slots, HV, L, K), persistent=False)  # expect-bug: default-dtype
        self.register_buffer("replay_pos", torch.zeros(num_slots, dtype=torch.int32), persistent=False)

    def project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``mixed_qkv``, the gate input ``a`` and the beta logits ``b`` of ``hidden``."""
        hidden = hidden.to(self.qkv_proj.weight.dtype)
        return self.qkv_proj(hidden), self.a_proj(hidden), self.b_proj(hidden)

    def output(self, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Output projection of the decode kernel's ``out [B, 1, HV, V]``, in ``like``'s dtype."""
        return self.o_proj(out.flatten(1).to(self.o_proj.weight.dtype)).to(like.dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The plain recurrence over ``hidden [B, T, D]`` from a zero state (training path)."""
        batch, steps, _ = hidden.shape
        H, HV, K, V = self.geometry()
        mixed_qkv, a, b = self.project(hidden)
        q, k, v = split_mixed_qkv(mixed_qkv.float(), H, HV, K, V)
        if self.use_qk_l2norm:
            q, k = l2_normalize(q), l2_normalize(k)
        group = HV // H
        q = q.repeat_interleave(group, dim=-2) * self.scale
        k = k.repeat_interleave(group, dim=-2)
        g = kda_log_decay(a, self.A_log, self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(b.float())
        state = torch.zeros(batch, HV, V, K, dtype=torch.float32, device=hidden.device)
        outputs = []
        for t in range(steps):
            state = state * g[:, t].exp().unsqueeze(-2)
            delta = beta[:, t].unsqueeze(-1) * (v[:, t] - torch.einsum("bhvk,bhk->bhv", state, k[:, t]))
            state = state + delta.unsqueeze(-1) * k[:, t].unsqueeze(-2)
            outputs.append(torch.einsum("bhvk,bhk->bhv", state, q[:, t]))
        out = torch.stack(outputs, dim=1).flatten(2)
        return self.o_proj(out.to(self.o_proj.weight.dtype)).to(hidden.dtype)

    def _decode_buffers(self) -> tuple[torch.Tensor, ...]:
        cache = self.replay_cache
        if cache is not None:
            return cache.state, cache.delta_buf, cache.key_buf, cache.decay_log, cache.write_pos
        if "decay_log" in self._buffers:
            return self.replay_state, self.delta_buf, self.key_buf, self.decay_log, self.replay_pos
        raise RuntimeError(f"layer {self.layer_idx} has no replay cache; call setup_replay_cache first")

    @torch.no_grad()
    def decode(self, hidden: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One decode step of ``hidden [B, D]`` for the sequences in ``slots [B]`` (int32)."""
        state, delta_buf, key_buf, decay_log, cursors = self._decode_buffers()
        mixed_qkv, a, b = self.project(hidden)
        out = mixed_qkv.new_empty((hidden.shape[0], 1, self.num_v_heads, self.v_head_dim))
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale, initial_state=state, d_cache=delta_buf,
            k_cache=key_buf, g_cache=decay_log, out=out, ssm_state_indices=slots,
            write_pos=cursors[slots.clamp(min=0).long()], use_qk_l2norm_in_kernel=self.use_qk_l2norm,
            lower_bound=self.lower_bound,
        )
        advance_write_pos(cursors, slots, self.ring_len)
        return self.output(out, hidden)


class KDAMLP(nn.Module):
    def __init__(self, config: KDAConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.to(self.up_proj.weight.dtype)
        return self.down_proj(nn.functional.silu(self.gate_proj(hidden)) * self.up_proj(hidden))


class KDADecoderLayer(nn.Module):
    def __init__(self, config: KDAConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = KDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = KDAAttention(config, layer_idx)
        self.mlp_norm = KDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = KDAMLP(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.attn_norm(hidden))
        return hidden + self.mlp(self.mlp_norm(hidden)).to(hidden.dtype)

    def decode(self, hidden: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn.decode(self.attn_norm(hidden), slots)
        return hidden + self.mlp(self.mlp_norm(hidden)).to(hidden.dtype)


class KDAForCausalLM(nn.Module):
    """Embedding, KDA decoder layers, final norm and LM head."""

    config_class = KDAConfig

    def __init__(self, config: KDAConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KDADecoderLayer(config, idx) for idx in range(config.num_hidden_layers))
        self.norm = KDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return self.lm_head(self.norm(hidden).to(self.lm_head.weight.dtype))

    def setup_replay_cache(
        self, num_slots: int, dtype: torch.dtype | None = None, cache_cls: type[_ReplayBuffers] = ReplayCache
    ) -> None:
        """Gives every KDA layer a decode cache for ``num_slots`` sequences (d/k in ``dtype``)."""
        ring_dtype = dtype or self.dtype
        device = self.embed_tokens.weight.device
        for layer in self.layers:
            H, HV, K, V = layer.attn.geometry()
            cache = cache_cls(num_slots, H, HV, K, V, self.config.replay_ring_len, dtype=ring_dtype)
            layer.attn.replay_cache = cache.to(device)

    def replay_caches(self) -> list[ReplayCache | StaticReplayCache]:
        return [layer.attn.replay_cache for layer in self.layers if layer.attn.replay_cache is not None]

    def reset_replay_cache(self) -> None:
        for cache in self.replay_caches():
            cache.reset()

    @torch.no_grad()
    def decode_step(self, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, vocab]`` of the next token of each sequence in ``slots``."""
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer.decode(hidden, slots)
        return self.lm_head(self.norm(hidden).to(self.lm_head.weight.dtype))

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str, *, torch_dtype: str | torch.dtype | None = "auto",
        seed: int = 0, **config_overrides: Any,
    ) -> KDAForCausalLM:
        """Builds the model of a hub id, seeded, directly in the resolved dtype.

        ``torch_dtype="auto"`` takes the checkpoint's dtype; a string or a dtype forces one.
        """
        if pretrained_model_name_or_path not in PRETRAINED_CONFIGS:
            raise OSError(f"{pretrained_model_name_or_path} is not a known model id")
        config = KDAConfig(**PRETRAINED_CONFIGS[pretrained_model_name_or_path])
        config = replace(config, **config_overrides)

        if torch_dtype == "auto":
            dtype = _DTYPE_BY_NAME[config.torch_dtype or "float32"]
        elif isinstance(torch_dtype, str):
            dtype = _DTYPE_BY_NAME[torch_dtype]
        else:
            dtype = torch_dtype or torch.float32

        torch.manual_seed(seed)
        with _set_default_torch_dtype(dtype):
            model = cls(config)
        keep_params_in_fp32(model, config.keep_in_fp32_params)
        model.config = replace(config, torch_dtype=str(dtype).removeprefix("torch."))
        return model.eval()


def build_policy_keep_fp32_cache() -> dict[str, Any]:
    """A bf16 policy decoding with ReplayCache rings, and a resumed fp32 copy with static rings."""
    policy = KDAForCausalLM.from_pretrained(TINY_MODEL_ID, torch_dtype="bfloat16")
    policy.setup_replay_cache(num_slots=2)
    policy.to(torch.bfloat16)
    tokens = torch.tensor([[3, 5, 7, 1, 2, 8], [4, 4, 9, 0, 6, 1]])
    slots = torch.tensor([0, 1], dtype=torch.int32)
    for t in range(tokens.shape[1]):
        logits = policy.decode_step(tokens[:, t], slots)

    buffer = io.BytesIO()
    torch.save(policy.state_dict(), buffer)
    buffer.seek(0)
    resumed = KDAForCausalLM(replace(policy.config, preallocate_replay_cache=True, max_replay_slots=2))
    resumed.setup_replay_cache(num_slots=2, dtype=torch.bfloat16, cache_cls=StaticReplayCache)
    resumed.load_state_dict(torch.load(buffer, weights_only=True), strict=False)
    resumed.decode_step(tokens[:, 0], slots)
    return {"policy": policy, "resumed": resumed, "logits": logits}


def build_pretrained_bf16() -> KDAForCausalLM:
    """A bf16 checkpoint loaded with decode buffers preallocated in its attention layers."""
    model = KDAForCausalLM.from_pretrained(
        TINY_MODEL_ID, torch_dtype="bfloat16", preallocate_replay_cache=True, max_replay_slots=2
    )
    slots = torch.tensor([1, 0], dtype=torch.int32)
    for token in ([5, 2], [7, 7], [1, 3]):
        model.decode_step(torch.tensor(token), slots)
    return model
