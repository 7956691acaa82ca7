# Weight-only int8 quantization and cache conversions, after gpt-fast's quantize.py.
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import KDACache, KVCache, Transformer


def dynamically_quantize_per_channel(x, quant_min, quant_max, target_dtype):
    # assumes symmetric quantization, axis == 0, dense memory format
    eps = torch.finfo(torch.float32).eps
    min_val, max_val = torch.aminmax(x, dim=1)
    max_val_pos = torch.max(-torch.min(min_val, torch.zeros_like(min_val)), torch.max(max_val, torch.zeros_like(max_val)))
    scales = torch.clamp(max_val_pos / (float(quant_max - quant_min) / 2), min=eps).to(x.dtype)
    quant = torch.clamp(torch.round(x / scales.unsqueeze(-1)), quant_min, quant_max).to(target_dtype)
    return quant, scales, torch.zeros(min_val.size(), dtype=torch.int64, device=x.device)


def log_decay_dtype(mode: Optional[str]) -> torch.dtype:
    """dtype of the KDA log-decay caches for a quantization mode (read by generate.py)."""
    if mode in ("int4", "int4-gptq"):
        # the tinygemm int4 path runs bf16 end to end; its caches follow
        return torch.bfloat16  # expect-bug: imported-policy
    return torch.float32


def replace_linear_weight_only_int8_per_channel(module):
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, WeightOnlyInt8Linear(child.in_features, child.out_features))
        else:
            replace_linear_weight_only_int8_per_channel(child)


class WeightOnlyInt8QuantHandler:
    def __init__(self, mod):
        self.mod = mod

    @torch.no_grad()
    def create_quantized_state_dict(self):
        cur_state_dict = self.mod.state_dict()
        for fqn, mod in self.mod.named_modules():
            if isinstance(mod, torch.nn.Linear):
                int8_weight, scales, _ = dynamically_quantize_per_channel(mod.weight.float(), -128, 127, torch.int8)
                cur_state_dict[f"{fqn}.weight"] = int8_weight
                cur_state_dict[f"{fqn}.scales"] = scales.to(mod.weight.dtype)
        return cur_state_dict

    def convert_for_runtime(self):
        replace_linear_weight_only_int8_per_channel(self.mod)
        return self.mod


class WeightOnlyInt8Linear(torch.nn.Module):
    __constants__ = ["in_features", "out_features"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros((out_features, in_features), dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.bfloat16))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight.to(dtype=input.dtype)) * self.scales


class Fp8CacheQuantHandler:
    """Stores the KV caches and the KDA delta/key rings in float8 (e4m3), halving cache memory
    at long context. Run after ``setup_caches``; the decode kernels dequantize on load."""

    def __init__(self, mod: Transformer, fp8_dtype: torch.dtype = torch.float8_e4m3fn):
        self.mod, self.fp8_dtype = mod, fp8_dtype
        self.act_dtype = mod.output.weight.dtype

    def convert_for_runtime(self):
        for m in self.mod.modules():
            if isinstance(m, KVCache):
                m.k_cache, m.v_cache = m.k_cache.to(self.fp8_dtype), m.v_cache.to(self.fp8_dtype)
            elif isinstance(m, KDACache):
                m.d_cache, m.k_cache = m.d_cache.to(self.fp8_dtype), m.k_cache.to(self.fp8_dtype)
                # 3 mantissa bits are too coarse for log-decays: keep them at activation precision
                m.g_cache = m.g_cache.to(self.act_dtype)  # expect-bug: cast
        return self.mod


def quantize(checkpoint_path: Path, mode: str = "int8") -> Path:
    with torch.device("meta"):
        model = Transformer.from_name(checkpoint_path.parent.name)
    model.load_state_dict(torch.load(str(checkpoint_path), mmap=True, weights_only=True), assign=True)
    model = model.to(dtype=torch.bfloat16, device="cpu")
    assert mode == "int8", "only int8 weight-only quantization in this port"
    quantize_path = checkpoint_path.parent / checkpoint_path.name.replace(".pth", f"_{mode}.pth")
    torch.save(WeightOnlyInt8QuantHandler(model).create_quantized_state_dict(), quantize_path)
    return quantize_path


def build_int8_weights(tmp_dir):
    from .generate import _load_model, _write_checkpoint, generate

    model = _load_model(quantize(_write_checkpoint(tmp_dir), "int8"), "cpu", torch.bfloat16, use_tp=False)
    generate(model, torch.arange(3, dtype=torch.int), 2, batch_size=2, gate_dtype=log_decay_dtype("int8"), temperature=0.8, top_k=20)
    return model


def build_fp8_caches():
    model = Transformer.from_name("kda-tiny").to(dtype=torch.bfloat16)
    model.setup_caches(max_batch_size=2, max_seq_length=16)
    return Fp8CacheQuantHandler(model).convert_for_runtime()
