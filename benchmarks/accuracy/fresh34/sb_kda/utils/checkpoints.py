"""Checkpointing of recoverable objects (``speechbrain.utils.checkpoints``).

``nn.Module`` and optimizers are saved through their ``state_dict``; other classes register
their own hooks with ``@register_checkpoint_hooks`` and ``@mark_as_saver``/``@mark_as_loader``.
"""

import inspect
import itertools
import json
import time
from collections import namedtuple
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

CKPT_PREFIX = "CKPT"
METAFNAME = f"{CKPT_PREFIX}.yaml"
PARAMFILE_EXT = ".ckpt"
_ckpt_counter = itertools.count()


def torch_save(obj: Any, path: Path) -> None:
    torch.save(obj.state_dict(), path)


def torch_recovery(obj: Any, path: Path, end_of_epoch: bool = False) -> None:
    state_dict = torch.load(path, map_location="cpu", weights_only=True)
    try:
        obj.load_state_dict(state_dict, strict=True)
    except TypeError:
        obj.load_state_dict(state_dict)


DEFAULT_SAVE_HOOKS: Dict[type, Callable] = {torch.nn.Module: torch_save, torch.optim.Optimizer: torch_save}
DEFAULT_LOAD_HOOKS: Dict[type, Callable] = {torch.nn.Module: torch_recovery, torch.optim.Optimizer: torch_recovery}


def mark_as_saver(method: Callable) -> Callable:
    """Method decorator: the method saves the object, signature ``(self, path)``."""
    try:
        inspect.signature(method).bind(object(), Path("testpath"))
    except TypeError:
        raise TypeError("Checkpoint saver must match signature (instance, path)")
    method._speechbrain_saver = True
    return method


def mark_as_loader(method: Callable) -> Callable:
    """Method decorator: the method loads the object, signature ``(self, path, end_of_epoch)``."""
    try:
        inspect.signature(method).bind(object(), Path("testpath"), True)
    except TypeError:
        raise TypeError("Checkpoint loader must have signature (self, path, end_of_epoch)")
    method._speechbrain_loader = True
    return method


def register_checkpoint_hooks(cls: type) -> type:
    for method in cls.__dict__.values():
        if getattr(method, "_speechbrain_saver", False):
            DEFAULT_SAVE_HOOKS[cls] = method
        if getattr(method, "_speechbrain_loader", False):
            DEFAULT_LOAD_HOOKS[cls] = method
    return cls


def get_default_hook(obj: Any, default_hooks: Dict[type, Callable]) -> Optional[Callable]:
    for cls in inspect.getmro(type(obj)):
        if cls in default_hooks:
            return default_hooks[cls]
    return None


Checkpoint = namedtuple("Checkpoint", ["path", "meta", "paramfiles"])


class Checkpointer:
    """Saves and recovers named recoverables, one ``CKPT+...`` folder per checkpoint."""

    def __init__(self, checkpoints_dir, recoverables: Optional[Dict[str, Any]] = None):
        self.checkpoints_dir = Path(checkpoints_dir)
        self.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        self.recoverables: Dict[str, Any] = {}
        self.custom_save_hooks: Dict[str, Callable] = {}
        self.custom_load_hooks: Dict[str, Callable] = {}
        for name, obj in (recoverables or {}).items():
            self.add_recoverable(name, obj)

    def add_recoverable(self, name: str, obj: Any, custom_load_hook=None, custom_save_hook=None) -> None:
        self.recoverables[name] = obj
        if custom_load_hook is not None:
            self.custom_load_hooks[name] = custom_load_hook
        if custom_save_hook is not None:
            self.custom_save_hooks[name] = custom_save_hook

    def save_checkpoint(self, meta: Optional[Dict[str, Any]] = None, end_of_epoch: bool = True) -> Checkpoint:
        ckpt_dir = self.checkpoints_dir / f"{CKPT_PREFIX}+{next(_ckpt_counter):06d}"
        ckpt_dir.mkdir(parents=True)
        saved_meta = {"unixtime": time.time(), "end-of-epoch": end_of_epoch, **(meta or {})}
        (ckpt_dir / METAFNAME).write_text(json.dumps(saved_meta), encoding="utf-8")
        paramfiles = {}
        for name, obj in self.recoverables.items():
            paramfiles[name] = ckpt_dir / f"{name}{PARAMFILE_EXT}"
            hook = self.custom_save_hooks.get(name) or get_default_hook(obj, DEFAULT_SAVE_HOOKS)
            if hook is None:
                raise RuntimeError(f"Don't know how to save {type(obj)}. Register default hook or add custom hook for this object.")
            hook(obj, paramfiles[name])
        return Checkpoint(ckpt_dir, saved_meta, paramfiles)

    def find_checkpoint(self, max_key: Optional[str] = None, min_key: Optional[str] = None) -> Optional[Checkpoint]:
        ckpts = []
        for ckpt_dir in sorted(self.checkpoints_dir.glob(f"{CKPT_PREFIX}+*")):
            meta = json.loads((ckpt_dir / METAFNAME).read_text(encoding="utf-8"))
            ckpts.append(Checkpoint(ckpt_dir, meta, {p.stem: p for p in ckpt_dir.glob(f"*{PARAMFILE_EXT}")}))
        if max_key is not None:
            ckpts = sorted((c for c in ckpts if max_key in c.meta), key=lambda c: c.meta[max_key])
        elif min_key is not None:
            ckpts = sorted((c for c in ckpts if min_key in c.meta), key=lambda c: -c.meta[min_key])
        return ckpts[-1] if ckpts else None

    def recover_if_possible(self, max_key: Optional[str] = None, min_key: Optional[str] = None) -> Optional[Checkpoint]:
        checkpoint = self.find_checkpoint(max_key=max_key, min_key=min_key)
        if checkpoint is None:
            return None
        for name, obj in self.recoverables.items():
            hook = self.custom_load_hooks.get(name) or get_default_hook(obj, DEFAULT_LOAD_HOOKS)
            hook(obj, checkpoint.paramfiles[name], checkpoint.meta.get("end-of-epoch", True))
        return checkpoint
