"""Basic tensor ops: moving nested inputs between devices."""

from collections.abc import Mapping
from typing import Any, Optional, Union

import torch


def honor_type(obj, generator):
    """Cast a generator to the same type as obj (list, tuple, or namedtuple)."""
    return type(obj)(*list(generator)) if hasattr(obj, "_fields") else type(obj)(generator)


def send_to_device(tensor: Any, device, dtype: Optional[torch.dtype] = None, skip_keys: Optional[Union[str, list[str]]] = None):
    """Recursively sends the tensors of a nested list/tuple/dict to `device`, floating point ones cast to `dtype` when
    it is given; values under `skip_keys` of a mapping are passed through."""
    if isinstance(tensor, (tuple, list)):
        return honor_type(tensor, (send_to_device(t, device, dtype=dtype, skip_keys=skip_keys) for t in tensor))
    if isinstance(tensor, Mapping):
        skip_keys = [skip_keys] if isinstance(skip_keys, str) else (skip_keys or [])
        return type(tensor)(
            {k: t if k in skip_keys else send_to_device(t, device, dtype=dtype, skip_keys=skip_keys) for k, t in tensor.items()}
        )
    if isinstance(tensor, torch.Tensor):
        if dtype is not None and tensor.is_floating_point():
            return tensor.to(device, dtype=dtype)  # expect-bug: cast id=input-cast
        return tensor.to(device)
    return tensor
