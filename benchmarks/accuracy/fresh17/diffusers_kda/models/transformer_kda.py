"""A small KDA decoder (``KDATransformerModel``) whose attention layers decode with ReplaySSM caches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..configuration_utils import ConfigMixin, register_to_config
from ..utils import BaseOutput, logging
from ..utils.torch_utils import TORCH_DTYPE_BY_NAME, maybe_allow_in_graph, randn_tensor
from .attention_processor import KDAAttention, KDAReplayCacheProcessor
from .modeling_utils import ModelMixin

logger = logging.get_logger(__name__)


@dataclass
class Transformer2DModelOutput(BaseOutput):
    """
    Args:
        sample (`torch.Tensor` of shape `(batch_size, hidden_size)`): hidden states after the last layer.
    """

    sample: torch.Tensor


class ReplayCaches(NamedTuple):
    """One layer's replay caches held outside the model (see ``KDATransformerModel.allocate_external_caches``)."""

    checkpoint_state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    log_decay_ring: torch.Tensor
    write_pos: torch.Tensor


class ReplayStateCache(nn.Module):
    r"""The replay caches of one layer, held as non-persistent buffers so they move with the model.

    Buffers: ``checkpoint_state`` `(slots, value_heads, head_dim, head_dim)`, ``delta_ring``
    `(slots, value_heads, ring_len, head_dim)`, ``key_ring`` `(slots, heads, ring_len, head_dim)`,
    ``log_decay_ring`` `(slots, value_heads, ring_len, head_dim)` and the per-slot cursors ``write_pos``.
    """

    def __init__(self, num_slots: int, num_heads: int, num_value_heads: int, head_dim: int, ring_len: int) -> None:
        super().__init__()
        self.num_heads, self.num_value_heads, self.head_dim = num_heads, num_value_heads, head_dim
        self.register_buffer("checkpoint_state", torch.zeros(num_slots, num_value_heads, head_dim, head_dim), persistent=False)
        self.register_buffer("delta_ring", torch.zeros(num_slots, num_value_heads, ring_len, head_dim), persistent=False)
        self.register_buffer("key_ring", torch.zeros(num_slots, num_heads, ring_len, head_dim), persistent=False)
        self.register_buffer("log_decay_ring", torch.zeros(num_slots, num_value_heads, ring_len, head_dim), persistent=False)  # expect-bug: default-dtype id=lowmem-init
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32), persistent=False)

    @property
    def num_slots(self) -> int:
        return self.write_pos.shape[0]

    @property
    def ring_len(self) -> int:
        return self.delta_ring.shape[2]

    def reallocate(
        self,
        num_slots: int,
        ring_len: Optional[int] = None,
        ring_dtype: Optional[torch.dtype] = None,
        log_decay_dtype: torch.dtype = torch.float32,
    ) -> None:
        """Replaces every cache by a zeroed one for ``num_slots`` slots (contents are dropped)."""
        ring_len = ring_len or self.ring_len
        ring_dtype = ring_dtype or self.delta_ring.dtype
        device = self.delta_ring.device
        heads, value_heads, dim = self.num_heads, self.num_value_heads, self.head_dim
        self.checkpoint_state = torch.zeros(num_slots, value_heads, dim, dim, dtype=ring_dtype, device=device)
        self.delta_ring = torch.zeros(num_slots, value_heads, ring_len, dim, dtype=ring_dtype, device=device)
        self.key_ring = torch.zeros(num_slots, heads, ring_len, dim, dtype=ring_dtype, device=device)
        self.log_decay_ring = torch.zeros(num_slots, value_heads, ring_len, dim, dtype=log_decay_dtype, device=device)
        self.write_pos = torch.zeros(num_slots, dtype=torch.int32, device=device)

    def grow(self, extra_slots: int) -> None:
        """Appends ``extra_slots`` empty slots."""
        self.checkpoint_state = torch.cat([self.checkpoint_state, self.checkpoint_state.new_zeros((extra_slots, *self.checkpoint_state.shape[1:]))])
        self.delta_ring = torch.cat([self.delta_ring, self.delta_ring.new_zeros((extra_slots, *self.delta_ring.shape[1:]))])
        self.key_ring = torch.cat([self.key_ring, self.key_ring.new_zeros((extra_slots, *self.key_ring.shape[1:]))])
        empty_rows = self.delta_ring.new_zeros((extra_slots, *self.log_decay_ring.shape[1:]))
        self.log_decay_ring = torch.cat([self.log_decay_ring, empty_rows])
        self.write_pos = torch.cat([self.write_pos, self.write_pos.new_zeros(extra_slots)])


def scratch_caches_like(caches: Union[ReplayStateCache, ReplayCaches]) -> ReplayCaches:
    """Zeroed caches with the shapes and dtypes of ``caches`` (speculative rollouts, warmup)."""
    return ReplayCaches(
        checkpoint_state=torch.zeros_like(caches.checkpoint_state),
        delta_ring=torch.zeros_like(caches.delta_ring),
        key_ring=torch.zeros_like(caches.key_ring),
        log_decay_ring=torch.zeros_like(caches.delta_ring),  # expect-bug: like
        write_pos=torch.zeros_like(caches.write_pos),
    )


def _prefill_attention(attn: KDAAttention, hidden_states: torch.Tensor, cache: ReplayStateCache, keep: torch.Tensor) -> torch.Tensor:
    """The plain KDA recurrence over padded prompts ``(slots, ring_len, dim)``; leaves the prompt
    tokens in the rings of ``cache`` (rows past a prompt's length are zero) and returns the outputs."""
    slots, length, _ = hidden_states.shape
    heads, value_heads, dim = attn.heads, attn.value_heads, attn.dim_head
    group = value_heads // heads
    qkv = attn.to_qkv(hidden_states).float()
    q = qkv[..., : heads * dim].reshape(slots, length, heads, dim)
    k = qkv[..., heads * dim : 2 * heads * dim].reshape(slots, length, heads, dim)
    v = qkv[..., 2 * heads * dim :].reshape(slots, length, value_heads, dim)
    q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    x = attn.to_a(hidden_states).reshape(slots, length, value_heads, dim) + attn.dt_bias.reshape(value_heads, dim)
    decay_rate = attn.A_log.exp().reshape(value_heads, 1)
    if attn.lower_bound is None:
        gates = -decay_rate * F.softplus(x)
    else:
        gates = attn.lower_bound * torch.sigmoid(decay_rate * x)
    beta = torch.sigmoid(attn.to_b(hidden_states).float())
    mask = keep[:, :, None, None]
    k_v = k.repeat_interleave(group, dim=2)
    q_v = q.repeat_interleave(group, dim=2) * attn.scale
    state = cache.checkpoint_state.float()
    deltas, outputs = [], []
    for t in range(length):
        alpha = torch.where(mask[:, t], gates[:, t].float(), 0.0).exp()
        decayed = state * alpha[:, :, None, :]
        delta = beta[:, t, :, None] * (v[:, t] - (decayed @ k_v[:, t, :, :, None]).squeeze(-1))
        delta = delta * mask[:, t]
        state = decayed + delta[..., None] * k_v[:, t, :, None, :]
        outputs.append((state @ q_v[:, t, :, :, None]).squeeze(-1))
        deltas.append(delta)
    cache.delta_ring = torch.stack(deltas, dim=2).to(cache.delta_ring.dtype)
    cache.key_ring = (k * mask).transpose(1, 2).contiguous().to(cache.key_ring.dtype)
    cache.log_decay_ring = (gates * mask).transpose(1, 2).contiguous()  # expect-bug: promotion
    out = torch.stack(outputs, dim=1).reshape(slots, length, value_heads * dim)
    return attn.to_out(out.to(hidden_states.dtype))


@maybe_allow_in_graph
class KDATransformerBlock(nn.Module):
    def __init__(self, dim: int, num_attention_heads: int, num_value_heads: int, attention_head_dim: int, lower_bound: Optional[float] = None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = KDAAttention(dim, heads=num_attention_heads, value_heads=num_value_heads, dim_head=attention_head_dim, lower_bound=lower_bound)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, hidden_states: torch.Tensor, replay_cache: Any, slot_ids: torch.Tensor, force_flush: Optional[torch.Tensor] = None) -> torch.Tensor:
        attn_output = self.attn(self.norm1(hidden_states), replay_cache=replay_cache, slot_ids=slot_ids, force_flush=force_flush)
        hidden_states = hidden_states + attn_output
        return hidden_states + self.ff(self.norm2(hidden_states))


class KDATransformerModel(ModelMixin, ConfigMixin):
    r"""A stack of KDA blocks that decodes one token per slot per call.

    Parameters:
        num_layers (`int`): number of [`KDATransformerBlock`]s.
        hidden_size (`int`): channels of the hidden states.
        num_attention_heads (`int`), num_value_heads (`int`), attention_head_dim (`int`): attention sizes.
        ring_len (`int`): ReplaySSM ring length.
        num_slots (`int`): sequences the built-in replay caches hold.
        lower_bound (`float`, *optional*): use the bounded gate.
        cache_precision (`str`): precision of the stored decays of the built-in replay caches, as
            allocated by [`~KDATransformerModel.enable_replay_cache`].
    """

    _keep_in_fp32_buffers = ["log_decay_ring"]
    _skip_layerwise_casting_patterns = ("norm",)

    @register_to_config
    def __init__(
        self,
        num_layers: int = 2,
        hidden_size: int = 16,
        num_attention_heads: int = 2,
        num_value_heads: int = 4,
        attention_head_dim: int = 8,
        ring_len: int = 4,
        num_slots: int = 2,
        lower_bound: Optional[float] = None,
        cache_precision: str = "fp32",
    ) -> None:
        super().__init__()
        self.proj_in = nn.Linear(hidden_size, hidden_size)
        self.transformer_blocks = nn.ModuleList(
            [KDATransformerBlock(hidden_size, num_attention_heads, num_value_heads, attention_head_dim, lower_bound) for _ in range(num_layers)]
        )
        self.replay_caches = nn.ModuleList(
            [ReplayStateCache(num_slots, num_attention_heads, num_value_heads, attention_head_dim, ring_len) for _ in range(num_layers)]
        )
        self.norm_out = nn.LayerNorm(hidden_size)
        self.proj_out = nn.Linear(hidden_size, hidden_size)

    # -- attention processors --------------------------------------------------------------------

    @property
    def attn_processors(self) -> Dict[str, Any]:
        return {f"{name}.processor": module.get_processor() for name, module in self.named_modules() if hasattr(module, "get_processor")}

    def set_attn_processor(self, processor: Union[Any, Dict[str, Any]]) -> None:
        count = len(self.attn_processors)
        if isinstance(processor, dict) and len(processor) != count:
            raise ValueError(f"A dict of processors was passed, but the number of processors {len(processor)} does not match the number of attention layers: {count}.")
        for name, module in self.named_modules():
            if hasattr(module, "set_processor"):
                module.set_processor(processor[f"{name}.processor"] if isinstance(processor, dict) else processor)

    def set_default_attn_processor(self) -> None:
        self.set_attn_processor(KDAReplayCacheProcessor())

    # -- replay caches ---------------------------------------------------------------------------

    def replay_cache_shapes(self, num_slots: int) -> Dict[str, tuple]:
        return self.transformer_blocks[0].attn.cache_shapes(num_slots, self.config.ring_len)

    @property
    def replay_cache_dtypes(self) -> Dict[str, torch.dtype]:
        """dtype of each external replay cache, keyed like ``replay_cache_shapes``."""
        dtype = self.dtype
        return {
            "checkpoint_state": dtype,
            "delta_ring": dtype,
            "key_ring": dtype,
            "log_decay_ring": dtype,  # expect-bug: container
        }

    def enable_replay_cache(self, num_slots: Optional[int] = None) -> None:
        """Reallocates the built-in replay caches of every layer for ``num_slots`` slots."""
        num_slots = num_slots or self.config.num_slots
        for cache in self.replay_caches:
            cache.reallocate(num_slots, ring_dtype=self.dtype, log_decay_dtype=TORCH_DTYPE_BY_NAME[self.config.cache_precision])  # expect-bug: imported-policy

    def allocate_external_caches(self, num_slots: int, dtype: Optional[torch.dtype] = None) -> List[ReplayCaches]:
        """Per-layer replay caches that live outside the model (pass them as ``replay_caches``)."""
        dtype = dtype or self.dtype
        shapes = self.replay_cache_shapes(num_slots)
        caches = []
        for _ in self.transformer_blocks:
            tensors = (torch.zeros(shape, dtype=dtype, device=self.device) for shape in shapes.values())  # expect-bug: pool-dtype
            caches.append(ReplayCaches(*tensors, write_pos=torch.zeros(num_slots, dtype=torch.int32, device=self.device)))
        return caches

    @torch.no_grad()
    def prefill_replay_cache(self, prompt_hidden_states: torch.Tensor, prompt_lens: torch.Tensor) -> torch.Tensor:
        """Runs one padded prompt per slot (``(num_slots, ring_len, hidden_size)``, at most
        ``ring_len - 1`` real tokens each) and leaves the prompts in the built-in caches."""
        length = prompt_hidden_states.shape[1]
        keep = torch.arange(length, device=prompt_lens.device)[None, :] < prompt_lens[:, None]
        hidden_states = self.proj_in(prompt_hidden_states)
        for block, cache in zip(self.transformer_blocks, self.replay_caches):
            hidden_states = hidden_states + _prefill_attention(block.attn, block.norm1(hidden_states), cache, keep)
            hidden_states = hidden_states + block.ff(block.norm2(hidden_states))
            cache.write_pos.copy_(prompt_lens)
        return self.proj_out(self.norm_out(hidden_states))

    def forward(
        self,
        hidden_states: torch.Tensor,
        slot_ids: torch.Tensor,
        replay_caches: Optional[Sequence[Any]] = None,
        force_flush: Optional[torch.Tensor] = None,
        return_dict: bool = True,
    ) -> Union[Transformer2DModelOutput, tuple]:
        caches = list(replay_caches) if replay_caches is not None else list(self.replay_caches)
        hidden_states = self.proj_in(hidden_states)
        for block, cache in zip(self.transformer_blocks, caches):
            hidden_states = block(hidden_states, replay_cache=cache, slot_ids=slot_ids, force_flush=force_flush)
        output = self.proj_out(self.norm_out(hidden_states))
        if not return_dict:
            return (output,)
        return Transformer2DModelOutput(sample=output)


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------


def _decode(model: KDATransformerModel, hidden_states: torch.Tensor, steps: int, replay_caches=None, flush_at: Optional[int] = None) -> torch.Tensor:
    slot_ids = torch.arange(hidden_states.shape[0], dtype=torch.int32)
    with torch.no_grad():
        for step in range(steps):
            force = torch.full_like(slot_ids, int(step == flush_at)) if flush_at is not None else None
            hidden_states = model(hidden_states, slot_ids, replay_caches=replay_caches, force_flush=force).sample
    return hidden_states


def build_transformer_decode():
    """A bf16 transformer (created in float32, then converted) decoding three steps, then grown."""
    torch.manual_seed(0)
    model = KDATransformerModel(num_slots=3).to(torch.bfloat16)
    model.set_default_attn_processor()
    generator = torch.Generator().manual_seed(0)
    hidden_states = randn_tensor((3, 16), generator=generator, dtype=torch.bfloat16)
    hidden_states = _decode(model, hidden_states, 3, flush_at=1)
    for cache in model.replay_caches:
        cache.grow(1)
    return {"transformer": model, "sample": hidden_states}


def build_pretrained_transformer(tmp_dir):
    """Save a float32 transformer, load it back in bf16 and in an fp16 weights variant, and decode."""
    torch.manual_seed(0)
    KDATransformerModel(num_slots=2).save_pretrained(tmp_dir)
    model = KDATransformerModel.from_pretrained(tmp_dir, torch_dtype=torch.bfloat16)
    model.enable_replay_cache(3)
    sample = _decode(model, torch.randn(3, 16).to(torch.bfloat16), 2)
    model.half().save_pretrained(tmp_dir, variant="fp16")
    reloaded = KDATransformerModel.from_pretrained(tmp_dir, variant="fp16")
    reloaded_sample = _decode(reloaded, torch.randn(2, 16), 2)
    return {"transformer": model, "reloaded": reloaded, "samples": [sample, reloaded_sample]}


def build_loaded_transformers(tmp_dir):
    """Load a compact-cache checkpoint in bf16 three ways: straight into bf16, with re-allocated
    caches, and with prompts prefilled into the rings; each decodes one token."""
    torch.manual_seed(0)
    KDATransformerModel(num_slots=2, cache_precision="bf16").save_pretrained(tmp_dir)
    direct = KDATransformerModel.from_pretrained(tmp_dir, torch_dtype=torch.bfloat16, low_cpu_mem_usage=True)
    reallocated = KDATransformerModel.from_pretrained(tmp_dir, torch_dtype=torch.bfloat16)
    reallocated.enable_replay_cache(3)
    prefilled = KDATransformerModel.from_pretrained(tmp_dir, torch_dtype=torch.bfloat16)
    prompts = torch.randn(2, prefilled.config.ring_len, 16).to(torch.bfloat16)
    prefilled.prefill_replay_cache(prompts, torch.tensor([2, 3], dtype=torch.int32))
    samples = [
        _decode(direct, torch.randn(2, 16).to(torch.bfloat16), 1),
        _decode(reallocated, torch.randn(3, 16).to(torch.bfloat16), 1),
        _decode(prefilled, torch.randn(2, 16).to(torch.bfloat16), 1),
    ]
    return {"direct": direct, "reallocated": reallocated, "prefilled": prefilled, "samples": samples}


def build_layerwise_cast_transformer():
    """bf16 weight storage with float32 compute; external and scratch caches next to the built-in ones."""
    torch.manual_seed(0)
    model = KDATransformerModel(num_slots=2)
    model.enable_layerwise_casting(storage_dtype=torch.bfloat16, compute_dtype=torch.float32)
    sample = _decode(model, torch.randn(2, 16), 2)
    external = model.allocate_external_caches(2, dtype=torch.bfloat16)
    sample = _decode(model, sample, 1, replay_caches=external)
    scratch = scratch_caches_like(model.replay_caches[0])
    return {"transformer": model, "external_caches": external, "scratch": scratch, "sample": sample}


def build_fp32_prefill():
    """A float32 transformer: prefill, decode, and external and scratch caches in float32."""
    torch.manual_seed(0)
    model = KDATransformerModel(num_slots=2, lower_bound=-5.0)
    prompts = torch.randn(2, model.config.ring_len, 16)
    model.prefill_replay_cache(prompts, torch.tensor([3, 1], dtype=torch.int32))
    sample = _decode(model, torch.randn(2, 16), 2)
    external = model.allocate_external_caches(2)
    sample = _decode(model, sample, 2, replay_caches=external, flush_at=0)
    return {"transformer": model, "external_caches": external, "scratch": scratch_caches_like(external[1]), "sample": sample}
