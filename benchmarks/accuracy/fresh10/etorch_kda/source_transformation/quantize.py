"""Quantization recipes keyed by ``--quantization_mode`` ("8da4w") or a dtype recipe ("fp16", "bf16")."""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ..llama_transformer import Transformer, decode_steps
from ..model_args import ModelArgs


@dataclass(frozen=True)
class QuantRecipe:
    linear: Optional[str] = None  # "8da4w": int8 dynamic activations, int4 grouped weights
    dtype: Optional[torch.dtype] = None  # whole-model cast
    cache_dtype: Optional[torch.dtype] = None  # caches of the exported method
    group_size: int = 8


QUANT_RECIPES: Dict[str, QuantRecipe] = {
    "8da4w": QuantRecipe(linear="8da4w"),
    "fp16": QuantRecipe(dtype=torch.float16, cache_dtype=torch.float16),
    "bf16": QuantRecipe(dtype=torch.bfloat16, cache_dtype=torch.bfloat16),
}


@torch.no_grad()
def _fake_quantize_8da4w(module: nn.Module, group_size: int) -> None:
    """int4 weights in groups of ``group_size``, kept dequantized (the delegate re-packs them)."""
    for linear in (m for m in module.modules() if isinstance(m, nn.Linear) and m.in_features % group_size == 0):
        grouped = linear.weight.float().view(linear.out_features, -1, group_size)
        scales = grouped.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 7.0
        linear.weight.copy_(((grouped / scales).round().clamp(-8, 7) * scales).view_as(linear.weight))


def quantize(model: nn.Module, qmode: str) -> nn.Module:
    recipe = QUANT_RECIPES[qmode]
    if recipe.linear == "8da4w":
        _fake_quantize_8da4w(model, recipe.group_size)
    if recipe.dtype is not None:
        # fp16 through .half() so that the fp16 partitioner sees half tensors everywhere
        model = model.half() if recipe.dtype is torch.float16 else model.to(dtype=recipe.dtype)  # expect-bug: module-cast id=recipe-cast
    return model


def cache_dtypes(qmode: Optional[str], dtype: torch.dtype) -> Tuple[torch.dtype, torch.dtype]:
    """(ring, log-gate ring) dtypes of the exported cache under a recipe."""
    recipe = QUANT_RECIPES.get(qmode or "", QuantRecipe())
    return recipe.cache_dtype or dtype, recipe.cache_dtype or torch.float32  # expect-bug: imported-policy id=gate-recipe


def build_quantized_models():
    """The 8da4w recipe applied and stepped, and the fp16 recipe on an eager model."""
    torch.manual_seed(0)
    w4 = quantize(Transformer(ModelArgs()), "8da4w")
    decode_steps(w4, 2)
    return {"8da4w": w4, "fp16": quantize(Transformer(ModelArgs()), "fp16")}
