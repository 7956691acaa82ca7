"""Weight-only int8 quantization of the linear layers (``quantize()`` writes ``model<label>int8.pth``
next to the checkpoint), and the ReplaySSM cache dtypes of a quantized model."""
import logging
import time
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)


def quantize_per_channel_int8(w: Tensor) -> Tuple[Tensor, Tensor]:
    """Symmetric int8 per output channel; the scales keep ``w``'s dtype."""
    amax = w.abs().amax(dim=1).clamp(min=1e-6)
    scales = amax / 127.0
    q = torch.clamp(torch.round(w / scales[:, None]), -128, 127).to(torch.int8)
    return q, scales


def replay_cache_dtypes(quant_mode: Optional[str], dtype: torch.dtype) -> Tuple[torch.dtype, torch.dtype]:
    """dtypes of the ReplaySSM rings (d/k, gate) of a model converted with ``quant_mode`` (None:
    not quantized) whose layers compute in ``dtype``."""
    if quant_mode == "int8":
        # the int8 decode path dequantizes into the scales' dtype and reads the rings in it
        return dtype, dtype  # expect-bug: imported-policy id=int8-rings
    return dtype, torch.float32


def replace_linear_weight_only_int8_per_channel(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, WeightOnlyInt8Linear(child.in_features, child.out_features))
        else:
            replace_linear_weight_only_int8_per_channel(child)


class WeightOnlyInt8QuantHandler:
    def __init__(self, mod: nn.Module):
        self.mod = mod

    @torch.no_grad()
    def create_quantized_state_dict(self) -> Dict[str, Tensor]:
        cur_state_dict = self.mod.state_dict()
        for fqn, mod in self.mod.named_modules():
            if isinstance(mod, nn.Linear):
                int8_weight, scales = quantize_per_channel_int8(mod.weight.float())
                cur_state_dict[f"{fqn}.weight"] = int8_weight
                cur_state_dict[f"{fqn}.scales"] = scales.to(mod.weight.dtype)
        return cur_state_dict

    def convert_for_runtime(self) -> nn.Module:
        replace_linear_weight_only_int8_per_channel(self.mod)
        return self.mod


class WeightOnlyInt8Linear(nn.Module):
    __constants__ = ["in_features", "out_features"]

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros((out_features, in_features), dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.bfloat16))

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight.to(dtype=input.dtype)) * self.scales


def quantize(checkpoint_path: Path, mode: str = "int8", label: str = "") -> Path:
    assert checkpoint_path.is_file(), checkpoint_path
    from .model import Transformer

    precision = torch.bfloat16
    logger.info("Loading model ...")
    t0 = time.time()
    with torch.device("meta"):
        model = Transformer.from_name(checkpoint_path.parent.name)
    checkpoint = torch.load(str(checkpoint_path), mmap=True, weights_only=True)
    model.load_state_dict(checkpoint, assign=True)
    model = model.to(dtype=precision, device="cpu")
    if mode != "int8":
        raise ValueError(f"Invalid quantization mode {mode} needs to be one of [int8]")
    logger.info("Quantizing model weights for int8 weight-only symmetric per-channel quantization")
    quantized_state_dict = WeightOnlyInt8QuantHandler(model).create_quantized_state_dict()
    quantize_path = checkpoint_path.parent / checkpoint_path.name.replace(".pth", f"{label}int8.pth")
    logger.info(f"Writing quantized weights to {quantize_path}")
    torch.save(quantized_state_dict, quantize_path)
    logger.info(f"Quantization complete took {time.time() - t0:.02f} seconds")
    return quantize_path
