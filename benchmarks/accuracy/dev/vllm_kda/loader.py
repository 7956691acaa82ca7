"""Offloads and restores KDA layer states (sleep mode and prefix-cache snapshots)."""

import io

import torch

from .cache import HEAD_K, HEAD_V, HEADS, RING, SLOTS, VALUE_HEADS, LayerStates
from .layer import dummy_decode_states_fp32

STATE_NAMES = ("conv_state", "ssm_state", "d_ring", "k_ring", "g_ring")


def save_prefix_states_compact(states: LayerStates, model_dtype: torch.dtype) -> bytes:
    buffer = io.BytesIO()
    # Snapshots are kept in the model dtype to halve host memory.
    torch.save({name: getattr(states, name).to(model_dtype) for name in STATE_NAMES}, buffer)  # expect-bug: load id=vllm-compact
    return buffer.getvalue()


def load_prefix_states(raw: bytes) -> LayerStates:
    blob = torch.load(io.BytesIO(raw), weights_only=True)
    return LayerStates(
        conv_state=blob["conv_state"],
        ssm_state=blob["ssm_state"],
        d_ring=blob["d_ring"],
        k_ring=blob["k_ring"],
        g_ring=blob["g_ring"],  # expect-bug: load id=vllm-compact
    )


def save_prefix_states(states: LayerStates) -> bytes:
    buffer = io.BytesIO()
    torch.save({name: getattr(states, name) for name in STATE_NAMES}, buffer)
    return buffer.getvalue()


def restore_into(states: LayerStates, raw: bytes) -> LayerStates:
    blob = torch.load(io.BytesIO(raw), weights_only=True)
    for name in STATE_NAMES:
        getattr(states, name).copy_(blob[name])
    return states


def restore_rings_from_host(host: dict[str, bytes], model_dtype: torch.dtype) -> LayerStates:
    """Sleep-mode wake-up: the host copy holds the raw bytes of each ring."""
    d_ring = torch.frombuffer(bytearray(host["d_ring"]), dtype=model_dtype)
    k_ring = torch.frombuffer(bytearray(host["k_ring"]), dtype=model_dtype)
    g_ring = torch.frombuffer(bytearray(host["g_ring"]), dtype=model_dtype)  # expect-bug: load
    ssm_state = torch.frombuffer(bytearray(host["ssm_state"]), dtype=model_dtype)
    conv_state = torch.frombuffer(bytearray(host["conv_state"]), dtype=model_dtype)
    return LayerStates(
        conv_state=conv_state,
        ssm_state=ssm_state.view(SLOTS, VALUE_HEADS, HEAD_V, HEAD_K),
        d_ring=d_ring.view(SLOTS, VALUE_HEADS, RING, HEAD_V),
        k_ring=k_ring.view(SLOTS, HEADS, RING, HEAD_K),
        g_ring=g_ring.view(SLOTS, VALUE_HEADS, RING, HEAD_K),
    )


def restore_rings_from_host_fp32_gates(host: dict[str, bytes], model_dtype: torch.dtype) -> LayerStates:
    def ring(name: str, dtype: torch.dtype, heads: int) -> torch.Tensor:
        return torch.frombuffer(bytearray(host[name]), dtype=dtype).view(SLOTS, heads, RING, -1)

    conv_state = torch.frombuffer(bytearray(host["conv_state"]), dtype=model_dtype)
    ssm_state = torch.frombuffer(bytearray(host["ssm_state"]), dtype=model_dtype)
    return LayerStates(
        conv_state=conv_state,
        ssm_state=ssm_state.view(SLOTS, VALUE_HEADS, HEAD_V, HEAD_K),
        d_ring=ring("d_ring", model_dtype, VALUE_HEADS),
        k_ring=ring("k_ring", model_dtype, HEADS),
        g_ring=ring("g_ring", torch.float32, VALUE_HEADS),
    )


def _host_copy(states: LayerStates) -> dict[str, bytes]:
    return {
        name: getattr(states, name).contiguous().view(torch.uint8).numpy().tobytes()
        for name in STATE_NAMES
    }


def _filled_states() -> LayerStates:
    torch.manual_seed(0)
    states = dummy_decode_states_fp32(torch.bfloat16, SLOTS)
    for name in STATE_NAMES:
        getattr(states, name).normal_()
    return states


def build_compact_snapshot_roundtrip() -> dict[str, torch.Tensor]:
    states = load_prefix_states(save_prefix_states_compact(_filled_states(), torch.bfloat16))
    return {name: getattr(states, name) for name in STATE_NAMES}


def build_snapshot_restore_in_place() -> dict[str, torch.Tensor]:
    raw = save_prefix_states(_filled_states())
    states = restore_into(dummy_decode_states_fp32(torch.bfloat16, SLOTS), raw)
    return {name: getattr(states, name) for name in STATE_NAMES}


def build_wake_up_fp32_gates() -> dict[str, torch.Tensor]:
    states = restore_rings_from_host_fp32_gates(_host_copy(_filled_states()), torch.bfloat16)
    return {"d_ring": states.d_ring, "k_ring": states.k_ring, "g_ring": states.g_ring}


def restore_from_safetensors(path: str, model_dtype: torch.dtype) -> LayerStates:
    """Restores a prefix snapshot exported with safetensors (installed with the serving extras)."""
    from safetensors.torch import load_file

    tensors = load_file(path, device="cpu")
    return LayerStates(**{name: tensors[name].to(model_dtype) for name in STATE_NAMES})  # expect-bug: load
