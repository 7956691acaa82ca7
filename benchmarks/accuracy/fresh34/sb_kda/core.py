"""Core training loop: ``Brain``, ``Stage`` and the run options.

``precision``/``eval_precision`` (``fp32``, ``fp16``, ``bf16``) are the autocast dtypes of
training and of evaluation; CPU autocast only covers bf16, so with ``cast_eval_modules``
fp16 evaluation casts the modules instead.
"""

import argparse
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum, auto
from types import SimpleNamespace
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from sb_kda.nnet.kimi_delta import StreamingPrecision

PRECISION_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# Storage of the streaming contexts built for evaluation, per ``eval_precision``.
CACHE_PRECISION = {
    "fp32": StreamingPrecision(ring_dtype=torch.float32, forget_dtype=torch.float32),
    "fp16": StreamingPrecision(ring_dtype=torch.float16, forget_dtype=torch.float32),
    "bf16": StreamingPrecision(ring_dtype=torch.bfloat16, forget_dtype=torch.bfloat16),  # expect-bug: imported-policy id=cache-table
}

run_opt_defaults: Dict[str, Any] = {
    "device": "cpu",
    "precision": "fp32",
    "eval_precision": "fp32",
    "cast_eval_modules": False,
    "grad_accumulation_factor": 1,
}


class Stage(Enum):
    """Simple enum to track stage of experiments."""

    TRAIN = auto()
    VALID = auto()
    TEST = auto()


@dataclass
class AMPConfig:
    """Autocast configuration of one precision name."""

    dtype: torch.dtype

    @classmethod
    def from_name(cls, name: Optional[str]) -> "AMPConfig":
        if name is None:
            return cls(torch.float32)
        if name not in PRECISION_DTYPES:
            raise ValueError(f"Specified autocast mode ({name}) incorrect, expected one of {sorted(PRECISION_DTYPES)}.")
        return cls(PRECISION_DTYPES[name])


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Sets torch's default floating dtype inside the block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def parse_arguments(arg_list: Optional[List[str]] = None) -> Tuple[str, Dict[str, Any], Dict[str, str]]:
    """``(hparams_file, run_opts, overrides)``; unknown ``--key=value`` arguments are overrides."""
    parser = argparse.ArgumentParser(description="Run a SpeechBrain-style experiment")
    parser.add_argument("param_file", type=str)
    parser.add_argument("--device", type=str, default="cpu")
    for name in ("precision", "eval_precision"):
        parser.add_argument(f"--{name}", choices=sorted(PRECISION_DTYPES), default="fp32")
    parser.add_argument("--cast_eval_modules", action="store_true")
    run_opts, rest = parser.parse_known_args(arg_list)
    overrides = dict(arg.lstrip("-").partition("=")[::2] for arg in rest)
    run_opts = vars(run_opts)
    return run_opts.pop("param_file"), run_opts, overrides


class Brain:
    """Brain class abstracts away the details of data loops.

    Subclasses override ``compute_forward`` and ``compute_objectives`` (and usually
    ``on_stage_start``/``on_stage_end``); ``hparams`` become attributes of ``self.hparams``,
    ``run_opts`` attributes of ``self``; the checkpointer is recovered before fit and evaluate.
    """

    def __init__(self, modules=None, opt_class=None, hparams=None, run_opts=None, checkpointer=None):
        self.opt_class = opt_class
        self.checkpointer = checkpointer
        self.run_opts = dict(run_opt_defaults)
        self.run_opts.update(run_opts or {})
        for arg, value in self.run_opts.items():
            setattr(self, arg, value)
        self.hparams = SimpleNamespace(**(hparams or {}))
        self.modules = torch.nn.ModuleDict(modules).to(self.device)
        self.precision_dtype = AMPConfig.from_name(self.precision).dtype
        self.eval_dtype = AMPConfig.from_name(self.eval_precision).dtype
        self.optimizer = None

    def compute_forward(self, batch, stage):
        raise NotImplementedError

    def compute_objectives(self, predictions, batch, stage):
        raise NotImplementedError

    def on_stage_start(self, stage, epoch=None):
        pass

    def on_stage_end(self, stage, stage_loss, epoch=None):
        pass

    def on_fit_start(self):
        self.init_optimizers()
        if self.checkpointer is not None:
            self.checkpointer.recover_if_possible()

    def init_optimizers(self):
        if self.opt_class is not None:
            self.optimizer = self.opt_class(self.modules.parameters())
            if self.checkpointer is not None:
                self.checkpointer.add_recoverable("optimizer", self.optimizer)

    def on_evaluate_start(self, max_key=None, min_key=None):
        if self.checkpointer is not None:
            self.checkpointer.recover_if_possible(max_key=max_key, min_key=min_key)
        if self.cast_eval_modules and self.eval_precision == "fp16":
            self.modules.half()  # expect-bug: module-cast

    def _autocast(self, dtype: torch.dtype):
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)

    def fit_batch(self, batch):
        with self._autocast(self.precision_dtype):
            outputs = self.compute_forward(batch, Stage.TRAIN)
            loss = self.compute_objectives(outputs, batch, Stage.TRAIN)
        (loss / self.grad_accumulation_factor).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().cpu()

    @torch.no_grad()
    def evaluate_batch(self, batch, stage):
        with self._autocast(self.eval_dtype):
            out = self.compute_forward(batch, stage=stage)
            loss = self.compute_objectives(out, batch, stage=stage)
        return loss.detach().cpu()

    def _run_stage(self, stage: Stage, dataset, epoch=None) -> float:
        self.on_stage_start(stage, epoch)
        self.modules.train(stage == Stage.TRAIN)
        avg_loss = 0.0
        for step, batch in enumerate(dataset, start=1):
            loss = self.fit_batch(batch) if stage == Stage.TRAIN else self.evaluate_batch(batch, stage)
            if torch.isfinite(loss):
                avg_loss += (float(loss) - avg_loss) / step
        self.on_stage_end(stage, avg_loss, epoch)
        return avg_loss

    def fit(self, epoch_counter: Iterable[int], train_set, valid_set=None):
        self.on_fit_start()
        for epoch in epoch_counter:
            if train_set:
                self._run_stage(Stage.TRAIN, train_set, epoch)
            if valid_set is not None:
                self._run_stage(Stage.VALID, valid_set, epoch)

    def evaluate(self, test_set, max_key=None, min_key=None) -> float:
        self.on_evaluate_start(max_key=max_key, min_key=min_key)
        return self._run_stage(Stage.TEST, test_set)
