""" ReplaySSM decode cache kept outside the model

``ReplayCache`` holds one ``LayerRings`` per KDA block, for ``num_slots`` concurrent streams, and
is passed to ``model.forward_decode(..., cache=cache)``. Unlike the module cache
(``model.set_replay_cache``) it does not move with ``model.to()`` and can be grown, forked and
serialized on its own.
"""
import dataclasses
import logging
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..utils.amp import resolve_dtype

_logger = logging.getLogger(__name__)

__all__ = ['LayerRings', 'ReplayCache', 'RING_NAMES', 'ACTIVATION_RINGS']

RING_NAMES = ('delta_ring', 'key_ring', 'decay_log_ring')
ACTIVATION_RINGS = ('delta_ring', 'key_ring')  # stored in the model / cache dtype


@dataclasses.dataclass
class LayerRings:
    ssm_state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    decay_log_ring: torch.Tensor
    ring_pos: torch.Tensor

    def as_dict(self) -> Dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def num_slots(self) -> int:
        return self.ring_pos.shape[0]


class ReplayCache:

    def __init__(
            self,
            layouts: Sequence[Mapping[str, Tuple[int, ...]]],
            num_slots: int,
            ring_dtype='bfloat16',
            ring_dtypes: Optional[Mapping[str, torch.dtype]] = None,
            device=None,
    ):
        ring_dtype = resolve_dtype(ring_dtype)
        self.ring_dtypes = dict(ssm_state=torch.float32, delta_ring=ring_dtype, key_ring=ring_dtype, decay_log_ring=torch.float32)
        self.ring_dtypes.update(ring_dtypes or {})
        self.device = torch.device(device) if device is not None else torch.device('cpu')
        self.layers: List[LayerRings] = []
        for layout in layouts:
            tensors = {
                name: torch.zeros((num_slots, *shape), dtype=self.ring_dtypes[name], device=self.device)
                for name, shape in layout.items()
            }
            self.layers.append(LayerRings(ring_pos=torch.zeros(num_slots, dtype=torch.int32, device=self.device), **tensors))

    @classmethod
    def from_model(cls, model, num_slots: int, ring_len: Optional[int] = None, **kwargs) -> 'ReplayCache':
        ring_len = ring_len or model.pretrained_cfg.get('ring_len', 8)
        return cls(model.ring_layouts(ring_len), num_slots, **kwargs)

    @property
    def num_slots(self) -> int:
        return self.layers[0].num_slots if self.layers else 0

    @property
    def ring_len(self) -> int:
        return self.layers[0].delta_ring.shape[2] if self.layers else 0

    def layer(self, idx: int) -> Dict[str, torch.Tensor]:
        return self.layers[idx].as_dict()

    def __len__(self):
        return len(self.layers)

    def reset(self, slots: Optional[Sequence[int]] = None):
        for lr in self.layers:
            for t in lr.as_dict().values():
                if slots is None:
                    t.zero_()
                else:
                    t[torch.as_tensor(slots, dtype=torch.long, device=t.device)] = 0

    def fork(self, src: int, dst: int):
        """ Copy one stream's cache into another slot (beam / parallel sampling). """
        for lr in self.layers:
            for t in lr.as_dict().values():
                t[dst].copy_(t[src])

    def grow(self, num_slots: int):
        """ Reallocate every layer for ``num_slots`` slots, keeping the live ones. """
        old_slots = self.num_slots
        if num_slots <= old_slots:
            return
        for lr in self.layers:
            lr.ssm_state = torch.cat([lr.ssm_state, lr.ssm_state.new_zeros(num_slots - old_slots, *lr.ssm_state.shape[1:])])
            lr.ring_pos = torch.cat([lr.ring_pos, lr.ring_pos.new_zeros(num_slots - old_slots)])
            for name in RING_NAMES:
                old = getattr(lr, name)
                new = torch.zeros((num_slots, *old.shape[1:]), dtype=self.ring_dtypes['delta_ring'], device=old.device)  # expect-bug: pool-dtype
                new[:old_slots] = old
                setattr(lr, name, new)

    def to(self, device=None, dtype=None, non_blocking: bool = False) -> 'ReplayCache':
        """ Move the cache; ``dtype`` is the new model dtype (d / k rings follow it). """
        if dtype is not None:
            self.ring_dtypes.update(delta_ring=dtype, key_ring=dtype)
        for lr in self.layers:
            lr.ssm_state = lr.ssm_state.to(device=device, non_blocking=non_blocking)
            lr.ring_pos = lr.ring_pos.to(device=device, non_blocking=non_blocking)
            lr.delta_ring, lr.key_ring, lr.decay_log_ring = (
                t.to(device=device, dtype=dtype, non_blocking=non_blocking) for t in (lr.delta_ring, lr.key_ring, lr.decay_log_ring))  # expect-bug: cast
        if device is not None:
            self.device = torch.device(device)
        return self

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {f'{i}.{name}': t for i, lr in enumerate(self.layers) for name, t in lr.as_dict().items()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]):
        """ Restore into this cache; tensors are cast to the cache's own ring dtypes. """
        for key, value in state_dict.items():
            idx, name = key.split('.', 1)
            target = getattr(self.layers[int(idx)], name)
            if target.shape != value.shape:
                raise RuntimeError(f'size mismatch for {key}: copying {tuple(value.shape)}, expected {tuple(target.shape)}')
            target.copy_(value.to(device=target.device, dtype=target.dtype))

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor], device=None) -> 'ReplayCache':
        """ A cache with the slots / ring length / layers of a saved ``state_dict()``. """
        cache = cls.__new__(cls)
        cache.device = torch.device(device) if device is not None else torch.device('cpu')
        by_layer: Dict[int, Dict[str, torch.Tensor]] = {}
        for key, value in state_dict.items():
            idx, name = key.split('.', 1)
            by_layer.setdefault(int(idx), {})[name] = value.to(device=cache.device)  # expect-bug: load id=legacy-cache
        cache.layers = [LayerRings(**by_layer[i]) for i in sorted(by_layer)]
        first = cache.layers[0]
        cache.ring_dtypes = dict(ssm_state=torch.float32, delta_ring=first.delta_ring.dtype, key_ring=first.key_ring.dtype, decay_log_ring=torch.float32)
        return cache


def _tiny_model(**kwargs):
    from ._factory import create_model
    torch.manual_seed(0)
    return create_model('kda_vlm_tiny', **kwargs).eval()


def _run(model, cache, steps=3):
    idx = torch.tensor([1, -1, 0], dtype=torch.int32)
    for step in range(steps):
        model.forward_decode(torch.tensor([5 + step, 0, 7 + step]), idx, cache=cache)


def build_replay_cache():
    """ bf16 model, external cache; a prompt in slot 0, steps, fork 0 -> 2, more steps. """
    model = _tiny_model(dtype=torch.bfloat16)
    cache = ReplayCache.from_model(model, 3, ring_len=6, ring_dtype=torch.bfloat16)
    model.prefill(0, torch.tensor([2, 3, 4]), cache=cache)
    _run(model, cache)
    cache.fork(0, 2)
    _run(model, cache, steps=2)
    return cache


def build_cache_roundtrip():
    """ Cache serialized with ``torch.save`` and restored into a fresh cache. """
    import io
    model = _tiny_model(dtype=torch.bfloat16)
    cache = ReplayCache.from_model(model, 2, ring_len=6)
    _run(model, cache, steps=8)
    buf = io.BytesIO()
    torch.save(cache.state_dict(), buf)
    buf.seek(0)
    restored = ReplayCache.from_model(model, 2, ring_len=6)
    restored.load_state_dict(torch.load(buf, weights_only=True))
    return restored
