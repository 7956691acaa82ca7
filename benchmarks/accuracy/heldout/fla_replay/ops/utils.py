"""dtype helpers of the ops package."""

import torch


def get_state_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the recurrent state is kept in: the activations' (or autocast's) dtype."""
    if torch.is_autocast_enabled():
        return torch.get_autocast_dtype("cuda")
    return x.dtype


def is_low_precision(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)
