"""Tracks the sequences of the ragged engine and hands each one a ReplaySSM slot."""

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import DSStateManagerConfig
from ..modeling import KimiLinearConfig
from ..utils import cast_to, dtype_name, kda_ring_dtypes, log_dist, to_torch_dtype

RING_NAMES = ("delta_cache", "key_cache", "alpha_cache")
Shape = tuple[int, ...]


@dataclass
class DSSequenceDescriptor:
    uid: int
    slot: int


@dataclass
class SwappedSequence:
    """Host copy of one sequence's decode state, per layer, as read back from a swap file."""

    uid: int
    ssm_state: list[torch.Tensor]
    delta_cache: list[torch.Tensor]
    key_cache: list[torch.Tensor]
    alpha_cache: list[torch.Tensor]


class DSReplayStateManager:
    """Per-layer ReplaySSM rings for ``max_tracked_sequences`` slots.

    Per layer: ``ssm_state [slots, HV, V, K]``, ``delta_cache [slots, HV, L, V]``,
    ``key_cache [slots, H, L, K]`` and ``alpha_cache [slots, HV, L, K]``.
    """

    def __init__(
        self,
        config: DSStateManagerConfig,
        model_config: KimiLinearConfig,
        engine_dtype: torch.dtype,
    ) -> None:
        self._config = config
        self._engine_dtype = engine_dtype
        self._num_layers = model_config.num_hidden_layers
        self._tracked: dict[int, DSSequenceDescriptor] = {}
        self._free_slots = list(range(config.max_tracked_sequences))
        self.slot_table = torch.full((config.max_tracked_sequences,), -1, dtype=torch.int32)
        self.write_pos = torch.zeros(config.max_tracked_sequences, dtype=torch.int32)
        slots, ring_len = config.max_tracked_sequences, config.ring_len
        hv, h, dim = model_config.num_heads, model_config.num_k_heads, model_config.head_dim
        self._allocate_device_rings(
            state_shape=(slots, hv, dim, dim),
            delta_shape=(slots, hv, ring_len, dim),
            key_shape=(slots, h, ring_len, dim),
            alpha_shape=(slots, hv, ring_len, dim),
        )

    def _allocate_device_rings(
        self, state_shape: Shape, delta_shape: Shape, key_shape: Shape, alpha_shape: Shape
    ) -> None:
        ring_dtypes = kda_ring_dtypes(self._engine_dtype)  # expect-bug: imported-policy id=ds-ring
        delta_dtype, key_dtype, alpha_dtype = ring_dtypes
        self.ssm_state: list[torch.Tensor] = []
        self.delta_cache: list[torch.Tensor] = []
        self.key_cache: list[torch.Tensor] = []
        self.alpha_cache: list[torch.Tensor] = []
        for _ in range(self._num_layers):
            self.ssm_state.append(torch.zeros(state_shape, dtype=torch.float32))
            self.delta_cache.append(torch.zeros(delta_shape, dtype=delta_dtype))
            self.key_cache.append(torch.zeros(key_shape, dtype=key_dtype))
            self.alpha_cache.append(torch.zeros(alpha_shape, dtype=alpha_dtype))  # expect-bug: imported-policy id=ds-ring
        log_dist(f"allocated ReplaySSM rings for {self._num_layers} layers", ranks=[0])

    def get_or_create_sequence(self, uid: int) -> DSSequenceDescriptor:
        if uid not in self._tracked:
            if not self._free_slots:
                raise RuntimeError(f"no free ReplaySSM slot for sequence {uid}")
            slot = self._free_slots.pop(0)
            self.slot_table[slot] = uid
            self._tracked[uid] = DSSequenceDescriptor(uid, slot)
        return self._tracked[uid]

    def flush_sequence(self, uid: int) -> None:
        slot = self._tracked.pop(uid).slot
        for rings in (self.ssm_state, self.delta_cache, self.key_cache, self.alpha_cache):
            for ring in rings:
                ring[slot].zero_()
        self.write_pos[slot] = 0
        self.slot_table[slot] = -1
        self._free_slots.append(slot)

    def allocate_host_mirror(self) -> dict[str, list[torch.Tensor]]:
        """Host buffers for every ring, filled when sequences are swapped out under pressure."""
        mirror: dict[str, list[torch.Tensor]] = {}
        for name in RING_NAMES:
            shape = getattr(self, name)[0].shape
            mirror[name] = [
                torch.zeros(shape, dtype=self._engine_dtype, device="cpu")  # expect-bug: pool-dtype
                for _ in range(self._num_layers)
            ]
        return mirror

    def export_sequences(self, uids: list[int], dtype: torch.dtype) -> dict[str, Any]:
        """Rows of ``uids``, for a hand-off to a replica whose engine runs in ``dtype``."""
        index = torch.tensor([self._tracked[uid].slot for uid in uids], dtype=torch.long)
        rows = {
            name: [ring.index_select(0, index) for ring in getattr(self, name)]
            for name in RING_NAMES
        }
        delta = [cast_to(part, dtype) for part in rows["delta_cache"]]
        keys = [cast_to(part, dtype) for part in rows["key_cache"]]
        alpha = [cast_to(part, dtype) for part in rows["alpha_cache"]]  # expect-bug: cast
        write_pos = self.write_pos.index_select(0, index)
        return {
            "delta_cache": delta,
            "key_cache": keys,
            "alpha_cache": alpha,
            "write_pos": write_pos,
        }

    def swap_out(self, uid: int, path: str) -> None:
        slot = self._tracked[uid].slot
        tensors = {}
        for name in ("ssm_state", *RING_NAMES):
            for layer, ring in enumerate(getattr(self, name)):
                tensors[f"{name}.{layer}"] = ring[slot]
        write_state_file(path, tensors)
        self.flush_sequence(uid)

    def swap_in(self, uid: int, path: str) -> DSSequenceDescriptor:
        header, raw = read_state_file(path)
        seq = self.get_or_create_sequence(uid)
        for key, entry in header.items():
            name, _, layer = key.rpartition(".")
            getattr(self, name)[int(layer)][seq.slot].copy_(_tensor_from(raw, entry))
        return seq


def _write_entries(path: str, entries: dict[str, tuple[str, list[int], bytes]]) -> None:
    """Swap-file format: 8-byte little-endian header size, JSON header, raw tensor bytes."""
    header, offset = {}, 0
    for name, (dtype, shape, payload) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "offsets": [offset, offset + len(payload)]}
        offset += len(payload)
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        f.write(b"".join(payload for _, _, payload in entries.values()))


def write_state_file(path: str, tensors: dict[str, torch.Tensor]) -> None:
    entries = {}
    for name, tensor in tensors.items():
        payload = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        entries[name] = (dtype_name(tensor.dtype), list(tensor.shape), payload)
    _write_entries(path, entries)


def read_state_file(path: str) -> tuple[dict[str, dict[str, Any]], bytes]:
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        return header, f.read()


def _tensor_from(raw: bytes, entry: dict[str, Any]) -> torch.Tensor:
    start, end = entry["offsets"]
    dtype = to_torch_dtype(entry["dtype"])
    return torch.frombuffer(bytearray(raw[start:end]), dtype=dtype).reshape(entry["shape"])


def load_swapped_sequence(uid: int, path: str) -> SwappedSequence:
    """Reads a swap file into host tensors (to hand the sequence to another replica)."""
    header, raw = read_state_file(path)
    layers = sorted({int(key.rpartition(".")[2]) for key in header})

    def read(name: str) -> list[torch.Tensor]:
        return [_tensor_from(raw, header[f"{name}.{i}"]) for i in layers]  # expect-bug: load id=ds-swap

    alpha_cache = read("alpha_cache")  # expect-bug: load id=ds-swap
    return SwappedSequence(
        uid, read("ssm_state"), read("delta_cache"), read("key_cache"), alpha_cache
    )


def _manager(dtype: torch.dtype = torch.bfloat16) -> DSReplayStateManager:
    manager = DSReplayStateManager(DSStateManagerConfig(), KimiLinearConfig(), dtype)
    for uid in (11, 12):
        slot = manager.get_or_create_sequence(uid).slot
        for alpha, delta in zip(manager.alpha_cache, manager.delta_cache, strict=True):
            alpha[slot] = -torch.rand(2, 4, 4)
            delta[slot] = torch.randn(2, 4, 4)
        manager.write_pos[slot] = 3
    return manager


def build_host_mirror() -> dict[str, list[torch.Tensor]]:
    return _manager().allocate_host_mirror()


def build_handoff_export() -> dict[str, Any]:
    return _manager().export_sequences([12, 11], torch.bfloat16)


def build_handoff_export_to_fp32_replica() -> dict[str, Any]:
    return _manager().export_sequences([11], torch.float32)


def build_swap_roundtrip(tmp_dir: str) -> DSReplayStateManager:
    _manager().swap_out(12, f"{tmp_dir}/seq12.swap")
    target = DSReplayStateManager(DSStateManagerConfig(), KimiLinearConfig(), torch.bfloat16)
    target.swap_in(12, f"{tmp_dir}/seq12.swap")
    return target


def build_swapped_sequence(tmp_dir: str) -> SwappedSequence:
    _manager().swap_out(11, f"{tmp_dir}/seq11.swap")
    return load_swapped_sequence(11, f"{tmp_dir}/seq11.swap")


def build_swapped_sequence_from_replica(tmp_dir: str) -> SwappedSequence:
    shapes = {"ssm_state": [2, 4, 4], "delta_cache": [2, 4, 4], "key_cache": [1, 4, 4]}
    shapes["alpha_cache"] = [2, 4, 4]
    entries = {}
    for layer in range(2):
        for name, shape in shapes.items():
            values = np.linspace(-1.0, 0.0, int(np.prod(shape)), dtype=np.float16) / (layer + 1)
            entries[f"{name}.{layer}"] = ("fp16", shape, values.tobytes())
    _write_entries(f"{tmp_dir}/seq7.swap", entries)
    return load_swapped_sequence(7, f"{tmp_dir}/seq7.swap")
