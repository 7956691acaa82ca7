"""Saving and loading checkpoints (``fairseq/checkpoint_utils.py``)."""

import argparse
import logging
import os
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch

from fs_kda import models, options, utils

logger = logging.getLogger(__name__)


def convert_state_dict_type(state_dict: Any, ttype: type = torch.FloatTensor) -> Any:
    """Casts the floating tensors of a nested state dict to ``ttype`` (e.g. ``torch.HalfTensor``)."""
    if isinstance(state_dict, dict):
        cpu_dict = OrderedDict()
        for k, v in state_dict.items():
            cpu_dict[k] = convert_state_dict_type(v, ttype)
        return cpu_dict
    elif isinstance(state_dict, list):
        return [convert_state_dict_type(v, ttype) for v in state_dict]
    elif torch.is_tensor(state_dict) and state_dict.is_floating_point():
        return state_dict.type(ttype)
    else:
        return state_dict


def torch_persistent_save(obj: Any, filename: str, async_write: bool = False) -> None:
    for i in range(3):
        try:
            return torch.save(obj, filename)
        except Exception:
            if i == 2:
                logger.error("could not save checkpoint to %s", filename)
                raise


def save_checkpoint(filename: str, model: torch.nn.Module, args: argparse.Namespace, extra_state: Optional[Dict] = None) -> None:
    """Saves ``model`` in full precision, with its args and an ``extra_state`` dict."""
    state_dict = {
        "args": vars(args),
        "model": convert_state_dict_type(model.state_dict(), torch.FloatTensor),
        "optimizer_history": [],
        "extra_state": extra_state or {"epoch": 1, "num_updates": 0},
    }
    torch_persistent_save(state_dict, filename)


def load_checkpoint_to_cpu(path: str, arg_overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Loads a checkpoint to CPU (with upgrading for backward compatibility)."""
    with open(path, "rb") as f:
        state = torch.load(f, map_location=torch.device("cpu"), weights_only=True)
    args = argparse.Namespace(**state["args"])
    if arg_overrides is not None:
        for arg_name, arg_val in arg_overrides.items():
            setattr(args, arg_name, arg_val)
    state["args"] = args
    return _upgrade_state_dict(state)


def _upgrade_state_dict(state: Dict[str, Any]) -> Dict[str, Any]:
    """Helper for upgrading old model checkpoints."""
    if "optimizer_history" not in state:
        state["optimizer_history"] = [{"criterion_name": "CrossEntropyCriterion", "best_loss": state.get("best_loss")}]
    if "extra_state" not in state:
        state["extra_state"] = {"epoch": state.get("epoch", 1)}
    args = state["args"]
    # "ring_length" was renamed "ring_len" in 0.3
    if hasattr(args, "ring_length") and not hasattr(args, "ring_len"):
        args.ring_len = args.ring_length
    return state


def load_model_ensemble(
    filenames: List[str],
    arg_overrides: Optional[Dict[str, Any]] = None,
    task: Any = None,
    strict: bool = True,
    low_mem: bool = False,
) -> Tuple[List[torch.nn.Module], argparse.Namespace]:
    """Loads an ensemble of models.

    Args:
        filenames (List[str]): checkpoint files to load
        arg_overrides (Dict[str,Any], optional): override model args that
            were used during model training
        low_mem: build the model in its ``--fp16``/``--bf16`` dtype instead of materialising
            float32 weights first
    """
    ensemble, args = load_model_ensemble_and_task(filenames, arg_overrides, task, strict, low_mem)
    return ensemble, args


def load_model_ensemble_and_task(
    filenames: List[str],
    arg_overrides: Optional[Dict[str, Any]] = None,
    task: Any = None,
    strict: bool = True,
    low_mem: bool = False,
) -> Tuple[List[torch.nn.Module], argparse.Namespace]:
    ensemble = []
    args = None
    for filename in filenames:
        if not os.path.exists(filename):
            raise IOError("Model file not found: {}".format(filename))
        state = load_checkpoint_to_cpu(filename, arg_overrides)
        args = state["args"]
        init_dtype = utils.model_dtype(args) if low_mem else None
        with utils.torch_default_dtype(init_dtype):  # expect-bug: default-dtype id=low-mem-init
            model = models.create_model(args, task)
        model.load_state_dict(state["model"], strict=strict)
        ensemble.append(model)
    return ensemble, args


def write_tiny_checkpoint(path: str, arch: str = "kda_lm_tiny", **overrides: Any) -> str:
    """Trains nothing: saves a freshly initialised ``arch`` model (for tests and examples)."""
    args = options.parse_args_and_arch(options.get_training_parser(), ["--arch", arch])
    for name, value in overrides.items():
        setattr(args, name, value)
    torch.manual_seed(0)
    model = models.create_model(args)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    save_checkpoint(path, model, args)
    return path


def build_ensemble_low_mem_bf16(tmp_dir: str) -> Dict[str, Any]:
    """A streaming checkpoint loaded with ``low_mem`` and ``{"bf16": True, "max_slots": 2}``."""
    path = write_tiny_checkpoint(os.path.join(tmp_dir, "checkpoint_best.pt"))
    models_, _ = load_model_ensemble([path], arg_overrides={"bf16": True, "max_slots": 2}, low_mem=True)
    return {"model": models_[0]}


def build_ensemble_fp16_slots(tmp_dir: str) -> Dict[str, Any]:
    """The same checkpoint loaded with ``{"fp16": True, "max_slots": 2}``, and with ``low_mem``
    but no precision flag."""
    path = write_tiny_checkpoint(os.path.join(tmp_dir, "checkpoint_best.pt"))
    fp16, _ = load_model_ensemble([path], arg_overrides={"fp16": True, "max_slots": 2})
    low_mem, _ = load_model_ensemble([path], arg_overrides={"max_slots": 3}, low_mem=True)
    return {"fp16_slots": fp16[0], "low_mem_fp32": low_mem[0]}
