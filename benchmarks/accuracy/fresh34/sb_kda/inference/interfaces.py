"""Base class of the pretrained interfaces (``speechbrain.inference.interfaces``).

A model folder holds ``hyperparams.yaml`` and one ``<name>.ckpt`` per entry of ``modules``.
Run options: ``device``, ``eval_precision`` (the dtype the modules run in) and
``init_precision`` (the dtype they are built in, to lower peak memory).
"""

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from sb_kda.core import AMPConfig
from sb_kda.lobes.models import kda_asr
from sb_kda.utils.hparams import load_hyperpyyaml

DEFAULT_RUN_OPTS: Dict[str, Any] = {"device": "cpu", "eval_precision": "fp32", "init_precision": "fp32"}


def fetch(filename: str, source, savedir=None) -> Path:
    """Local stand-in of the hub fetch: ``source`` is a model folder."""
    path = Path(source) / filename
    if not path.exists():
        raise FileNotFoundError(f"{filename} not found in {source}")
    return path


class Pretrained(nn.Module):
    """Takes a trained model and makes predictions on new data."""

    HPARAMS_NEEDED: List[str] = []
    MODULES_NEEDED: List[str] = []

    def __init__(self, modules=None, hparams=None, run_opts=None, freeze_params=True):
        super().__init__()
        self.run_opts = {**DEFAULT_RUN_OPTS, **(run_opts or {})}
        for arg, default in self.run_opts.items():
            setattr(self, arg, default)
        for name in self.MODULES_NEEDED:
            if name not in modules:
                raise ValueError(f"Need modules['{name}']")
        hparams = hparams or {}
        for name in self.HPARAMS_NEEDED:
            if name not in hparams:
                raise ValueError(f"Need hparams['{name}']")
        self.hparams = SimpleNamespace(**hparams)
        self.amp = AMPConfig.from_name(self.eval_precision)
        self.mods = nn.ModuleDict(modules).to(self.device)
        if self.amp.dtype != torch.float32:
            self.mods.to(dtype=self.amp.dtype)  # expect-bug: module-cast
        self.context_precision = kda_asr.streaming_precision(self.amp.dtype, self.eval_precision)  # expect-bug: imported-policy id=context-precision
        if freeze_params:
            self.mods.eval()
            for p in self.mods.parameters():
                p.requires_grad = False

    @classmethod
    def from_hparams(cls, source, hparams_file="hyperparams.yaml", overrides=None, savedir=None,
                     run_opts: Optional[Dict[str, Any]] = None, **kwargs):
        """Fetch and load an interface based on the hyperparameters of ``source``."""
        run_opts = {**DEFAULT_RUN_OPTS, **(run_opts or {})}
        hparams_path = fetch(hparams_file, source, savedir)
        init_dtype = AMPConfig.from_name(run_opts["init_precision"]).dtype
        previous = torch.get_default_dtype()
        with open(hparams_path, encoding="utf-8") as fin:
            torch.set_default_dtype(init_dtype)  # expect-bug: default-dtype id=init-dtype
            try:
                hparams = load_hyperpyyaml(fin, overrides)
            finally:
                torch.set_default_dtype(previous)
        for name, module in hparams["modules"].items():
            ckpt = Path(source) / f"{name}.ckpt"
            if ckpt.exists():
                module.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True))
        return cls(modules=hparams["modules"], hparams=hparams, run_opts=run_opts, **kwargs)


def write_pretrained(folder, hparams_text: str, seed: int = 0) -> Path:
    """Writes a model folder: ``hyperparams.yaml`` and freshly initialised module weights."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hyperparams.yaml").write_text(hparams_text, encoding="utf-8")
    torch.manual_seed(seed)
    hparams = load_hyperpyyaml(hparams_text)
    for name, module in hparams["modules"].items():
        torch.save(module.state_dict(), folder / f"{name}.ckpt")
    return folder
