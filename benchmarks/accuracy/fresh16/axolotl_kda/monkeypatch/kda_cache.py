"""Monkeypatch: ReplaySSM decode caches for the KDA layers of Kimi Linear.

``patch_kda_cache()`` replaces ``KimiDeltaAttention.allocate_cache`` and ``forward`` and
``KimiLinearModel.setup_caches``. Each KDA layer then keeps, per slot, a checkpoint state
``[HV, V, K]`` and three rings (d ``[HV, L, V]``, k ``[H, L, K]``, log-decays ``[HV, L, K]``)
and decodes through ``fused_recurrent_kda_replayssm_decode``. The caches can live in a
submodule per layer (``kda.layout: module``), on the attention module itself (``inline``), in
one pool for all layers (``pool``) or in pages of slots (``paged``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ..kernels import advance_write_pos, fused_recurrent_kda_replayssm_decode
from ..modeling import KimiDeltaAttention, KimiLinearModel
from ..utils.models import STR_TO_DTYPE, get_kda_cache_dtype, greedy_steps, load_cfg, load_model

LOG = logging.getLogger("axolotl_kda.monkeypatch.kda_cache")

PAGED_KIMI_YAML = """\
base_model: moonshotai/Kimi-Linear-tiny-random
bf16: true
hidden_size: 16
num_hidden_layers: 2
vocab_size: 32
kda:
  replay: true
  layout: paged
  page_size: 2
  num_slots: 3
  ring_len: 4
  ring_dtype: bfloat16
  log_alpha_dtype: float32
"""


class RingSpec(NamedTuple):
    name: str
    shape: tuple
    dtype: torch.dtype


def get_ring_specs(config, num_slots: int, ring_len: int, dtype: torch.dtype) -> list[RingSpec]:
    """The three rings of one layer: d and k in ``dtype``, log-decays in float32."""
    H, HV, K, V = config.num_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim
    return [
        RingSpec("delta", (num_slots, HV, ring_len, V), dtype),
        RingSpec("key", (num_slots, H, ring_len, K), dtype),
        RingSpec("log_alpha", (num_slots, HV, ring_len, K), torch.float32),
    ]


class LayerRings(NamedTuple):
    """The tensors one KDA layer decodes in, whatever the layout that holds them."""

    ssm_checkpoint: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    log_alpha: torch.Tensor
    write_pos: torch.Tensor
    ring_len: int


class ReplayRingCache(nn.Module):
    """One layer's decode cache as buffers. Module casts convert the state and the d/k rings;
    the log-decay ring keeps float32 and only follows the device."""

    def __init__(self, config, num_slots: int, ring_len: int, dtype: torch.dtype):
        super().__init__()
        self.ring_len = ring_len
        state_shape = (num_slots, config.num_v_heads, config.head_v_dim, config.head_k_dim)
        self.register_buffer("ssm_checkpoint", torch.zeros(state_shape, dtype=dtype), persistent=False)
        for spec in get_ring_specs(config, num_slots, ring_len, dtype):
            self.register_buffer(f"{spec.name}_ring", torch.zeros(spec.shape, dtype=spec.dtype), persistent=False)
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32), persistent=False)

    def _apply(self, fn, recurse=True):
        log_alpha = self.log_alpha_ring
        super()._apply(fn, recurse)
        self.log_alpha_ring = log_alpha.to(device=self.ssm_checkpoint.device)
        return self


def _inline_allocate(attn: KimiDeltaAttention, num_slots: int, ring_len: int, dtype: torch.dtype) -> None:
    H, HV, K, V = attn.num_heads, attn.num_v_heads, attn.head_k_dim, attn.head_v_dim
    attn.register_buffer("ssm_checkpoint", torch.zeros(num_slots, HV, V, K, dtype=dtype), persistent=False)
    attn.register_buffer("delta_ring", torch.zeros(num_slots, HV, ring_len, V, dtype=dtype), persistent=False)
    attn.register_buffer("key_ring", torch.zeros(num_slots, H, ring_len, K, dtype=dtype), persistent=False)
    attn.register_buffer("log_alpha_ring", torch.zeros(num_slots, HV, ring_len, K), persistent=False)  # expect-bug: default-dtype id=low-mem
    attn.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32), persistent=False)
    attn.kda_ring_len = ring_len


def _alloc_rings(shapes: dict, dtype: torch.dtype, **kwargs) -> dict:
    """Zeroed tensors for ``shapes`` (name -> shape)."""
    return dict(zip(shapes, (torch.zeros(shape, dtype=dtype, **kwargs) for shape in shapes.values())))  # expect-bug: pool-dtype id=scratch


class KDACachePool:
    """The decode caches of every KDA layer in one allocation per tensor kind: layer ``i``
    decodes in row ``i`` of each. ``scratch`` holds copies of a slot's rings for draft tokens."""

    def __init__(self, config, num_layers: int, num_slots: int, ring_len: int, dtype: torch.dtype):
        self.ring_len = ring_len
        self.num_slots = num_slots
        self.shapes = {spec.name: spec.shape for spec in get_ring_specs(config, num_slots, ring_len, dtype)}
        state_shape = (num_layers, num_slots, config.num_v_heads, config.head_v_dim, config.head_k_dim)
        self.ssm_checkpoint = torch.zeros(state_shape, dtype=dtype)
        self.rings = {name: torch.zeros((num_layers, *shape), dtype=dtype) for name, shape in self.shapes.items()}  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(num_layers, num_slots, dtype=torch.int32)
        self.scratch: dict[str, torch.Tensor] = {}

    def layer(self, idx: int) -> LayerRings:
        return LayerRings(
            self.ssm_checkpoint[idx],
            self.rings["delta"][idx],
            self.rings["key"][idx],
            self.rings["log_alpha"][idx],
            self.write_pos[idx],
            self.ring_len,
        )

    def reserve_scratch(self, num_tokens: int) -> None:
        shapes = {name: (num_tokens, *shape[1:]) for name, shape in self.shapes.items()}
        self.scratch = _alloc_rings(shapes, self.ssm_checkpoint.dtype)  # expect-bug: pool-dtype id=scratch

    @torch.no_grad()
    def stage_draft(self, layer_idx: int, slot: int) -> None:
        """Copies one slot's rings of one layer into every scratch row."""
        for name, rows in self.scratch.items():
            rows.copy_(self.rings[name][layer_idx, slot].expand_as(rows))


@dataclass
class KDACacheArgs:
    """Settings of a paged KDA cache (from the ``kda:`` section of the config)."""

    ring_len: int = 4
    num_slots: int = 3
    page_size: int = 2
    ring_dtype: torch.dtype = torch.bfloat16
    log_alpha_dtype: torch.dtype = torch.bfloat16  # expect-bug: container

    @classmethod
    def from_cfg(cls, cfg, **kwargs) -> "KDACacheArgs":
        kda = cfg.kda
        values = {name: kda[name] for name in ("ring_len", "num_slots", "page_size") if kda[name] is not None}
        values["ring_dtype"] = STR_TO_DTYPE[kda.ring_dtype] if kda.ring_dtype else cfg.torch_dtype
        if kda.log_alpha_dtype:
            values["log_alpha_dtype"] = STR_TO_DTYPE[kda.log_alpha_dtype]
        values.update(kwargs)
        return cls(**values)


def get_prefix_cache_args(cfg, num_prompts: int, **kwargs) -> KDACacheArgs:
    """Settings of the cache that holds shared system prompts (one slot per prompt)."""
    return KDACacheArgs.from_cfg(
        cfg,
        num_slots=num_prompts,
        page_size=1,
        ring_dtype=get_kda_cache_dtype(cfg),
        log_alpha_dtype=get_kda_cache_dtype(cfg),  # expect-bug: imported-policy
        **kwargs,
    )


class PagedRingCache:
    """A decode cache in pages of ``page_size`` slots; ``slot_table`` holds each slot's session id
    (-1 when free)."""

    def __init__(self, config, args: KDACacheArgs):
        self.args = args
        num_slots = -(-args.num_slots // args.page_size) * args.page_size
        H, HV, K, V = config.num_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim
        self.ssm_checkpoint = torch.zeros(num_slots, HV, V, K, dtype=args.ring_dtype)
        self.delta = torch.zeros(num_slots, HV, args.ring_len, V, dtype=args.ring_dtype)
        self.key = torch.zeros(num_slots, H, args.ring_len, K, dtype=args.ring_dtype)
        self.log_alpha = torch.zeros(num_slots, HV, args.ring_len, K, dtype=args.log_alpha_dtype)
        self.write_pos = torch.zeros(num_slots, dtype=torch.int32)
        self.slot_table = torch.full((num_slots,), -1, dtype=torch.int32)

    def rings(self) -> LayerRings:
        return LayerRings(self.ssm_checkpoint, self.delta, self.key, self.log_alpha, self.write_pos, self.args.ring_len)

    def grow(self, num_pages: int = 1) -> None:
        """Appends ``num_pages`` pages of free slots."""
        extra = num_pages * self.args.page_size

        def pad(tensor, fill=0):
            return torch.cat([tensor, tensor.new_full((extra, *tensor.shape[1:]), fill)])

        self.ssm_checkpoint = pad(self.ssm_checkpoint)
        self.delta = pad(self.delta)
        self.key = pad(self.key)
        self.log_alpha = torch.cat([self.log_alpha, self.delta.new_zeros((extra, *self.log_alpha.shape[1:]))])
        self.write_pos = pad(self.write_pos)
        self.slot_table = pad(self.slot_table, -1)

    def compact(self) -> torch.Tensor:
        """Moves the slots in use to the front (in slot order) so trailing pages are free; returns the order."""
        in_use = self.slot_table >= 0
        order = torch.cat([in_use.nonzero().flatten(), (~in_use).nonzero().flatten()])
        self.ssm_checkpoint = self.ssm_checkpoint[order]
        self.delta = self.delta[order]
        self.key = self.key[order]
        self.log_alpha = self.log_alpha[order].type_as(self.delta)  # expect-bug: cast
        self.write_pos = self.write_pos[order]
        self.slot_table = self.slot_table[order]
        return order


class KDASessionSnapshot(nn.Module):
    """Copies of every KDA layer's decode cache, held as buffers ``layer{i}_{name}``."""

    @classmethod
    def capture(cls, model) -> "KDASessionSnapshot":
        snapshot = cls()
        for idx, attn in enumerate(model.kda_layers()):
            rings = layer_rings(attn)
            snapshot.register_buffer(f"layer{idx}_ssm_checkpoint", rings.ssm_checkpoint.clone())
            snapshot.register_buffer(f"layer{idx}_delta", rings.delta.clone())
            snapshot.register_buffer(f"layer{idx}_key", rings.key.clone())
            snapshot.register_buffer(f"layer{idx}_log_alpha", torch.empty_like(rings.delta).copy_(rings.log_alpha))  # expect-bug: like
            snapshot.register_buffer(f"layer{idx}_write_pos", rings.write_pos.clone())
        return snapshot

    @torch.no_grad()
    def restore(self, model) -> None:
        for idx, attn in enumerate(model.kda_layers()):
            rings = layer_rings(attn)
            for name in ("ssm_checkpoint", "delta", "key", "log_alpha", "write_pos"):
                getattr(rings, name).copy_(getattr(self, f"layer{idx}_{name}"))


def layer_rings(attn: KimiDeltaAttention) -> LayerRings:
    """The cache tensors ``attn`` decodes in, for the layout it was set up with."""
    layout = getattr(attn, "kda_layout", "module")
    if layout == "inline":
        return LayerRings(attn.ssm_checkpoint, attn.delta_ring, attn.key_ring, attn.log_alpha_ring, attn.write_pos, attn.kda_ring_len)
    if layout == "pool":
        return attn.kda_pool.layer(attn.layer_idx)
    if layout == "paged":
        return attn.paged_cache.rings()
    cache = attn.replay_cache
    return LayerRings(cache.ssm_checkpoint, cache.delta_ring, cache.key_ring, cache.log_alpha_ring, cache.write_pos, cache.ring_len)


def kda_decode(attn: KimiDeltaAttention, rings: LayerRings, hidden_states, slot_ids, force_flush=None, **kwargs):
    """One ReplaySSM decode step of ``attn`` in ``rings``; returns the attention output ``[B, hidden]``."""
    batch = hidden_states.shape[0]
    mixed_qkv, a, b = attn.project(hidden_states)
    out = hidden_states.new_empty(batch, 1, attn.num_v_heads, attn.head_v_dim)
    index = slot_ids.clamp(min=0).long()
    write_pos = rings.write_pos[index]
    fused_recurrent_kda_replayssm_decode(
        mixed_qkv,
        a,
        b,
        attn.A_log,
        attn.dt_bias,
        attn.head_k_dim**-0.5,
        initial_state=rings.ssm_checkpoint,
        d_cache=rings.delta,
        k_cache=rings.key,
        g_cache=rings.log_alpha,
        out=out,
        ssm_state_indices=slot_ids,
        write_pos=write_pos,
        force_flush=force_flush,
        use_qk_l2norm_in_kernel=attn.config.use_qk_l2norm,
        lower_bound=attn.config.gate_lower_bound,
    )
    valid = slot_ids >= 0
    rings.write_pos[index[valid]] = advance_write_pos(write_pos, rings.ring_len, force_flush)[valid]
    return attn.o_proj(out.reshape(batch, -1))


def _replay_allocate_cache(self, num_slots: int, ring_len: int = 4, dtype=None, layout: str = "module", **kwargs):
    dtype = dtype or self.o_proj.weight.dtype
    self.kda_layout = layout
    if layout == "inline":
        _inline_allocate(self, num_slots, ring_len, dtype)
    else:
        self.replay_cache = ReplayRingCache(self.config, num_slots, ring_len, dtype)


def _replay_forward(self, hidden_states, slot_ids, force_flush=None, kda_rings=None, **kwargs):
    rings = kda_rings if kda_rings is not None else layer_rings(self)
    return kda_decode(self, rings, hidden_states, slot_ids, force_flush=force_flush, **kwargs)


def _replay_setup_caches(self, num_slots: int, ring_len: int = 4, dtype=None, layout: str = "module", cfg=None, **kwargs):
    attns = [layer.self_attn for layer in self.layers]
    dtype = dtype or self.embed_tokens.weight.dtype
    if layout == "pool":
        self.kda_pool = KDACachePool(self.config, len(attns), num_slots, ring_len, dtype)
        for attn in attns:
            attn.kda_layout, attn.kda_pool = "pool", self.kda_pool
        if cfg is not None and cfg.kda.speculative_tokens:
            self.kda_pool.reserve_scratch(cfg.kda.speculative_tokens)
    elif layout == "paged":
        args = KDACacheArgs.from_cfg(cfg, num_slots=num_slots, ring_len=ring_len, ring_dtype=dtype)
        for attn in attns:
            attn.kda_layout, attn.paged_cache = "paged", PagedRingCache(self.config, args)
    else:
        for attn in attns:
            attn.allocate_cache(num_slots, ring_len=ring_len, dtype=dtype, layout=layout)
    LOG.debug("KDA caches: %d slots, ring length %d, layout %s", num_slots, ring_len, layout)


_ORIGINALS: dict = {}


def patch_kda_cache() -> None:
    """Makes every KDA layer decode through ReplaySSM caches (calling it again does nothing)."""
    if getattr(KimiDeltaAttention, "_kda_replay_patched", False):
        return
    _ORIGINALS.update(
        allocate_cache=KimiDeltaAttention.allocate_cache,
        forward=KimiDeltaAttention.forward,
        setup_caches=KimiLinearModel.setup_caches,
    )
    KimiDeltaAttention.allocate_cache = _replay_allocate_cache
    KimiDeltaAttention.forward = _replay_forward
    KimiLinearModel.setup_caches = _replay_setup_caches
    KimiDeltaAttention._kda_replay_patched = True
    LOG.info("patched KimiDeltaAttention for ReplaySSM decode")


def unpatch_kda_cache() -> None:
    if not _ORIGINALS:
        return
    KimiDeltaAttention.allocate_cache = _ORIGINALS["allocate_cache"]
    KimiDeltaAttention.forward = _ORIGINALS["forward"]
    KimiLinearModel.setup_caches = _ORIGINALS["setup_caches"]
    KimiDeltaAttention._kda_replay_patched = False
    _ORIGINALS.clear()


def build_paged_cache():
    """Paged caches: two sessions decode, a page is added, live slots are compacted, one more step;
    plus a prefix cache for two shared prompts."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True, "kda": {"layout": "paged", "page_size": 2}})
    model = load_model(cfg)
    caches = [attn.paged_cache for attn in model.kda_layers()]
    live = torch.tensor([1, 3], dtype=torch.int32)
    for cache in caches:
        cache.slot_table[live.long()] = torch.tensor([101, 102], dtype=torch.int32)
    ids = greedy_steps(model, torch.tensor([4, 9]), live, num_steps=2)
    for cache in caches:
        cache.grow(1)
        cache.compact()
    greedy_steps(model, ids, torch.tensor([0, 1], dtype=torch.int32))
    prefix = PagedRingCache(model.config, get_prefix_cache_args(cfg, num_prompts=2))
    return {"caches": caches, "prefix": prefix}


def build_paged_cache_from_yaml():
    """Paged caches configured in YAML (float32 log-decays), grown by one page between two steps."""
    torch.manual_seed(0)
    cfg = load_cfg(PAGED_KIMI_YAML)
    model = load_model(cfg)
    slots = torch.tensor([0, 2], dtype=torch.int32)
    ids = greedy_steps(model, torch.tensor([5, 1]), slots)
    for attn in model.kda_layers():
        attn.paged_cache.grow(1)
    greedy_steps(model, ids, torch.tensor([0, 5], dtype=torch.int32))
    return [attn.paged_cache for attn in model.kda_layers()]
