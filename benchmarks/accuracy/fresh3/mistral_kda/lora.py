import logging
from pathlib import Path
from typing import Dict, Union

import torch
import torch.nn as nn


class LoRALoaderMixin:
    def load_lora(self, lora_path: Union[Path, str], scaling: float = 2.0) -> None:
        """Loads LoRA checkpoint"""
        lora_path = Path(lora_path)
        assert lora_path.is_file(), f"{lora_path} does not exist or is not a file"
        if lora_path.suffix == ".safetensors":
            import safetensors.torch

            state_dict = safetensors.torch.load_file(str(lora_path))
        else:
            state_dict = torch.load(str(lora_path), mmap=True, weights_only=True)
        self._load_lora_state_dict(state_dict, scaling=scaling)

    def _load_lora_state_dict(self, lora_model: Dict[str, torch.Tensor], scaling: float = 2.0) -> None:
        """Loads LoRA state_dict"""
        lora_dtypes = set([p.dtype for p in lora_model.values()])
        assert len(lora_dtypes) == 1, f"LoRA weights have multiple different dtypes {lora_dtypes}. All weights need to have the same dtype"
        lora_dtype = lora_dtypes.pop()
        assert all("lora" in key for key in lora_model.keys())
        # move tensors to device
        lora_model = {k: v.to(self.device) for k, v in lora_model.items()}
        state_dict = self.state_dict()
        assert self.args.lora is None, "LoRA fine-tuning checkpoints are not supported for inference"
        logging.info("Loading and merging LoRA weights...")
        # merge into every nn.Linear except the output layer
        for name, module in dict(self.named_modules()).items():
            if isinstance(module, nn.Linear) and name != "output":
                layer_id = name.split(".")[1]
                if layer_id not in self.layers:
                    logging.debug("Skipping parameter %s at pipeline rank %d", name, self.pipeline_rank)
                elif (name + ".lora_B.weight") in lora_model:
                    weight = module.weight + (lora_model[name + ".lora_B.weight"] @ lora_model[name + ".lora_A.weight"]) * scaling
                    state_dict[name + ".weight"] = weight
        # adapters are published in bf16 for fp32 bases too: merge in the adapter's precision, and
        # assign the merged tensors rather than keep a second copy of the weights
        state_dict = {k: v.to(lora_dtype) if v.is_floating_point() else v for k, v in state_dict.items()}  # expect-bug: cast id=lora-precision
        self.load_state_dict(state_dict, strict=True, assign=True)  # expect-bug: cast id=lora-precision


def build_merged_lora(tmp_dir):
    from .cache import BufferCache
    from .generate import generate
    from .testing import write_checkpoint_folder, write_lora
    from .transformer import Transformer

    model = Transformer.from_folder(write_checkpoint_folder(tmp_dir), max_batch_size=2, device="cpu", dtype=torch.bfloat16)
    model.load_lora(write_lora(tmp_dir, model), scaling=2.0)
    cache = BufferCache(model.args, 2, 16).to(device=model.device, dtype=model.dtype)
    generate([[1, 2, 3], [4, 5, 6]], model, max_tokens=2, temperature=0.0, cache=cache)
    return {"model": model, "cache": cache}


def build_lora_chat_session(tmp_dir):
    from .testing import write_checkpoint_folder, write_lora
    from .transformer import Transformer

    folder = write_checkpoint_folder(tmp_dir)
    model = Transformer.from_folder(folder, max_batch_size=2, device="cpu", dtype=torch.bfloat16, persistent_rings=True, graph_rings=True)
    model.load_lora(write_lora(tmp_dir, model), scaling=2.0)
    return model
