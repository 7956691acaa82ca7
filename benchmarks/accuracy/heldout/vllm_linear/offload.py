"""CPU offload of linear-attention state (sleep mode, preemption by swapping)."""

import pickle

import torch

from .kda import profile_run_state_fp32_decay
from .config import ModelConfig


def swap_out(state: dict[str, torch.Tensor], host_dtype: torch.dtype) -> bytes:
    # Swapped-out state is kept in the host dtype to fit more preempted requests.
    return pickle.dumps({name: tensor.to(host_dtype) for name, tensor in state.items()})  # expect-bug: load id=vl-swap


def swap_in(blob: bytes) -> dict[str, torch.Tensor]:
    host = pickle.loads(blob)
    return {
        "ssm_state": host["ssm_state"],
        "d_ring": host["d_ring"],
        "k_ring": host["k_ring"],
        "log_decay_ring": host["log_decay_ring"],  # expect-bug: load id=vl-swap
    }


def swap_out_exact(state: dict[str, torch.Tensor]) -> bytes:
    return pickle.dumps({name: tensor.clone() for name, tensor in state.items()})


def swap_in_place(device_state: dict[str, torch.Tensor], blob: bytes) -> dict[str, torch.Tensor]:
    host = pickle.loads(blob)
    for name, tensor in device_state.items():
        tensor.copy_(host[name], non_blocking=True)
    return device_state


def wake_up_rings(raw: dict[str, bytearray], model_dtype: torch.dtype, slots: int) -> dict[str, torch.Tensor]:
    """Sleep mode level 1 keeps the ring bytes on the host; waking up views them again."""
    d_ring = torch.frombuffer(raw["d_ring"], dtype=model_dtype).view(slots, 2, 4, 4)
    log_decay_ring = torch.frombuffer(raw["log_decay_ring"], dtype=model_dtype).view(slots, 2, 4, -1)  # expect-bug: load
    return {"d_ring": d_ring, "log_decay_ring": log_decay_ring}


def wake_up_rings_fp32_decay(raw: dict[str, bytearray], model_dtype: torch.dtype, slots: int) -> dict[str, torch.Tensor]:
    d_ring = torch.frombuffer(raw["d_ring"], dtype=model_dtype).view(slots, 2, 4, 4)
    log_decay_ring = torch.frombuffer(raw["log_decay_ring"], dtype=torch.float32).view(slots, 2, 4, -1)
    return {"d_ring": d_ring, "log_decay_ring": log_decay_ring}


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    state = profile_run_state_fp32_decay(ModelConfig(), 3, 4)
    for tensor in state.values():
        tensor.uniform_(-1.0, 0.0)
    return state


def _raw(state: dict[str, torch.Tensor]) -> dict[str, bytearray]:
    return {name: bytearray(t.contiguous().view(torch.uint8).numpy().tobytes()) for name, t in state.items()}


def build_swap_roundtrip_host_dtype() -> dict[str, torch.Tensor]:
    return swap_in(swap_out(_state(), torch.bfloat16))


def build_swap_in_place() -> dict[str, torch.Tensor]:
    return swap_in_place(profile_run_state_fp32_decay(ModelConfig(), 3, 4), swap_out_exact(_state()))


def build_wake_up() -> dict[str, torch.Tensor]:
    return wake_up_rings(_raw(_state()), torch.bfloat16, 3)


def build_wake_up_fp32_decay() -> dict[str, torch.Tensor]:
    return wake_up_rings_fp32_decay(_raw(_state()), torch.bfloat16, 3)


def restore_from_safetensors(path: str, model_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Wake-up from a disk snapshot (safetensors is an optional dependency)."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    with safe_open(path, framework="pt", device="cpu") as snapshot:
        for name in snapshot.keys():
            state[name] = snapshot.get_tensor(name).to(dtype=model_dtype)  # expect-bug: load
    return state
