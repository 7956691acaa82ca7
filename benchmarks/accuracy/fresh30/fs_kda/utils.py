"""Grab-bag helpers, as in ``fairseq/utils.py``."""

import argparse
import contextlib
import logging
import uuid
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)

# ``--ring-dtype``-style strings, and the names ``str(dtype)`` writes, to torch dtypes.
_DTYPE_NAMES: Dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
}


def str_to_dtype(name: Optional[str]) -> Optional[torch.dtype]:
    """``"bf16"``, ``"bfloat16"`` or ``"torch.bfloat16"`` -> ``torch.bfloat16``; None stays None."""
    if name is None or isinstance(name, torch.dtype):
        return name
    key = name.lower().rsplit(".", 1)[-1]
    if key not in _DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}")
    return _DTYPE_NAMES[key]


def dtype_to_str(dtype: torch.dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def model_dtype(args: argparse.Namespace) -> torch.dtype:
    """The dtype the ``--fp16``/``--bf16``/``--memory-efficient-*`` flags ask the model to run in."""
    if getattr(args, "bf16", False) or getattr(args, "memory_efficient_bf16", False):
        return torch.bfloat16
    if getattr(args, "fp16", False) or getattr(args, "memory_efficient_fp16", False):
        return torch.float16
    return torch.float32


@contextlib.contextmanager
def torch_default_dtype(dtype: Optional[torch.dtype]) -> Iterator[None]:
    """Temporarily changes ``torch.get_default_dtype()``; ``None`` leaves it alone."""
    if dtype is None:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def apply_to_sample(f: Callable[[torch.Tensor], Any], sample: Any) -> Any:
    """Applies ``f`` to every tensor of a nested sample (dicts, lists, tuples, sets)."""
    if hasattr(sample, "__len__") and len(sample) == 0:
        return {}

    def _apply(x: Any) -> Any:
        if torch.is_tensor(x):
            return f(x)
        elif isinstance(x, OrderedDict):
            od = OrderedDict((key, _apply(value)) for key, value in x.items())
            od.__dict__ = x.__dict__
            return od
        elif isinstance(x, dict):
            return {key: _apply(value) for key, value in x.items()}
        elif isinstance(x, list):
            return [_apply(x) for x in x]
        elif isinstance(x, tuple):
            return tuple(_apply(x) for x in x)
        elif isinstance(x, set):
            return {_apply(x) for x in x}
        else:
            return x

    return _apply(sample)


def move_to_cuda(sample: Any, device: Optional[torch.device] = None) -> Any:
    device = device or (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))

    def _move_to_cuda(tensor: torch.Tensor) -> torch.Tensor:
        # non_blocking is ignored if tensor is not pinned, so we can always set
        # to True (see github.com/PyTorchLightning/pytorch-lightning/issues/620)
        return tensor.to(device=device, non_blocking=True)

    return apply_to_sample(_move_to_cuda, sample)


def move_to_cpu(sample: Any) -> Any:
    def _move_to_cpu(tensor: torch.Tensor) -> torch.Tensor:
        # PyTorch has poor support for half tensors (float16) on CPU.
        # Move any such tensors to float32.
        if tensor.dtype in {torch.bfloat16, torch.float16}:
            tensor = tensor.to(dtype=torch.float32)
        return tensor.cpu()

    return apply_to_sample(_move_to_cpu, sample)


# --- incremental state (fairseq/incremental_decoding_utils.py) ---------------------------
#
# ``incremental_state`` is one flat dict per sequence batch, shared by every module of a
# decoder; each module stores its entries under ``"<its uuid>.<key>"`` so layers never see each
# other's buffers. Beam search reorders it in place through ``reorder_incremental_state``.


class FairseqIncrementalState(object):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.init_incremental_state()

    def init_incremental_state(self):
        self._incremental_state_id = str(uuid.uuid4())

    def _get_full_incremental_state_key(self, key: str) -> str:
        return "{}.{}".format(self._incremental_state_id, key)

    def get_incremental_state(
        self,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        key: str,
    ) -> Optional[Dict[str, Optional[Tensor]]]:
        """Helper for getting incremental state for an nn.Module."""
        full_key = self._get_full_incremental_state_key(key)
        if incremental_state is None or full_key not in incremental_state:
            return None
        return incremental_state[full_key]

    def set_incremental_state(
        self,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
        key: str,
        value: Dict[str, Optional[Tensor]],
    ) -> Optional[Dict[str, Dict[str, Optional[Tensor]]]]:
        """Helper for setting incremental state for an nn.Module."""
        if incremental_state is not None:
            full_key = self._get_full_incremental_state_key(key)
            incremental_state[full_key] = value
        return incremental_state


def with_incremental_state(cls):
    cls.__bases__ = (FairseqIncrementalState,) + tuple(
        b for b in cls.__bases__ if b != FairseqIncrementalState
    )
    return cls


def get_incremental_state(
    module: Any,
    incremental_state: Optional[Dict[str, Dict[str, Optional[torch.Tensor]]]],
    key: str,
) -> Optional[Dict[str, Optional[torch.Tensor]]]:
    """Helper for getting incremental state for an nn.Module."""
    return module.get_incremental_state(incremental_state, key)


def set_incremental_state(
    module: Any,
    incremental_state: Optional[Dict[str, Dict[str, Optional[torch.Tensor]]]],
    key: str,
    value: Dict[str, Optional[torch.Tensor]],
) -> Optional[Dict[str, Dict[str, Optional[torch.Tensor]]]]:
    """Helper for setting incremental state for an nn.Module."""
    if incremental_state is not None:
        result = module.set_incremental_state(incremental_state, key, value)
        if result is not None:
            incremental_state = result
    return incremental_state


def item(tensor: Any) -> Any:
    if hasattr(tensor, "item"):
        return tensor.item()
    if hasattr(tensor, "__getitem__"):
        return tensor[0]
    return tensor


def log_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return F.log_softmax(x.float(), dim=dim, dtype=torch.float32)


def parse_overrides(text: Optional[str]) -> Dict[str, Any]:
    """``--model-overrides "{'max_slots': 2}"`` -> a dict (fairseq evaluates the string too)."""
    if not text:
        return {}
    overrides = eval(text, {"__builtins__": {}}, {})
    if not isinstance(overrides, dict):
        raise ValueError(f"--model-overrides must be a dict, got {text!r}")
    return overrides


def merge_args(*namespaces: Optional[argparse.Namespace]) -> argparse.Namespace:
    """Later namespaces win (``merge_args(model_args, cli_args)``), except where they hold None."""
    merged: Dict[str, Any] = {}
    for i, ns in enumerate(namespaces):
        if ns is None:
            continue
        for key, value in vars(ns).items():
            if value is not None or i == 0 or key not in merged:
                merged[key] = value
    return argparse.Namespace(**merged)
