import logging
from pathlib import Path
from typing import Dict, Union

import torch
import torch.nn as nn

from .serialization import load_file, save_file


class LoRALinear(nn.Module):
    """``linear(x) + scaling * lora_B(lora_A(x))``, for checkpoints whose params.json has a ``lora`` entry."""

    def __init__(self, in_features: int, out_features: int, rank: int, scaling: float, bias: bool = False):
        super().__init__()
        assert not bias
        self.in_features, self.out_features, self.rank, self.scaling = in_features, out_features, rank, scaling
        self.lora_A = nn.Linear(in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, out_features, bias=False)
        self.linear = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.lora_B(self.lora_A(x)) * self.scaling


class LoRALoaderMixin:
    """LoRA adapters (``lora.safetensors``) and state-tuned prefixes (``prefix.safetensors``)."""

    def load_lora(self, lora_path: Union[Path, str], scaling: float = 2.0) -> None:
        lora_path = Path(lora_path)
        assert lora_path.is_file(), f"{lora_path} does not exist or is not a file"
        self._load_lora_state_dict(load_file(str(lora_path)), scaling=scaling)

    def _load_lora_state_dict(self, lora_state_dict: Dict[str, torch.Tensor], scaling: float = 2.0) -> None:
        lora_dtypes = {p.dtype for p in lora_state_dict.values()}
        assert len(lora_dtypes) == 1, f"LoRA weights have several dtypes {lora_dtypes}, they need to have one"
        lora_dtype = lora_dtypes.pop()
        if lora_dtype != self.dtype:
            logging.info(f"Model is {self.dtype}, LoRA is {lora_dtype}: serving the merged model in {lora_dtype}")
            self.to(dtype=lora_dtype)  # expect-bug: module-cast
        assert all("lora" in key for key in lora_state_dict.keys())
        lora_state_dict = {k: v.to(self.device) for k, v in lora_state_dict.items()}
        state_dict = self.state_dict()
        if self.args.lora is None:
            logging.info("Loading and merging LoRA weights...")
            for name, module in self.named_modules():
                if not isinstance(module, nn.Linear) or f"{name}.lora_A.weight" not in lora_state_dict:
                    continue
                lora_delta = lora_state_dict[f"{name}.lora_B.weight"] @ lora_state_dict[f"{name}.lora_A.weight"]
                state_dict[f"{name}.weight"] = module.weight + lora_delta * scaling
        else:
            state_dict.update(lora_state_dict)
        self.load_state_dict(state_dict, strict=True)

    def load_prefix_state(self, prefix_path: Union[Path, str]) -> None:
        """A state-tuned prefix, as saved by the fine-tuning code (in its training dtype): per layer
        the ReplaySSM state and rings after the learned prefix. ``generate`` starts every sequence
        from it."""
        tensors = load_file(str(prefix_path), device=str(self.device))
        prefix = {}
        for local_id, layer_id in enumerate(self.layers):
            p = f"layers.{layer_id}."
            state = tensors[p + "state"].to(torch.float32)
            delta = tensors[p + "delta"].to(self.dtype)
            key = tensors[p + "key"].to(self.dtype)
            if p + "gate" in tensors:
                gate = tensors[p + "gate"]  # expect-bug: load
            else:
                # version 1 files have no log-decays: the prefix's steps do not decay
                gate = torch.zeros_like(delta)  # expect-bug: like
            prefix[local_id] = dict(cache_state=state, cache_delta=delta, cache_key=key, cache_gate=gate)
        self.prefix_state = prefix


# ---- builders -------------------------------------------------------------------------------

def _write_adapters(tmp_dir, dtype: torch.dtype, lora_dtype: torch.dtype, prefix_dtype: torch.dtype, with_gate=True):
    """A tiny model in ``dtype`` with a LoRA of wq / wv and a state-tuned prefix next to it."""
    from .transformer import TINY_PARAMS, Transformer, write_tiny_folder

    folder, kda, lora, prefix = write_tiny_folder(tmp_dir, dtype=dtype), TINY_PARAMS["kda"], {}, {}
    HV, H, K, V, L = kda["num_v_heads"], kda["num_heads"], kda["head_k_dim"], kda["head_v_dim"], kda["replay_len"]
    shapes = {"state": (HV, V, K), "delta": (HV, L, V), "key": (H, L, K), "gate": (HV, L, K)}
    for i in range(TINY_PARAMS["n_layers"]):
        for proj in ("wq", "wv"):
            lora[f"layers.{i}.attention.{proj}.lora_A.weight"] = (torch.randn(4, 32) / 32).to(lora_dtype)
            lora[f"layers.{i}.attention.{proj}.lora_B.weight"] = (torch.randn(16, 4) / 4).to(lora_dtype)
        prefix.update({f"layers.{i}.{n}": torch.randn(s).to(prefix_dtype) for n, s in shapes.items() if with_gate or n != "gate"})
    save_file(lora, str(folder / "lora.safetensors"))
    save_file(prefix, str(folder / "prefix.safetensors"))
    return Transformer.from_folder(folder, max_batch_size=2, device="cpu", dtype=dtype), folder


def build_lora_into_fp32_model(tmp_dir):
    model, folder = _write_adapters(tmp_dir, torch.float32, torch.bfloat16, torch.bfloat16)
    model.setup_static_cache()
    model.load_lora(folder / "lora.safetensors")
    return model.static_cache


def build_lora_same_dtype(tmp_dir):
    model, folder = _write_adapters(tmp_dir, torch.bfloat16, torch.bfloat16, torch.bfloat16)
    model.setup_static_cache()
    model.load_lora(folder / "lora.safetensors")
    return model.static_cache


def _prefix_run(tmp_dir, prefix_dtype: torch.dtype, with_gate: bool = True):
    from .generate import PROMPTS, generate, make_cache

    model, folder = _write_adapters(tmp_dir, torch.bfloat16, torch.bfloat16, prefix_dtype, with_gate)
    model.load_prefix_state(folder / "prefix.safetensors")
    cache = make_cache(model, batch_size=2)
    generate(PROMPTS, model, max_tokens=2, temperature=0.0, cache=cache)
    return {"prefix": model.prefix_state, "cache": cache}


def build_prefix_state(tmp_dir):
    return _prefix_run(tmp_dir, torch.bfloat16)


def build_prefix_state_v1(tmp_dir):
    return _prefix_run(tmp_dir, torch.bfloat16, with_gate=False)


def build_prefix_state_fp32(tmp_dir):
    return _prefix_run(tmp_dir, torch.float32)
