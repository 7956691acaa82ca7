"""Utility functions used throughout mcore_kda (cf. megatron/core/utils.py)."""

import contextlib
import logging
import math
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional

import torch

logger = logging.getLogger(__name__)

_DTYPE_FROM_STR: Dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def str_to_dtype(name: str) -> torch.dtype:
    """``"bf16"`` -> ``torch.bfloat16`` (the spellings accepted on the command line)."""
    try:
        return _DTYPE_FROM_STR[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPE_FROM_STR)}") from None


def ensure_divisibility(numerator: int, denominator: int) -> None:
    """Ensure that numerator is divisible by the denominator."""
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"


def divide(numerator: int, denominator: int) -> int:
    """Ensure that numerator is divisible by the denominator and return the division value."""
    ensure_divisibility(numerator, denominator)
    return numerator // denominator


def init_method_normal(sigma: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Init method based on N(0, sigma)."""

    def init_(tensor: torch.Tensor) -> torch.Tensor:
        return torch.nn.init.normal_(tensor, mean=0.0, std=sigma)

    return init_


def scaled_init_method_normal(sigma: float, num_layers: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Init method based on N(0, sigma/sqrt(2*num_layers))."""
    return init_method_normal(sigma / math.sqrt(2.0 * num_layers))


def get_attr_wrapped_model(model: Any, attr: str, allow_none: bool = True, return_model_obj: bool = False) -> Any:
    """Get an attribute from a model that may be wrapped (Float16Module, DDP, ...)."""
    if isinstance(model, list):
        raise RuntimeError("get_attr_wrapped_model does not support a list of models")
    while not hasattr(model, attr) or (not allow_none and getattr(model, attr) is None):
        if not hasattr(model, "module"):
            raise RuntimeError(f"couldn't find attribute {attr}")
        model = model.module
    if return_model_obj:
        return model
    return getattr(model, attr)


def get_model_config(model: torch.nn.Module):
    return get_attr_wrapped_model(model, "config", allow_none=False)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The innermost module under every ``.module`` wrapper."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def get_model_dtype(model: torch.nn.Module) -> torch.dtype:
    """dtype of the first floating point parameter of ``model``."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.get_default_dtype()


@contextlib.contextmanager
def torch_dtype_context(dtype: torch.dtype) -> Iterator[None]:
    """Make ``dtype`` the default floating point dtype inside the block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class KDACacheRecipe(NamedTuple):
    """dtypes of the KDA inference state: checkpoint state, delta ring, key ring, gate ring."""

    state: torch.dtype
    delta: torch.dtype
    key: torch.dtype
    gate: torch.dtype


KDA_CACHE_RECIPES: Dict[str, KDACacheRecipe] = {
    "fp32": KDACacheRecipe(torch.float32, torch.float32, torch.float32, torch.float32),
    "bf16": KDACacheRecipe(torch.float32, torch.bfloat16, torch.bfloat16, torch.float32),
    "fp16": KDACacheRecipe(torch.float32, torch.float16, torch.float16, torch.float32),
}
# Smallest footprint, for long-context serving with many slots per GPU.
KDA_CACHE_RECIPES["bf16-state"] = KDACacheRecipe(*(torch.bfloat16,) * 4)  # expect-bug: container id=recipe


def get_kda_cache_recipe(name: Optional[str]) -> Optional[KDACacheRecipe]:
    if name is None:
        return None
    if name not in KDA_CACHE_RECIPES:
        raise ValueError(f"unknown KDA cache recipe {name!r}; expected one of {sorted(KDA_CACHE_RECIPES)}")
    return KDA_CACHE_RECIPES[name]


def log_single_rank(target_logger: logging.Logger, *args: Any, rank: int = 0, **kwargs: Any) -> None:
    """Log on one rank only (there is one rank here)."""
    del rank
    target_logger.log(*args, **kwargs)
