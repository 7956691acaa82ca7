"""Checkpointing of model weights and of the decode rings (``Stateful`` objects by name)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import nn

from .config_manager import TORCH_DTYPE_MAP, JobConfig
from .models.model import KDAAttention
from .parallelize import materialize_model

_RING_BUFFERS = ("state_buf", "d_buf", "k_buf", "decay_buf", "pos_buf")


class ModelWrapper:
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.model.load_state_dict(state_dict)


class DecodeStateWrapper:
    """The rings of every KDA layer, so that an interrupted generation can resume."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = {fqn: m for fqn, m in model.named_modules() if isinstance(m, KDAAttention)}

    def state_dict(self) -> dict[str, Any]:
        return {f"{fqn}.{name}": getattr(m, name) for fqn, m in self.layers.items() for name in _RING_BUFFERS}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for fqn, module in self.layers.items():
            for name in _RING_BUFFERS:
                setattr(module, name, state_dict[f"{fqn}.{name}"].clone())  # expect-bug: load id=titan-export


class CheckpointManager:
    def __init__(self, states: dict[str, Any], job_config: JobConfig) -> None:
        self.states = states
        self.folder = job_config.checkpoint.folder
        self.export_dtype = TORCH_DTYPE_MAP[job_config.checkpoint.export_dtype]

    def _export(self, state_dict: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The final export is read by inference jobs: floats go out in ``export_dtype``."""
        return {
            key: {k: v.to(self.export_dtype) if v.is_floating_point() else v for k, v in sd.items()}  # expect-bug: load id=titan-export
            for key, sd in state_dict.items()
        }

    def save(self, step: int, last_step: bool = False) -> None:
        state_dict = {key: stateful.state_dict() for key, stateful in self.states.items()}
        if last_step:
            state_dict = self._export(state_dict)
        os.makedirs(self.folder, exist_ok=True)
        torch.save(state_dict, os.path.join(self.folder, f"step-{step}.pt"))

    def load(self, step: int) -> None:
        state_dict = torch.load(os.path.join(self.folder, f"step-{step}.pt"), weights_only=True)
        for key, stateful in self.states.items():
            stateful.load_state_dict(state_dict[key])


def save_prefix_cache(path: str, rings: dict[str, torch.Tensor]) -> None:
    np.savez(path, **{name: ring.float().numpy() for name, ring in rings.items()})


def load_prefix_cache(path: str, ring_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Reads rings written by ``save_prefix_cache`` (float32 arrays: numpy has no bfloat16)."""
    arrays = np.load(path)
    rings = {name: torch.as_tensor(arrays[name], dtype=ring_dtype) for name in ("delta", "key")}
    rings["forget_log"] = torch.as_tensor(arrays["forget_log"], dtype=ring_dtype)  # expect-bug: load
    return rings


def _run_and_save(tmp_dir: str, last_step: bool) -> nn.Module:
    job_config = JobConfig.from_dict({"checkpoint": {"folder": os.path.join(tmp_dir, "ckpt"), "export_dtype": "bfloat16"}})
    model = materialize_model(job_config)
    model(torch.tensor([4, 2]))
    CheckpointManager({"model": ModelWrapper(model), "decode": DecodeStateWrapper(model)}, job_config).save(10, last_step)
    resumed = materialize_model(job_config)
    CheckpointManager({"model": ModelWrapper(resumed), "decode": DecodeStateWrapper(resumed)}, job_config).load(10)
    return resumed


def build_checkpoint_resume(tmp_dir: str) -> nn.Module:
    return _run_and_save(tmp_dir, last_step=False)


def build_export_reload(tmp_dir: str) -> nn.Module:
    return _run_and_save(tmp_dir, last_step=True)
