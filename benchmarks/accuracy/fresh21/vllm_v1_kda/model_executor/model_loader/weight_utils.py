"""Weight loading helpers (vllm/model_executor/model_loader/weight_utils.py)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch
from torch import nn


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Default weight loader: copy into the parameter, which keeps its own dtype."""
    try:
        if param.numel() == 1 and loaded_weight.numel() == 1:
            # Sometimes scalar values aren't considered tensors with shapes
            # so if both param and loaded_weight are a scalar,
            # "broadcast" instead of copy
            param.data.fill_(loaded_weight.item())
        else:
            assert param.size() == loaded_weight.size(), (
                f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})"
            )
            param.data.copy_(loaded_weight)
    except Exception:
        # NOTE: This exception is added for the purpose of setting breakpoint to
        # debug weight loading issues.
        raise


def set_weight_attrs(weight: torch.Tensor, weight_attrs: dict[str, Any] | None) -> None:
    if weight_attrs is None:
        return
    for key, value in weight_attrs.items():
        assert not hasattr(weight, key), f"Overwriting existing tensor attribute: {key}"
        setattr(weight, key, value)


def pt_weights_iterator(hf_weights_files: list[str]) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Iterate over the weights in the model bin/pt files."""
    for bin_file in hf_weights_files:
        state = torch.load(bin_file, map_location="cpu", weights_only=True)
        yield from state.items()
        del state


def initialize_dummy_weights(model: nn.Module, low: float = -0.2, high: float = 0.2, seed: int = 1234) -> None:
    """Initialize model weights with random values, the same way on every run.

    Persistent buffers are in ``state_dict()`` and get filled too; the runtime state of the
    model (``persistent=False`` buffers) is left as it was created.
    """
    for param in model.state_dict().values():
        if torch.is_floating_point(param):
            generator = torch.Generator(device=param.data.device)
            generator.manual_seed(seed)
            if torch.finfo(param.data.dtype).bits < 16:
                # uniform_ doesn't support < 16-bit datatypes (FP8)
                tmp_param = torch.empty(param.data.shape, dtype=torch.float16, device=param.data.device)
                tmp_param = tmp_param.uniform_(low, high, generator=generator).to(param.data.dtype)
                param.data.copy_(tmp_param)
            else:
                param.uniform_(low, high, generator=generator)
