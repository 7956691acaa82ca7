"""Padding and device helpers for batches of tensors (``speechbrain.utils.data_utils``)."""

from collections import namedtuple
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F

PaddedData = namedtuple("PaddedData", ["data", "lengths"])


def pad_right_to(tensor: torch.Tensor, target_shape: Sequence[int], mode: str = "constant", value: float = 0):
    """Pads every dimension on the right up to ``target_shape``; also returns the valid fractions."""
    assert len(target_shape) == tensor.ndim
    pads: List[int] = []
    valid_vals = []
    for i in reversed(range(len(target_shape))):
        assert target_shape[i] >= tensor.shape[i], "Target shape must be >= original shape for every dim"
        pads.extend([0, target_shape[i] - tensor.shape[i]])
        valid_vals.append(tensor.shape[i] / target_shape[i])
    return F.pad(tensor, pads, mode=mode, value=value), torch.tensor(valid_vals[::-1])


def batch_pad_right(tensors: List[torch.Tensor], mode: str = "constant", value: float = 0):
    """Stacks tensors of different lengths; returns the batch and the relative lengths."""
    if not len(tensors):
        raise IndexError("Tensors list must not be empty")
    if any(t.ndim != tensors[0].ndim for t in tensors[1:]):
        raise IndexError("All tensors must have same number of dimensions")
    max_shape = [max(t.shape[d] for t in tensors) for d in range(tensors[0].ndim)]
    padded = [pad_right_to(t, max_shape, mode=mode, value=value) for t in tensors]
    return torch.stack([p for p, _ in padded]), torch.stack([valid[0] for _, valid in padded])


def recursive_to(data: Any, device=None, dtype: Optional[torch.dtype] = None) -> Any:
    """Moves every tensor of a nested dict/list/tuple; ``dtype`` applies to floating tensors."""
    if isinstance(data, torch.Tensor):
        if dtype is not None and data.is_floating_point():
            return data.to(device=device, dtype=dtype)
        return data.to(device=device)
    if isinstance(data, Mapping):
        return {key: recursive_to(value, device, dtype) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(recursive_to(value, device, dtype) for value in data)
    return data


class PaddedBatch:
    """A collated batch: tensor keys become ``PaddedData(data, lengths)``, the others lists."""

    def __init__(self, examples: List[Dict[str, Any]]):
        for key in examples[0]:
            values = [example[key] for example in examples]
            setattr(self, key, PaddedData(*batch_pad_right(values)) if torch.is_tensor(values[0]) else values)
