# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

"""A single-device subset of ``lightning.fabric``: precision plugins and the ``Fabric`` entry point.

Only what the scripts in this package use is implemented; the names and semantics follow
``lightning.fabric`` so the scripts run unchanged against the real thing.
"""

import random
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, ContextManager, Dict, Iterator, Literal, Optional, Union

import numpy as np
import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

from litgpt_kda.utils import default_dtype, get_default_supported_precision

_PRECISION_INPUT = Literal["32-true", "bf16-true", "16-true", "bf16-mixed", "16-mixed"]


def _convert_fp_tensor(data: Any, dst_type: torch.dtype) -> Any:
    if isinstance(data, torch.Tensor) and torch.is_floating_point(data):
        return data.to(dst_type)
    return data


class Precision:
    """Base class for all plugins handling the precision-specific parts of the training.

    The class attribute precision must be overwritten in child classes. The default value reflects fp32 training.
    """

    precision: _PRECISION_INPUT = "32-true"

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Convert the module parameters to the precision type this plugin handles."""
        return module

    def tensor_init_context(self) -> ContextManager:
        """Controls how tensors get created (device, dtype)."""
        return nullcontext()

    def module_init_context(self) -> ContextManager:
        """Instantiate module parameters or tensors in the precision type this plugin handles."""
        return nullcontext()

    def forward_context(self) -> ContextManager:
        """A contextmanager for managing model forward/training_step/evaluation_step/predict_step."""
        return nullcontext()

    def convert_output(self, data: Any) -> Any:
        """Convert outputs to the floating point precision type expected after model's forward."""
        return data


class HalfPrecision(Precision):
    """Plugin for training or inference with half-precision weights: ``"bf16-true"`` or ``"16-true"``."""

    def __init__(self, precision: Literal["bf16-true", "16-true"] = "16-true") -> None:
        self.precision = precision
        self._desired_input_dtype = torch.bfloat16 if precision == "bf16-true" else torch.float16

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._desired_input_dtype)

    def tensor_init_context(self) -> ContextManager:
        return default_dtype(self._desired_input_dtype)

    def module_init_context(self) -> ContextManager:
        return self.tensor_init_context()

    def forward_context(self) -> ContextManager:
        return default_dtype(self._desired_input_dtype)

    def convert_output(self, data: Any) -> Any:
        return tree_map(lambda t: _convert_fp_tensor(t, torch.get_default_dtype()), data)


class MixedPrecision(Precision):
    """Plugin for Automatic Mixed Precision (AMP): fp32 weights, half-precision compute."""

    def __init__(self, precision: Literal["bf16-mixed", "16-mixed"], device: str = "cpu") -> None:
        self.precision = precision
        self.device = device
        self._desired_dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16

    def forward_context(self) -> ContextManager:
        return torch.autocast(self.device, dtype=self._desired_dtype)

    def convert_output(self, data: Any) -> Any:
        return tree_map(lambda t: _convert_fp_tensor(t, torch.get_default_dtype()), data)


def _select_precision(precision: str) -> Precision:
    if precision in ("bf16-true", "16-true"):
        return HalfPrecision(precision)
    if precision in ("bf16-mixed", "16-mixed"):
        return MixedPrecision(precision)
    if precision in ("32-true", "32"):
        return Precision()
    raise ValueError(f"Precision {precision!r} is invalid. Allowed precision values: {_PRECISION_INPUT}")


class Fabric:
    """Fabric accelerates your PyTorch training or inference code with minimal changes required.

    Args:
        accelerator: only ``"cpu"`` and ``"auto"`` are supported here.
        devices: number of devices to use; only ``1``.
        precision: full precision (``"32-true"``), half precision
            (``"16-true"``, ``"bf16-true"``) or mixed precision (``"16-mixed"``, ``"bf16-mixed"``).
    """

    def __init__(
        self,
        accelerator: str = "auto",
        devices: int = 1,
        precision: Optional[_PRECISION_INPUT] = None,
    ) -> None:
        if devices != 1:
            raise ValueError("this Fabric runs on a single device")
        self._device = torch.device("cpu")
        self._precision_input = precision or get_default_supported_precision(training=False)
        self._precision = _select_precision(self._precision_input)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def precision(self) -> Precision:
        return self._precision

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print something only on the first process."""
        print(*args, **kwargs)

    @contextmanager
    def init_tensor(self) -> Iterator[None]:
        """Tensors that you instantiate under this context manager will be created on the device right away and
        have the right data type depending on the precision setting in Fabric."""
        with self._precision.tensor_init_context():
            yield

    @contextmanager
    def init_module(self, empty_init: Optional[bool] = None) -> Iterator[None]:
        """Instantiate the model and its parameters under this context manager to reduce peak memory usage.

        Args:
            empty_init: Whether to initialize the model with empty weights (uninitialized memory). On a
                single CPU device the weights are initialized normally; accepted for compatibility.
        """
        with self._precision.module_init_context():
            yield

    def setup_module(self, module: nn.Module, move_to_device: bool = True) -> nn.Module:
        """Set up a model for accelerated training or inference: precision conversion and device placement."""
        module = self._precision.convert_module(module)
        if move_to_device:
            module = module.to(self.device)
        return module

    def save(self, path: Union[str, Path], state: Dict[str, Any]) -> None:
        """Save checkpoint contents to a file: modules and optimizers are replaced by their state dicts."""
        converted = {
            k: v.state_dict() if isinstance(v, (nn.Module, torch.optim.Optimizer)) else v
            for k, v in state.items()
        }
        torch.save(converted, path)

    def load_raw(self, path: Union[str, Path], obj: nn.Module, strict: bool = True) -> None:
        """Load the state of a module from a raw checkpoint file (a state dict, not a Fabric checkpoint)."""
        state_dict = torch.load(path, mmap=True, weights_only=True)
        obj.load_state_dict(state_dict, strict=strict)

    def seed_everything(self, seed: int) -> int:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        return seed


def build_fabric_decode():
    """The litgpt recipe: module set up first, caches created under ``init_tensor`` and resized there."""
    from litgpt_kda.config import Config
    from litgpt_kda.model import GPT

    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    fabric.seed_everything(1234)
    config = Config.from_name("kimi-kda-tiny")
    with fabric.init_module(empty_init=True):
        model = GPT(config)
    model.eval()
    model = fabric.setup_module(model)
    with fabric.init_tensor():
        model.set_kv_cache(batch_size=2, ring_len=6)
    idx = torch.randint(0, config.padded_vocab_size, (2, 1))
    with fabric.precision.forward_context():
        logits = model(idx)
    return {"model": model, "logits": fabric.precision.convert_output(logits)}


def build_fabric_resume():
    """A bf16 decode whose rings are lengthened, and one resumed from a mid-decode checkpoint."""
    import tempfile

    from litgpt_kda.config import Config
    from litgpt_kda.model import GPT
    from litgpt_kda.utils import load_checkpoint

    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    fabric.seed_everything(1234)
    config = Config.from_name("kimi-kda-tiny")
    with fabric.init_module(empty_init=True):
        model = GPT(config)
    model = fabric.setup_module(model)
    with fabric.init_tensor():
        model.set_kv_cache(batch_size=2)
    idx = torch.randint(0, config.padded_vocab_size, (2, 1))
    for _ in range(2):
        idx = model(idx).argmax(-1)

    with tempfile.TemporaryDirectory() as tmp_dir:
        checkpoint_path = Path(tmp_dir) / "lit_model.pth"
        fabric.save(checkpoint_path, {"model": model})
        with fabric.init_module(empty_init=True):
            resumed = GPT(config)
        resumed = fabric.setup_module(resumed)
        with fabric.init_tensor():
            resumed.set_kv_cache(batch_size=2)
        load_checkpoint(fabric, resumed, checkpoint_path)

    with fabric.init_tensor():
        model.ring_len = 8
    return {"model": model, "resumed": resumed, "idx": idx}


def build_fabric_load_raw():
    """A bf16 decode paused, saved as a raw state dict and restored with ``fabric.load_raw``."""
    import tempfile

    from litgpt_kda.config import Config
    from litgpt_kda.model import GPT

    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    fabric.seed_everything(42)
    config = Config.from_name("kimi-kda-tiny-gqa")
    models = []
    for _ in range(2):
        with fabric.init_module(empty_init=True):
            model = GPT(config)
        model = fabric.setup_module(model)
        with fabric.init_tensor():
            model.set_kv_cache(batch_size=1)
        models.append(model)
    paused, resumed = models
    idx = torch.randint(0, config.padded_vocab_size, (1, 1))
    for _ in range(3):
        idx = paused(idx).argmax(-1)
    with tempfile.TemporaryDirectory() as tmp_dir:
        path = Path(tmp_dir) / "paused.pth"
        torch.save(paused.state_dict(), path)
        fabric.load_raw(path, resumed)
    return {"paused": paused, "resumed": resumed, "next": resumed(idx)}
