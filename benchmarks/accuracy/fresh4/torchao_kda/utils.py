# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD 3-Clause license found in the
# LICENSE file in the root directory of this source tree.
import contextlib
from typing import Dict, Tuple

import torch

TORCH_VERSION_AT_LEAST_2_5 = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)

_DTYPE_STR_TO_TORCH = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}  # fmt: skip


def str_to_torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return _DTYPE_STR_TO_TORCH[dtype]


@contextlib.contextmanager
def torch_default_dtype(dtype):
    """Temporarily sets torch's default floating point dtype."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(str_to_torch_dtype(dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def replay_ring_dtypes(precision) -> Tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(delta ring, key ring, log-alpha ring) dtypes for a model running in ``precision``.

    The log-alpha ring is prefix-summed and exponentiated by the ReplaySSM kernel,
    so it is always float32.
    """
    precision = str_to_torch_dtype(precision)
    return precision, precision, torch.float32


def get_compute_dtype(precision) -> torch.dtype:
    """dtype of activations (and of everything the kernel reads in the activation dtype)."""
    return str_to_torch_dtype(precision)


def alloc_rings(shapes: Dict[str, Tuple[int, ...]], dtype, device="cpu") -> Dict[str, torch.Tensor]:
    return {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape in shapes.items()}  # expect-bug: pool-dtype id=host-rings


class TorchAOBaseTensor:
    """Minimal stand-in for torchao's tensor subclass base: keeps the inner tensors and
    knows how to get back a plain tensor."""

    tensor_data_names: Tuple[str, ...] = ()

    def dequantize(self, output_dtype=None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self):
        return f"{self.__class__.__name__}({', '.join(self.tensor_data_names)}, dtype={self.dtype})"


def get_model_size_in_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
