"""State slots of the KDA layers for ReplaySSM decode (lightllm/common/mem_manager.py)."""

import numpy as np
import torch

from ..utils import init_logger, replay_buffer_dtypes, to_dtype

logger = init_logger(__name__)

BUFFER_NAMES = ("state", "delta", "key", "alpha")


class ReplayStateMemoryManager:
    """One state slot per running request, for every KDA layer: the checkpoint state and the
    rings of the last ``replay_len`` steps, delta_buffer [layer, slot, HV, L, V], key_buffer
    [layer, slot, H, L, K] and alpha_buffer [layer, slot, HV, L, K] (per-step log-decays).
    Slot ``size`` is the hold slot of padded requests."""

    def __init__(
        self, size, dtype, num_k_heads, num_v_heads, head_dim, replay_len, layer_num, mode=None
    ):
        self.size = size
        self.dtype = dtype
        self.num_k_heads = num_k_heads
        self.num_v_heads = num_v_heads
        self.head_dim = head_dim
        self.replay_len = replay_len
        self.layer_num = layer_num
        self.policy = "compact" if "compact_state" in (mode or []) else "default"
        self.mem_state = torch.arange(0, size, dtype=torch.int32)
        self.mark_start = 0
        self.can_use_mem_size = size
        self.HOLD_STATE_INDEX = size
        self._init_buffers(size + 1, dtype, layer_num)

    def _buffer_shapes(self, slots):
        hv, h, d, ring = self.num_v_heads, self.num_k_heads, self.head_dim, self.replay_len
        return {
            "state_buffer": (slots, hv, d, d),
            "delta_buffer": (slots, hv, ring, d),
            "key_buffer": (slots, h, ring, d),
            "alpha_buffer": (slots, hv, ring, d),
        }

    def _init_buffers(self, slots, dtype, layer_num):
        dtypes = replay_buffer_dtypes(self.policy, dtype)
        shapes = self._buffer_shapes(slots)
        for name in BUFFER_NAMES:
            shape = (layer_num, *shapes[f"{name}_buffer"])
            setattr(self, f"{name}_buffer", torch.zeros(shape, dtype=dtypes[name]))  # expect-bug: imported-policy id=ll-compact

    def alloc(self, need_size):
        if need_size > self.can_use_mem_size:
            raise RuntimeError(
                f"no enough state slots, need {need_size} left {self.can_use_mem_size}"
            )
        select_index = self.mem_state[self.mark_start : self.mark_start + need_size]
        self.mark_start += need_size
        self.can_use_mem_size -= need_size
        return select_index

    def free(self, free_index):
        self.can_use_mem_size += len(free_index)
        self.mark_start -= len(free_index)
        self.mem_state[self.mark_start : self.mark_start + len(free_index)] = free_index

    def alloc_state_move_buffer(self, max_req_num):
        """Staging buffers of the PD transfer: the states of up to ``max_req_num`` requests."""
        shapes = self._buffer_shapes(max_req_num)
        for name in ("state", "delta", "key"):
            buffer = getattr(self, f"{name}_buffer")
            move = torch.empty((self.layer_num, *shapes[f"{name}_buffer"]), dtype=buffer.dtype)
            setattr(self, f"{name}_move_buffer", move)
        self.alpha_move_buffer = torch.empty_like(self.delta_move_buffer)  # expect-bug: like

    def send_states(self, state_index):
        """Prefill node: stages the states of ``state_index`` for the transfer."""
        idx = state_index.long()
        moved = {}
        for name in BUFFER_NAMES:
            moved[name] = getattr(self, f"{name}_move_buffer")[:, : len(idx)]
            moved[name].copy_(getattr(self, f"{name}_buffer")[:, idx])
        return moved

    def receive_states(self, moved, state_index):
        """Decode node: writes the states a prefill node sent into the slots ``state_index``."""
        for name, tensor in moved.items():
            buffer = getattr(self, f"{name}_buffer")
            buffer[:, state_index.long()] = tensor.to(buffer.dtype)

    def export_states(self, state_index):
        """Host copies of the states of ``state_index`` for the CPU prompt cache."""
        idx = state_index.long()
        return {
            "state": self.state_buffer[:, idx].cpu(),
            "delta": to_dtype(self.delta_buffer[:, idx], self.dtype).cpu(),
            "key": to_dtype(self.key_buffer[:, idx], self.dtype).cpu(),
            "alpha": to_dtype(self.alpha_buffer[:, idx], self.dtype).cpu(),  # expect-bug: cast
        }

    def import_prompt_cache(self, path):
        """The states of one request from a prompt-cache dump (``np.savez``, one array each)."""
        with np.load(path) as dump:
            state = torch.from_numpy(dump["state"])
            delta = torch.from_numpy(dump["delta"]).to(self.dtype)
            key = torch.from_numpy(dump["key"]).to(self.dtype)
            alpha = torch.from_numpy(dump["alpha"])  # expect-bug: load
        return {"state": state, "delta": delta, "key": key, "alpha": alpha}

    def load_prompt_cache_into(self, path, state_index):
        with np.load(path) as dump:
            for name in BUFFER_NAMES:
                buffer = getattr(self, f"{name}_buffer")
                buffer[:, state_index.long()] = torch.from_numpy(dump[name]).to(buffer.dtype)


class LayerwiseReplayStateMemoryManager(ReplayStateMemoryManager):
    """One tensor per layer and buffer, so that layers can be offloaded one at a time."""

    def _init_buffers(self, slots, dtype, layer_num):
        shapes = self._buffer_shapes(slots)
        state_shape = shapes.pop("state_buffer")
        self.state_buffer = [
            torch.zeros(state_shape, dtype=torch.float32) for _ in range(layer_num)
        ]
        for name, shape in shapes.items():
            buffers = [  # expect-bug: pool-dtype
                torch.zeros(shape, dtype=dtype) for _ in range(layer_num)
            ]
            setattr(self, name, buffers)


def select_mem_manager_class(mode):
    if "layerwise_state" in mode:
        logger.info("Model state cache using mode layerwise_state")
        return LayerwiseReplayStateMemoryManager
    return ReplayStateMemoryManager


def _manager(mode=None):
    manager = select_mem_manager_class(mode or [])(3, torch.bfloat16, 1, 2, 4, 4, 2, mode=mode)
    if isinstance(manager.alpha_buffer, torch.Tensor):
        for name in BUFFER_NAMES:
            buffer = getattr(manager, f"{name}_buffer")
            buffer.copy_(torch.linspace(-1.0, 0.0, buffer.numel()).view(buffer.shape))
    return manager


def _dump(tmp_dir):
    """A dump of the offline prompt-cache tool: the rings in float16, the state in float32."""
    path = f"{tmp_dir}/prompt_cache.npz"
    ring = np.linspace(-1, 0, 64, dtype=np.float16).reshape(2, 1, 2, 4, 4)
    state = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 1, 2, 4, 4)
    np.savez(path, state=state, delta=ring, key=ring[:, :, :1], alpha=ring * 2)
    return path


def build_state_mem_manager():
    manager = _manager()
    manager.free(manager.alloc(2))
    return manager


def build_compact_mem_manager():
    return _manager(["compact_state"])


def build_layerwise_mem_manager():
    return _manager(["layerwise_state"])


def build_send_states():
    manager = _manager()
    manager.alloc_state_move_buffer(2)
    return manager.send_states(torch.tensor([2, 0], dtype=torch.int32))


def build_receive_states():
    manager = _manager()
    moved = {
        "state": torch.full((2, 1, 2, 4, 4), 0.5),
        "delta": torch.full((2, 1, 2, 4, 4), 0.25, dtype=torch.bfloat16),
        "alpha": torch.full((2, 1, 2, 4, 4), -0.125, dtype=torch.bfloat16),
    }
    manager.receive_states(moved, torch.tensor([1], dtype=torch.int32))
    return manager


def build_export_states():
    return _manager().export_states(torch.tensor([0, 2], dtype=torch.int32))


def build_import_prompt_cache(tmp_dir):
    return _manager().import_prompt_cache(_dump(tmp_dir))


def build_load_prompt_cache_into(tmp_dir):
    manager = _manager()
    manager.load_prompt_cache_into(_dump(tmp_dir), torch.tensor([1], dtype=torch.int32))
    return manager
