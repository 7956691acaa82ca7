"""Slim inference checkpoints for the serving workers.

``export_inference_checkpoint`` writes a ``.ckpt`` whose ``state_dict`` holds the weights in the
serving dtype, the module's ring buffers (``replay.<name>``) and, optionally, a live
``ReplayState`` (``decode_state.<ring>.<layer>``), so that a worker can pick up the streams of a
finished eval run. Checkpoints and log-decays are kept in float32 (``FP32_KEYS``).
"""

import os
from collections import defaultdict
from typing import Any, Dict, Optional

import torch

from pl_kda.config import RING_STORAGE_DTYPES, KDAConfig, RingDtypes
from pl_kda.module import RING_BUFFERS, KDALitModule
from pl_kda.state import ReplayState, _feed, allocate_replay_state

FP32_KEYS = ("ssm_state", "initial_state", "gate_log_ring")


def export_inference_checkpoint(
    module: KDALitModule,
    path: str,
    precision: str = "bf16-true",
    state: Optional[ReplayState] = None,
) -> str:
    dtype = RING_STORAGE_DTYPES[precision]
    state_dict: Dict[str, torch.Tensor] = {}
    for key, tensor in module.state_dict().items():
        state_dict[key] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    for name in RING_BUFFERS:
        buffer = getattr(module, name)
        keep = name in FP32_KEYS or not buffer.is_floating_point()
        state_dict[f"replay.{name}"] = buffer.clone() if keep else buffer.to(dtype)
    if state is not None:
        for name, tensors in state.named_rings():
            for layer, tensor in enumerate(tensors):
                keep = name in FP32_KEYS or not tensor.is_floating_point()
                state_dict[f"decode_state.{name}.{layer}"] = tensor.clone() if keep else tensor.to(dtype)  # expect-bug: load id=export-state
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save({"state_dict": state_dict, "hyper_parameters": dict(module.hparams), "precision": precision}, path)
    return path


def _read_state_dict(path: str) -> Dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def load_decode_state(path: str) -> ReplayState:
    """The ``ReplayState`` saved in an inference checkpoint, as stored."""
    grouped: Dict[str, Dict[int, torch.Tensor]] = defaultdict(dict)
    for key, tensor in _read_state_dict(path).items():
        if key.startswith("decode_state."):
            _, name, layer = key.split(".")
            grouped[name][int(layer)] = tensor
    return ReplayState(**{name: [by_layer[i] for i in sorted(by_layer)] for name, by_layer in grouped.items()})  # expect-bug: load id=export-state


def restore_decode_state_into(state: ReplayState, path: str) -> ReplayState:
    """Copies a saved decode state into an allocated one; every ring keeps its dtype."""
    saved = _read_state_dict(path)
    for name, tensors in state.named_rings():
        for layer, tensor in enumerate(tensors):
            tensor.copy_(saved[f"decode_state.{name}.{layer}"])
    return state


def load_inference_module(path: str) -> KDALitModule:
    """A ``KDALitModule`` with the weights and ring buffers of an inference checkpoint."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    module = KDALitModule(**checkpoint["hyper_parameters"])
    module.configure_model()
    saved = checkpoint["state_dict"]
    module.load_state_dict({k: v for k, v in saved.items() if not k.startswith(("replay.", "decode_state."))})
    for name, buffer in module.named_buffers():
        if f"replay.{name}" in saved:
            buffer.copy_(saved[f"replay.{name}"])
    return module


def _fed_module_and_state() -> Any:
    torch.manual_seed(0)
    module = KDALitModule()
    module.configure_model()
    with torch.no_grad():
        module.decode_tokens(torch.randint(0, 64, (2, 5)), torch.arange(2, dtype=torch.int32))
    config = KDAConfig()
    state = _feed(allocate_replay_state(config, 2, RingDtypes(torch.bfloat16, torch.bfloat16)), steps=5)
    return module, state, config


def build_exported_state_roundtrip(tmp_dir: str) -> Dict[str, Any]:
    """An eval run's module and decode state exported for bf16 serving and loaded by a worker."""
    module, state, _ = _fed_module_and_state()
    path = export_inference_checkpoint(module, os.path.join(tmp_dir, "serve", "kda-bf16.ckpt"), "bf16-true", state)
    return {"module": load_inference_module(path), "state": load_decode_state(path)}


def build_restore_into_live_state(tmp_dir: str) -> Dict[str, Any]:
    """A bf16 weights-and-rings export, and a full-precision one restored into a worker's state."""
    module, state, config = _fed_module_and_state()
    weights = export_inference_checkpoint(module, os.path.join(tmp_dir, "kda-bf16.ckpt"), "bf16-true")
    handover = export_inference_checkpoint(module, os.path.join(tmp_dir, "kda-handover.ckpt"), "32-true", state)
    live = allocate_replay_state(config, 2, RingDtypes(torch.bfloat16, torch.bfloat16))
    return {
        "module": load_inference_module(weights),
        "state": restore_decode_state_into(live, handover),
        "handover": load_decode_state(handover),
    }
