"""Checkpoints of KDA models and of the incremental state of paused generations."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from .config import DataType, KDAConfig, state_dtypes
from .models import KDAModel
from .nn.incremental_state import IncrementalStateBag, ReplayRingState

class FileCheckpointManager:
    """Saves checkpoints under ``checkpoint_dir/step_<nr>/``, floats in ``storage_dtype`` if given."""

    def __init__(self, checkpoint_dir: str | Path, *, storage_dtype: DataType | None = None) -> None:
        self._checkpoint_dir = Path(checkpoint_dir)
        self._storage_dtype = storage_dtype

    def _step_dir(self, step_nr: int) -> Path:
        (step_dir := self._checkpoint_dir / f"step_{step_nr}").mkdir(parents=True, exist_ok=True)
        return step_dir

    def _compact(self, tensor: Tensor) -> Tensor:
        keep = self._storage_dtype is None or not tensor.is_floating_point()
        return tensor if keep else tensor.to(self._storage_dtype)

    def save_model(self, step_nr: int, model: nn.Module) -> None:
        state = {name: self._compact(t.detach()) for name, t in model.state_dict().items()}
        torch.save(state, self._step_dir(step_nr) / "model.pt")

    def load_model(self, step_nr: int, model: KDAModel, *, dtype: DataType | None = None) -> KDAModel:
        state = torch.load(self._step_dir(step_nr) / "model.pt", weights_only=True)
        model.load_state_dict(state)
        if dtype is not None:
            model.to(dtype)  # expect-bug: module-cast
        return model

    def save_generation_state(self, step_nr: int, state_bag: IncrementalStateBag) -> None:
        entries = []
        for state in state_bag.states():
            assert isinstance(state, ReplayRingState)
            entry = {name: getattr(state, name) for name in ReplayRingState.FIELDS}
            entries.append({name: self._compact(t) for name, t in entry.items()})  # expect-bug: load id=fs2-compact
        torch.save({"step_nr": state_bag.step_nr, "layers": entries}, self._step_dir(step_nr) / "state.pt")

    def load_generation_state(self, step_nr: int, layers: list[nn.Module], max_num_steps: int) -> IncrementalStateBag:
        saved = torch.load(self._step_dir(step_nr) / "state.pt", weights_only=True)
        bag = IncrementalStateBag(max_num_steps)
        bag.increment_step_nr(saved["step_nr"])
        for layer, entry in zip(layers, saved["layers"]):
            entry["checkpoint"] = entry["checkpoint"].float()
            bag.set_state(layer, ReplayRingState(**entry))  # expect-bug: load id=fs2-compact
        return bag


def empty_generation_state(config: KDAConfig, batch_size: int) -> ReplayRingState:
    """Targets that a generation state received from another worker is copied into."""
    dtypes = state_dtypes(config)
    hv, hk, d, n = config.num_v_heads, config.num_k_heads, config.head_dim, config.replay_len
    return ReplayRingState(
        checkpoint=torch.empty(batch_size, hv, d, d, dtype=dtypes["checkpoint"]),
        d_ring=torch.empty(batch_size, hv, n, d, dtype=dtypes["delta"]),
        k_ring=torch.empty(batch_size, hk, n, d, dtype=dtypes["key"]),
        log_alpha_ring=torch.empty(batch_size, hv, n, d, dtype=dtypes["log_alpha"]),  # expect-bug: imported-policy id=fs2-state-dtypes
    )


def pack_state(state: ReplayRingState) -> bytes:
    parts = [getattr(state, name).contiguous() for name in ReplayRingState.FIELDS]
    return b"".join(part.view(torch.uint8).numpy().tobytes() for part in parts)


def _take(blob: bytes, offset: int, like: Tensor, dtype: DataType) -> tuple[Tensor, int]:
    size = like.numel() * torch.empty(0, dtype=dtype).element_size()
    tensor = torch.frombuffer(bytearray(blob[offset : offset + size]), dtype=dtype)
    return tensor.view(like.shape), offset + size


def unpack_state(blob: bytes, target: ReplayRingState, *, ring_dtype: DataType) -> ReplayRingState:
    """Reads what ``pack_state`` wrote; ``target`` gives the shapes."""
    offset = 0
    checkpoint, offset = _take(blob, offset, target.checkpoint, torch.float32)
    d_ring, offset = _take(blob, offset, target.d_ring, ring_dtype)
    k_ring, offset = _take(blob, offset, target.k_ring, ring_dtype)
    log_alpha_ring, offset = _take(blob, offset, target.log_alpha_ring, ring_dtype)  # expect-bug: load
    write_pos, offset = _take(blob, offset, target.write_pos, torch.int64)
    return ReplayRingState(checkpoint, d_ring, k_ring, log_alpha_ring, write_pos)


def _paused_bag() -> tuple[IncrementalStateBag, list[nn.Module]]:
    bag, layers = IncrementalStateBag(max_num_steps=8), [nn.Identity(), nn.Identity()]
    for i, layer in enumerate(layers):
        state = ReplayRingState.allocate(KDAConfig(), 2)
        state.log_alpha_ring.uniform_(-1.0, 0.0)
        state.d_ring.fill_(0.25 * (i + 1))
        bag.set_state(layer, state)
    bag.increment_step_nr(3)
    return bag, layers


def _resume(manager: FileCheckpointManager) -> list[object]:
    bag, layers = _paused_bag()
    manager.save_generation_state(3, bag)
    return manager.load_generation_state(3, layers, max_num_steps=8).states()


def build_generation_resume(tmp_dir: str) -> list[object]:
    return _resume(FileCheckpointManager(tmp_dir))


def build_compact_resume(tmp_dir: str) -> list[object]:
    return _resume(FileCheckpointManager(tmp_dir, storage_dtype=torch.bfloat16))
