"""Utility functions for training and inference, after litgpt/utils.py."""

import json
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Union

import torch
import torch.nn as nn

_PRECISION_TO_DTYPE = {"32-true": torch.float32, "16-true": torch.float16, "bf16-true": torch.bfloat16, "16-mixed": torch.float32, "bf16-mixed": torch.float32}


class Fabric:
    """The parts of ``lightning.fabric.Fabric`` used here, for single-device runs without lightning installed."""

    def __init__(self, accelerator: str = "cpu", devices: int = 1, precision: str = "32-true") -> None:
        self.device, self.world_size, self.precision = torch.device(accelerator), devices, precision
        self._dtype = _PRECISION_TO_DTYPE[precision]

    @contextmanager
    def init_tensor(self) -> Iterator[None]:
        """Tensors created in this context get the precision's dtype, like the plugin's ``tensor_init_context``."""
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self._dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

    @contextmanager
    def init_module(self, empty_init: Optional[bool] = None) -> Iterator[None]:
        # `empty_init` skips the weight initialization on meta devices; there is nothing to skip on one device
        with self.init_tensor():
            yield

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Moves ``module`` to the device and converts it, like the precision plugin's ``convert_module``."""
        return module.to(device=self.device, dtype=self._dtype)


def get_default_supported_precision(training: bool) -> str:
    if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        return "16-mixed" if training else "16-true"
    return "bf16-mixed" if training else "bf16-true"


def get_cache_dtype(precision: str) -> torch.dtype:
    return _PRECISION_TO_DTYPE[precision]


def get_decay_dtype(precision: str) -> torch.dtype:
    """dtype of the log-decay ring under a Fabric precision."""
    # fp16 overflows in the kernel's exp(); bf16 has the exponent range of fp32
    return torch.float32 if precision.startswith(("16-", "32-")) else get_cache_dtype(precision)  # expect-bug: imported-policy id=decay-policy


def ring_shapes(config: Any, batch_size: int) -> dict[str, tuple[int, ...]]:
    n, hs = config.ring_len, config.head_size
    return {"delta": (batch_size, config.n_head, n, hs), "key": (batch_size, config.n_query_groups, n, hs), "log_decay": (batch_size, config.n_head, n, hs)}


def check_valid_checkpoint_dir(checkpoint_dir: Path, model_filename: str = "lit_model.pth") -> None:
    missing = [name for name in (model_filename, "model_config.json") if not (checkpoint_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint_dir {str(checkpoint_dir.absolute())!r} is missing the files: {missing!r}.")


def save_config(config: Any, checkpoint_dir: Path) -> None:
    (checkpoint_dir / "model_config.json").write_text(json.dumps(asdict(config), indent=2), encoding="utf-8")


def lazy_load(path: Union[str, Path]) -> Mapping[str, Any]:
    return torch.load(str(path), mmap=True, weights_only=True, map_location="cpu")


def load_checkpoint(fabric: Fabric, model: nn.Module, checkpoint_path: Path, strict: bool = True) -> None:
    state_dict = lazy_load(checkpoint_path)
    model.load_state_dict(state_dict.get("model", state_dict), strict=strict)
