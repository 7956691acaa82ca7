"""ReplaySSM cache layouts for KDA layers: one checkpoint state plus delta, key and log-decay
rings per layer, and the slot pool a rollout engine hands out to sequences."""

from dataclasses import dataclass, fields
from typing import List, NamedTuple, Optional

import torch

from ..utils.utils import ReplayCacheSpec, get_replay_cache_dtypes
from .kda_ops import advance_write_pos, fused_recurrent_kda_replayssm_decode

RING_NAMES = ("ssm_ckpt", "delta_ring", "key_ring", "logdecay_ring")


def replay_cache_shapes(config, num_slots: int, ring_len: Optional[int] = None) -> dict:
    ring_len = ring_len or config.replay_ring_len
    H, HV = config.num_heads, config.num_v_heads
    K, V = config.head_k_dim, config.head_v_dim
    return {
        "ssm_ckpt": (num_slots, HV, V, K),
        "delta_ring": (num_slots, HV, ring_len, V),
        "key_ring": (num_slots, H, ring_len, K),
        "logdecay_ring": (num_slots, HV, ring_len, K),
    }


@dataclass
class LayerReplayCache:
    """The ReplaySSM tensors of one KDA layer for ``num_slots`` sequences."""

    ssm_ckpt: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    logdecay_ring: torch.Tensor
    write_pos: torch.Tensor

    @property
    def num_slots(self) -> int:
        return self.ssm_ckpt.shape[0]

    @property
    def ring_len(self) -> int:
        return self.logdecay_ring.shape[2]

    def kernel_kwargs(self) -> dict:
        return {
            "initial_state": self.ssm_ckpt,
            "d_cache": self.delta_ring,
            "k_cache": self.key_ring,
            "g_cache": self.logdecay_ring,
        }

    def empty_like(self) -> "LayerReplayCache":
        """A zeroed cache with this cache's shapes and dtypes."""
        return LayerReplayCache(
            ssm_ckpt=torch.zeros_like(self.ssm_ckpt),
            delta_ring=torch.zeros_like(self.delta_ring),
            key_ring=torch.zeros_like(self.key_ring),
            logdecay_ring=torch.zeros_like(self.logdecay_ring),
            write_pos=torch.zeros_like(self.write_pos),
        )

    def reset_slots(self, slots: torch.Tensor) -> None:
        for name in RING_NAMES:
            getattr(self, name)[slots.long()] = 0
        self.write_pos[slots.long()] = 0

    def clone(self) -> "LayerReplayCache":
        return LayerReplayCache(**{f.name: getattr(self, f.name).clone() for f in fields(self)})


def allocate_replay_cache(
    config, num_slots: int, dtype: torch.dtype, ring_len: Optional[int] = None, device="cpu"
) -> LayerReplayCache:
    """State and delta/key rings in ``dtype``, the log-decay ring in float32, int32 cursors."""
    shapes = replay_cache_shapes(config, num_slots, ring_len)
    return LayerReplayCache(
        ssm_ckpt=torch.zeros(shapes["ssm_ckpt"], dtype=dtype, device=device),
        delta_ring=torch.zeros(shapes["delta_ring"], dtype=dtype, device=device),
        key_ring=torch.zeros(shapes["key_ring"], dtype=dtype, device=device),
        logdecay_ring=torch.zeros(shapes["logdecay_ring"], dtype=torch.float32, device=device),
        write_pos=torch.zeros(num_slots, dtype=torch.int32, device=device),
    )


def allocate_for_args(config, num_slots: int, args, ring_len: Optional[int] = None) -> LayerReplayCache:
    """A cache with the dtypes ``get_replay_cache_dtypes`` gives for the run's ``args``."""
    dtypes = get_replay_cache_dtypes(args)
    shapes = replay_cache_shapes(config, num_slots, ring_len)
    tensors = {name: torch.zeros(shape, dtype=dtypes[name]) for name, shape in shapes.items()}
    return LayerReplayCache(**tensors, write_pos=torch.zeros(num_slots, dtype=dtypes["write_pos"]))


class RolloutCacheLayout(NamedTuple):
    """Per-tensor dtypes of a rollout engine's replay caches."""

    state_dtype: torch.dtype = torch.bfloat16
    delta_dtype: torch.dtype = torch.bfloat16
    key_dtype: torch.dtype = torch.bfloat16
    logdecay_dtype: torch.dtype = torch.bfloat16  # expect-bug: container
    cursor_dtype: torch.dtype = torch.int32

    def allocate(self, config, num_slots: int, ring_len: Optional[int] = None) -> LayerReplayCache:
        shapes = replay_cache_shapes(config, num_slots, ring_len)
        return LayerReplayCache(
            ssm_ckpt=torch.zeros(shapes["ssm_ckpt"], dtype=self.state_dtype),
            delta_ring=torch.zeros(shapes["delta_ring"], dtype=self.delta_dtype),
            key_ring=torch.zeros(shapes["key_ring"], dtype=self.key_dtype),
            logdecay_ring=torch.zeros(shapes["logdecay_ring"], dtype=self.logdecay_dtype),
            write_pos=torch.zeros(num_slots, dtype=self.cursor_dtype),
        )


def allocate_from_spec(config, spec: ReplayCacheSpec) -> List[LayerReplayCache]:
    """One cache per layer with the layout the trainer announced in ``spec``."""
    shapes = replay_cache_shapes(config, spec.num_slots, spec.ring_len)
    caches = []
    for _ in range(spec.num_layers):
        ssm_ckpt = torch.zeros(shapes["ssm_ckpt"], dtype=spec.state_dtype)
        delta_ring = torch.zeros(shapes["delta_ring"], dtype=spec.dtype)
        key_ring = torch.zeros(shapes["key_ring"], dtype=spec.dtype)
        logdecay_ring = torch.zeros(shapes["logdecay_ring"], dtype=spec.logdecay_dtype)  # expect-bug: imported-policy id=spec-gate
        write_pos = torch.zeros(spec.num_slots, dtype=spec.cursor_dtype)
        caches.append(LayerReplayCache(ssm_ckpt, delta_ring, key_ring, logdecay_ring, write_pos))
    return caches


class ReplayRingPool:
    """Replay caches of every layer for ``num_slots`` sequences, handed out slot by slot."""

    def __init__(self, config, num_slots: int, dtype: torch.dtype, ring_len: Optional[int] = None):
        self.num_slots = num_slots
        self.dtype = dtype
        shapes = replay_cache_shapes(config, num_slots, ring_len)
        self.layers: List[LayerReplayCache] = []
        for _ in range(config.num_hidden_layers):
            rings = {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}  # expect-bug: pool-dtype
            self.layers.append(LayerReplayCache(**rings, write_pos=torch.zeros(num_slots, dtype=torch.int32)))
        self.slot_table = torch.full((num_slots,), -1, dtype=torch.int32)
        self._free = list(range(num_slots))

    def allocate(self, seq_ids) -> torch.Tensor:
        if len(seq_ids) > len(self._free):
            raise RuntimeError(f"ReplayRingPool: {len(seq_ids)} sequences, {len(self._free)} free slots")
        slots = torch.tensor([self._free.pop(0) for _ in seq_ids], dtype=torch.int32)
        self.slot_table[slots.long()] = torch.tensor(list(seq_ids), dtype=torch.int32)
        for cache in self.layers:
            cache.reset_slots(slots)
        return slots

    def free(self, slots: torch.Tensor) -> None:
        self.slot_table[slots.long()] = -1
        self._free.extend(int(s) for s in slots)


def random_decode_inputs(config, batch: int, dtype: torch.dtype, generator: torch.Generator) -> dict:
    """Projected decode inputs for one step of one layer (for engine warm-up)."""
    H, HV, K, V = config.num_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim
    width = 2 * H * K + HV * V
    return {
        "mixed_qkv": torch.randn(batch, width, generator=generator).to(dtype),
        "a": torch.randn(batch, HV, K, generator=generator).to(dtype),
        "b": torch.randn(batch, HV, generator=generator).to(dtype),
        "A_log": torch.log(torch.linspace(1.0, 4.0, HV)),
        "dt_bias": torch.zeros(HV, K),
    }


def decode_with_cache(config, cache: LayerReplayCache, slots: torch.Tensor, inputs: dict) -> torch.Tensor:
    """Runs one decode step on ``cache`` for the sequences in ``slots`` and advances their cursors."""
    batch = slots.shape[0]
    out = torch.empty(batch, 1, config.num_v_heads, config.head_v_dim, dtype=inputs["mixed_qkv"].dtype)
    write_pos = cache.write_pos[slots.long()]
    fused_recurrent_kda_replayssm_decode(
        **inputs,
        scale=config.head_k_dim**-0.5,
        **cache.kernel_kwargs(),
        out=out,
        ssm_state_indices=slots,
        write_pos=write_pos,
        lower_bound=config.lower_bound,
    )
    cache.write_pos[slots.long()] = advance_write_pos(write_pos, cache.ring_len)
    return out


def build_rollout_pool() -> dict:
    """Per-layer bf16 caches of a rollout engine (float32 log-decays) after three decode steps, an
    empty copy of one, and trainer-side caches for a bf16 run after one step."""
    from ..utils.utils import get_train_ppo_args
    from .actor import KDAConfig

    torch.manual_seed(0)
    config = KDAConfig()
    generator = torch.Generator().manual_seed(0)
    caches = [allocate_replay_cache(config, 3, torch.bfloat16) for _ in range(config.num_hidden_layers)]
    slots = torch.tensor([2, 0], dtype=torch.int32)
    for _ in range(3):
        for cache in caches:
            decode_with_cache(config, cache, slots, random_decode_inputs(config, 2, torch.bfloat16, generator))
    forked = caches[0].empty_like()
    args = get_train_ppo_args(bf16=True)
    trainer_side = [allocate_for_args(config, 2, args) for _ in range(config.num_hidden_layers)]
    for cache in trainer_side:
        decode_with_cache(config, cache, torch.tensor([1, 0], dtype=torch.int32), random_decode_inputs(config, 2, torch.bfloat16, generator))
    return {"layers": caches, "forked": forked, "trainer_side": trainer_side, "slots": slots}


def build_spec_caches() -> dict:
    """Caches built from the trainer's announced spec and from the engine's default layout."""
    from .actor import KDAConfig

    torch.manual_seed(0)
    config = KDAConfig()
    generator = torch.Generator().manual_seed(1)
    spec = ReplayCacheSpec(num_layers=config.num_hidden_layers, num_slots=2, ring_len=config.replay_ring_len)
    announced = allocate_from_spec(config, spec)
    default_layout = RolloutCacheLayout().allocate(config, num_slots=2)
    slots = torch.tensor([1], dtype=torch.int32)
    for cache in [*announced, default_layout]:
        decode_with_cache(config, cache, slots, random_decode_inputs(config, 1, torch.bfloat16, generator))
    return {"announced": announced, "default_layout": default_layout}
