"""A small inference-only Kimi Delta Attention (KDA) causal LM with ReplaySSM decode caches.

Every decoder layer's :class:`KimiDeltaAttention` decodes through
:func:`~peft_kda.ops.replayssm.fused_recurrent_kda_replayssm_decode` on a replay cache: per slot a
float32 checkpoint ``recurrent_state [HV, V, K]``, the rings ``delta_ring [HV, L, V]`` and
``key_ring [H, L, K]`` in the cache dtype, the float32 ``log_decay_ring [HV, L, K]`` and an
int32 ``write_pos``. Caches are module buffers (:class:`KdaReplayCache`, enabled with
:meth:`KdaForCausalLM.enable_replay_cache`) or plain tensors handed in as ``caches=``
(:class:`ReplayRings`).
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .ops.replayssm import chunk_kda_fwd, fused_recurrent_kda_replayssm_decode, kda_gate
from .utils.constants import KDA_RING_NAMES, MODEL_DTYPE_RING_NAMES
from .utils.other import str_to_torch_dtype


@dataclass
class KdaConfig:
    model_type: str = "kda"
    vocab_size: int = 32
    hidden_size: int = 16
    intermediate_size: int = 32
    num_hidden_layers: int = 2
    num_heads: int = 2
    num_v_heads: int = 4
    head_k_dim: int = 4
    head_v_dim: int = 4
    ring_len: int = 4
    rms_norm_eps: float = 1e-6
    torch_dtype: Optional[str] = None
    cache_implementation: str = "replay"
    num_cache_slots: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, config_dict: Mapping[str, Any]) -> "KdaConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config_dict.items() if k in known})


def replay_ring_shapes(config: KdaConfig) -> Dict[str, Tuple[int, ...]]:
    """Per-slot shapes of a layer's replay-cache buffers."""
    hv, h, k, v, ring = config.num_v_heads, config.num_heads, config.head_k_dim, config.head_v_dim, config.ring_len
    return {"recurrent_state": (hv, v, k), "delta_ring": (hv, ring, v), "key_ring": (h, ring, k), "log_decay_ring": (hv, ring, k)}


@dataclass
class ReplayRings:
    """One layer's replay cache as plain tensors (owned by a pool rather than by the model)."""

    recurrent_state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    log_decay_ring: torch.Tensor
    write_pos: torch.Tensor


class KdaReplayCache(nn.Module):
    """One layer's replay cache as (non-persistent) buffers, so that it moves with the model."""

    _is_replay_cache = True
    _keep_in_fp32_buffers = ("recurrent_state", "log_decay_ring")

    def __init__(
        self,
        config: KdaConfig,
        num_slots: int,
        ring_dtypes: Optional[Mapping[str, torch.dtype]] = None,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        ring_dtypes = dict(ring_dtypes or {})
        shapes = replay_ring_shapes(config)
        self.ring_len = config.ring_len
        self.register_buffer("recurrent_state", torch.zeros(num_slots, *shapes["recurrent_state"], dtype=torch.float32, device=device), persistent=False)
        for name in MODEL_DTYPE_RING_NAMES:
            self.register_buffer(name, torch.zeros(num_slots, *shapes[name], dtype=ring_dtypes.get(name), device=device), persistent=False)
        self.register_buffer("log_decay_ring", torch.zeros(num_slots, *shapes["log_decay_ring"], dtype=ring_dtypes.get("log_decay_ring"), device=device), persistent=False)  # expect-bug: default-dtype id=init-default
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32, device=device), persistent=False)

    @property
    def num_slots(self) -> int:
        return self.write_pos.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The cache dtype: that of the delta ring."""
        return self.delta_ring.dtype

    def reset_slot(self, slot: int) -> None:
        for buf in self._buffers.values():
            buf[slot].zero_()

    def load_slot(self, slot: int, tensors: Mapping[str, torch.Tensor]) -> None:
        for name, tensor in tensors.items():
            self._buffers[name][slot].copy_(tensor)

    def resize(self, num_slots: int) -> "KdaReplayCache":
        """Grows or shrinks the cache to ``num_slots``, keeping the rows of the slots that remain."""
        keep = min(num_slots, self.num_slots)
        for name, buf in list(self._buffers.items()):
            if name in KDA_RING_NAMES:
                new = buf.new_zeros((num_slots, *buf.shape[1:]), dtype=self.dtype)  # expect-bug: pool-dtype
            else:
                new = buf.new_zeros((num_slots, *buf.shape[1:]))
            new[:keep] = buf[:keep]
            self._buffers[name] = new
        return self


class Fp32GateReplayCache(KdaReplayCache):
    """A replay cache whose checkpoint and log-decay ring stay float32 when the model is cast
    (``model.to(torch.bfloat16)``, ``model.half()``); only the delta and key rings follow."""

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        kept = {name: self._buffers.pop(name) for name in self._keep_in_fp32_buffers}
        try:
            super()._apply(fn, recurse)
        finally:
            device = self.write_pos.device
            for name, buf in kept.items():
                self._buffers[name] = buf.to(device=device)
        return self


REPLAY_CACHE_MAPPING = {"replay": KdaReplayCache, "replay_fp32_gate": Fp32GateReplayCache}


class KdaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * x).to(input_dtype)


class KdaMLP(nn.Module):
    def __init__(self, config: KdaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: KdaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_v_heads = config.num_heads, config.num_v_heads
        self.head_k_dim, self.head_v_dim = config.head_k_dim, config.head_v_dim
        self.ring_len = config.ring_len
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_k_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_heads * self.head_k_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_v_heads * self.head_v_dim, bias=False)
        self.f_proj = nn.Linear(hidden, self.num_v_heads * self.head_k_dim, bias=False)
        self.b_proj = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.o_proj = nn.Linear(self.num_v_heads * self.head_v_dim, hidden, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, self.num_v_heads)))
        self.dt_bias = nn.Parameter(torch.linspace(-0.5, 0.5, self.num_v_heads * self.head_k_dim))
        self.replay_cache: Optional[KdaReplayCache] = None

    def project(self, hidden_states: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        n = hidden_states.shape[0]
        q = self.q_proj(hidden_states).view(n, self.num_heads, self.head_k_dim)
        k = self.k_proj(hidden_states).view(n, self.num_heads, self.head_k_dim)
        v = self.v_proj(hidden_states).view(n, self.num_v_heads, self.head_v_dim)
        return q, k, v, self.f_proj(hidden_states), self.b_proj(hidden_states)

    def forward(self, hidden_states: torch.Tensor, cache: Any = None, slot_mapping: Optional[torch.Tensor] = None) -> torch.Tensor:
        cache = cache if cache is not None else self.replay_cache
        if cache is None:
            raise ValueError(f"KDA layer {self.layer_idx} has no replay cache; call `enable_replay_cache` or pass `caches`.")
        q, k, v, f, b = self.project(hidden_states)
        g = kda_gate(f, self.A_log, self.dt_bias, self.num_v_heads)
        o = fused_recurrent_kda_replayssm_decode(
            q, k, v, g, b.float().sigmoid(),
            initial_state=cache.recurrent_state,
            d_cache=cache.delta_ring,
            k_cache=cache.key_ring,
            g_cache=cache.log_decay_ring,
            write_pos=cache.write_pos,
            slot_mapping=slot_mapping,
        )
        return self.o_proj(o.flatten(1).to(hidden_states.dtype))

    @torch.no_grad()
    def prefill_rings(self, hidden_states: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """A prompt of ``T < ring_len`` tokens from an empty state in one pass: the attention
        output and the request's replay rows (ring-shaped, for a prefix cache)."""
        steps = hidden_states.shape[0]
        if steps >= self.ring_len:
            raise ValueError(f"prefix of {steps} tokens does not fit a ring of {self.ring_len}")
        q, k, v, f, b = self.project(hidden_states)
        log_decay = -self.A_log.exp().unsqueeze(-1) * F.softplus(f.unflatten(-1, (self.num_v_heads, self.head_k_dim)) + self.dt_bias.view(self.num_v_heads, -1))  # expect-bug: promotion id=prefix-gate
        deltas, keys, o = chunk_kda_fwd(q, k, v, log_decay, b.float().sigmoid())
        pad = (0, 0, 0, self.ring_len - steps)
        ring_dtype = self.v_proj.weight.dtype
        rings = {
            "recurrent_state": torch.zeros(self.num_v_heads, self.head_v_dim, self.head_k_dim, dtype=torch.float32),
            "delta_ring": F.pad(deltas, pad).to(ring_dtype),
            "key_ring": F.pad(keys, pad).to(ring_dtype),
            "log_decay_ring": F.pad(log_decay.transpose(0, 1), pad),  # expect-bug: promotion id=prefix-gate
            "write_pos": torch.tensor(steps, dtype=torch.int32),
        }
        return self.o_proj(o.flatten(1).to(hidden_states.dtype)), rings


class KdaDecoderLayer(nn.Module):
    def __init__(self, config: KdaConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = KdaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = KimiDeltaAttention(config, layer_idx)
        self.post_attention_layernorm = KdaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = KdaMLP(config)

    def forward(self, hidden_states: torch.Tensor, cache: Any = None, slot_mapping: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cache=cache, slot_mapping=slot_mapping)
        return h + self.mlp(self.post_attention_layernorm(h))

    def prefill(self, hidden_states: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        out, rings = self.self_attn.prefill_rings(self.input_layernorm(hidden_states))
        h = hidden_states + out
        return h + self.mlp(self.post_attention_layernorm(h)), rings


class KdaModel(nn.Module):
    def __init__(self, config: KdaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KdaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = KdaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, caches: Optional[Sequence[Any]] = None, slot_mapping: Optional[torch.Tensor] = None) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            hidden_states = layer(hidden_states, cache=None if caches is None else caches[i], slot_mapping=slot_mapping)
        return self.norm(hidden_states)


@contextlib.contextmanager
def _set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Creates the model's parameters directly in ``dtype`` (no float32 copy first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class KdaForCausalLM(nn.Module):
    def __init__(self, config: KdaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = KdaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.requires_grad_(False)
        if config.num_cache_slots:
            self.enable_replay_cache(config.num_cache_slots)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def enable_replay_cache(
        self,
        num_slots: int,
        ring_dtypes: Optional[Mapping[str, torch.dtype]] = None,
        cache_implementation: Optional[str] = None,
    ) -> List[KdaReplayCache]:
        """Gives every KDA layer a replay cache for ``num_slots`` sequences.

        ``ring_dtypes`` maps ring names to dtypes; by default the delta and key rings take the
        model dtype.
        """
        cache_cls = REPLAY_CACHE_MAPPING[cache_implementation or self.config.cache_implementation]
        ring_dtypes = dict(ring_dtypes) if ring_dtypes else {name: self.dtype for name in MODEL_DTYPE_RING_NAMES}
        for layer in self.model.layers:
            layer.self_attn.replay_cache = cache_cls(self.config, num_slots, ring_dtypes, device=self.device)
        return self.replay_caches()

    def replay_caches(self) -> List[KdaReplayCache]:
        return [layer.self_attn.replay_cache for layer in self.model.layers if layer.self_attn.replay_cache is not None]

    def forward(self, input_ids: torch.Tensor, caches: Optional[Sequence[Any]] = None, slot_mapping: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.lm_head(self.model(input_ids, caches=caches, slot_mapping=slot_mapping))

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int = 2,
        caches: Optional[Sequence[Any]] = None,
        slot_mapping: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Greedy decoding: ``input_ids [B, T]`` is fed one token per step (every token is a
        replay row), then ``max_new_tokens`` are produced. Returns ``[B, T + max_new_tokens]``."""
        logits = None
        for t in range(input_ids.shape[1]):
            logits = self(input_ids[:, t], caches=caches, slot_mapping=slot_mapping)
        out = [input_ids]
        for _ in range(max_new_tokens):
            next_tokens = logits.argmax(-1)
            out.append(next_tokens[:, None])
            logits = self(next_tokens, caches=caches, slot_mapping=slot_mapping)
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def prefill_snapshot(self, input_ids: torch.Tensor) -> List[Dict[str, torch.Tensor]]:
        """The per-layer replay rows a prompt ``input_ids [T]`` leaves (a prefix-cache entry)."""
        hidden_states = self.model.embed_tokens(input_ids)
        snapshot = []
        for layer in self.model.layers:
            hidden_states, rings = layer.prefill(hidden_states)
            snapshot.append(rings)
        return snapshot

    def load_prefix(self, slot: int, snapshot: Sequence[Mapping[str, torch.Tensor]]) -> None:
        for cache, rings in zip(self.replay_caches(), snapshot):
            cache.load_slot(slot, rings)

    @classmethod
    def from_pretrained(
        cls,
        pretrained: Union[str, Mapping[str, torch.Tensor]],
        config: Optional[KdaConfig] = None,
        torch_dtype: Union[str, torch.dtype, None] = None,
        num_cache_slots: Optional[int] = None,
    ) -> "KdaForCausalLM":
        """A model from a state dict (or a file holding one), created directly in ``torch_dtype``."""
        if isinstance(pretrained, (str, os.PathLike)):
            state_dict = torch.load(pretrained, map_location="cpu", weights_only=True)
        else:
            state_dict = dict(pretrained)
        config = copy.deepcopy(config or KdaConfig())
        if num_cache_slots is not None:
            config.num_cache_slots = num_cache_slots
        dtype = str_to_torch_dtype(torch_dtype) or str_to_torch_dtype(config.torch_dtype) or torch.float32
        config.torch_dtype = str(dtype).removeprefix("torch.")
        with _set_default_torch_dtype(dtype):  # expect-bug: default-dtype id=init-default
            model = cls(config)
        model.load_state_dict(state_dict, strict=False)
        return model.eval()


def _prompt() -> torch.Tensor:
    return torch.tensor([[3, 5, 7], [2, 4, 6]])


def build_bf16_decode() -> Dict[str, Any]:
    """A model cast to bf16 before its caches are enabled, decoding two requests on slots 0 and 2
    of three for more steps than a ring holds."""
    torch.manual_seed(0)
    model = KdaForCausalLM(KdaConfig()).to(torch.bfloat16)
    model.enable_replay_cache(3)
    tokens = model.generate(_prompt(), max_new_tokens=3, slot_mapping=torch.tensor([0, 2], dtype=torch.int32))
    return {"caches": model.replay_caches(), "tokens": tokens}


def build_from_pretrained_resize() -> Dict[str, Any]:
    """A bf16 model loaded with two cache slots, decoding, then grown to three slots."""
    torch.manual_seed(0)
    reference = KdaForCausalLM(KdaConfig())
    model = KdaForCausalLM.from_pretrained(reference.state_dict(), config=reference.config, torch_dtype=torch.bfloat16, num_cache_slots=2)
    model.generate(_prompt(), max_new_tokens=2)
    for cache in model.replay_caches():
        cache.resize(3)
    tokens = model.generate(torch.tensor([[9]]), max_new_tokens=2, slot_mapping=torch.tensor([2], dtype=torch.int32))
    return {"caches": model.replay_caches(), "tokens": tokens}


def build_pinned_cache_cast() -> Dict[str, Any]:
    """Caches that keep float32 log-decays, on a model cast to bf16 and then to fp16 mid-stream."""
    torch.manual_seed(0)
    model = KdaForCausalLM(KdaConfig(cache_implementation="replay_fp32_gate"))
    model.enable_replay_cache(2, ring_dtypes={"delta_ring": torch.bfloat16, "key_ring": torch.bfloat16, "log_decay_ring": torch.float32})
    model.generate(_prompt(), max_new_tokens=1)
    model.to(torch.bfloat16)
    model.generate(torch.tensor([[1], [2]]), max_new_tokens=2)
    model.half()
    tokens = model.generate(torch.tensor([[3], [4]]), max_new_tokens=2)
    return {"caches": model.replay_caches(), "tokens": tokens}


def build_prefix_snapshot() -> Dict[str, Any]:
    """A bf16 model's prefix-cache entry for a three-token prompt, loaded into slot 1 and decoded on."""
    torch.manual_seed(0)
    model = KdaForCausalLM(KdaConfig()).to(torch.bfloat16)
    snapshot = model.prefill_snapshot(torch.tensor([3, 5, 7]))
    model.enable_replay_cache(2)
    model.load_prefix(1, snapshot)
    tokens = model.generate(torch.tensor([[7]]), max_new_tokens=3, slot_mapping=torch.tensor([1], dtype=torch.int32))
    return {"prefix": snapshot, "caches": model.replay_caches(), "tokens": tokens}
