"""Per-sequence state. ``state_mode: slots`` keeps a pool in the instance (CORRID picks the slot);
``implicit`` sends the rings with each request as ``STATE_*`` inputs that come back as ``OUT_STATE_*``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

from . import triton_utils as pb_utils

@dataclass(frozen=True)
class RingGeometry:
    num_heads: int = 2
    num_v_heads: int = 2
    head_dim: int = 4
    ring_len: int = 4

    def ring_dims(self) -> dict[str, list[int]]:
        hv, h, L, d = self.num_v_heads, self.num_heads, self.ring_len, self.head_dim
        return {"delta": [hv, L, d], "key": [h, L, d], "decay_log": [hv, L, d]}

    def state_dims(self) -> list[int]:
        return [self.num_v_heads, self.head_dim, self.head_dim]

class SequenceSlots:
    """CORRID -> slot table of the ``direct`` sequence strategy."""

    def __init__(self, max_sequences: int) -> None:
        self.slot_cache: dict[int, int] = {}
        self.free = list(range(max_sequences - 1, -1, -1))
        self.write_pos = torch.zeros(max_sequences, dtype=torch.int32)

    def acquire(self, corrid: int, start: bool) -> int:
        if corrid not in self.slot_cache:
            self.slot_cache[corrid] = self.free.pop()
        if start:
            self.write_pos[self.slot_cache[corrid]] = 0
        return self.slot_cache[corrid]

    def release(self, corrid: int) -> None:
        self.free.append(self.slot_cache.pop(corrid))

class SequenceStatePool:
    """Rings and checkpoint state of every slot, one dict per KDA layer."""

    def __init__(self, geometry: RingGeometry, num_layers: int, max_sequences: int, dtype: torch.dtype,
                 ring_dtypes: dict[str, torch.dtype] | None = None) -> None:
        self.dtype, self.layers = dtype, []
        for _ in range(num_layers):
            rings = {}
            for kind, dims in geometry.ring_dims().items():
                if ring_dtypes is None:  # configs written before ``ring_layout`` existed
                    rings[kind] = torch.zeros(max_sequences, *dims, dtype=self.dtype)  # expect-bug: pool-dtype id=slot-pool
                else:
                    rings[kind] = torch.zeros(max_sequences, *dims, dtype=ring_dtypes[kind])
            rings["ssm_state"] = torch.zeros(max_sequences, *geometry.state_dims())
            self.layers.append(rings)

    def hand_off(self, slot: int) -> list[dict[str, torch.Tensor]]:
        """Copies of one slot's rings, to move the sequence to another instance."""
        moved = []
        for rings in self.layers:
            copy = {kind: rings[kind][slot].clone() for kind in ("delta", "key", "ssm_state")}
            copy["decay_log"] = torch.empty_like(copy["delta"]).copy_(rings["decay_log"][slot])  # expect-bug: like id=handoff-like
            moved.append(copy)
        return moved

@dataclass
class StateSpec:
    """One ``sequence_batching.state`` entry."""

    kind: str
    layer: int
    dims: list[int]
    data_type: str = "TYPE_BF16"  # expect-bug: container id=spec-default

    @property
    def input_name(self) -> str:
        return f"STATE_{self.kind.upper()}_{self.layer}"

    def to_config(self) -> dict:
        initial = {"name": "zero", "data_type": self.data_type, "dims": self.dims, "zero_data": True}
        return {"input_name": self.input_name, "output_name": f"OUT_{self.input_name}", "data_type": self.data_type,
                "dims": self.dims, "initial_state": initial}

    @classmethod
    def from_config(cls, entry: dict) -> StateSpec:
        kind, layer = entry["input_name"].removeprefix("STATE_").rsplit("_", 1)
        return cls(kind.lower(), int(layer), list(entry["dims"]), entry["data_type"])

def default_state_specs(geometry: RingGeometry, num_layers: int) -> list[StateSpec]:
    specs = []
    for layer in range(num_layers):
        specs += [StateSpec(kind, layer, dims) for kind, dims in geometry.ring_dims().items()]  # expect-bug: container id=spec-default
        specs += [StateSpec("ssm", layer, geometry.state_dims(), "TYPE_FP32"), StateSpec("pos", layer, [1], "TYPE_INT32")]
    return specs

def read_implicit_state(request: pb_utils.InferenceRequest, specs: list[StateSpec]) -> dict[tuple[int, str], torch.Tensor]:
    """The request's ``STATE_*`` inputs by (layer, kind); on START what ``initial_state { zero_data: true }`` gives."""
    start, state = pb_utils.get_input_tensor_by_name(request, "START"), {}
    for spec in specs:
        given = pb_utils.get_input_tensor_by_name(request, spec.input_name)
        if given is None or (start is not None and start.as_numpy().any()):
            state[spec.layer, spec.kind] = torch.zeros(1, *spec.dims, dtype=pb_utils.TYPE_TO_TORCH[spec.data_type])
        else:
            state[spec.layer, spec.kind] = from_dlpack(given.to_dlpack())
    return state

def implicit_state_outputs(state: dict[tuple[int, str], torch.Tensor], specs: list[StateSpec]) -> list[pb_utils.Tensor]:
    return [pb_utils.Tensor.from_dlpack(f"OUT_{s.input_name}", to_dlpack(state[s.layer, s.kind])) for s in specs]

def build_sequence_pool() -> dict:
    """A pool from a pre-layout config, a replay-layout pool and one sequence handed off from it."""
    legacy = SequenceStatePool(RingGeometry(), 2, 2, torch.bfloat16)
    pool = SequenceStatePool(RingGeometry(), 2, 2, torch.bfloat16, pb_utils.replay_ring_dtypes("TYPE_BF16"))
    for rings in pool.layers:
        rings["delta"][1], rings["decay_log"][1] = 0.5, -0.25
    return {"legacy": legacy.layers, "pool": pool.layers, "handoff": pool.hand_off(1)}

def build_slot_table() -> dict:
    """Two sequences on an fp16 replay-layout pool, the second handed over from a bf16 instance."""
    geometry, slots = RingGeometry(), SequenceSlots(2)
    pool = SequenceStatePool(geometry, 2, 2, torch.float16, pb_utils.replay_ring_dtypes("TYPE_FP16"))
    first, second = slots.acquire(7, start=True), slots.acquire(9, start=True)
    pool.layers[0]["decay_log"][first] = -0.5
    for rings in pool.layers:  # a sequence handed over by a bf16 instance; copy_ converts
        for kind, dims in geometry.ring_dims().items():
            rings[kind][second].copy_(torch.full(dims, -0.125, dtype=torch.bfloat16))
    return {"slots": slots, "pool": pool.layers}
