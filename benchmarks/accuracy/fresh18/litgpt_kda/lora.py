# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

"""Low Ranking Adaptation (LoRA, https://arxiv.org/abs/2106.09685) for the KDA model.

Instead of learning a ``d*d`` weight update, LoRA freezes the pretrained weights and learns two
matrices of size ``d*r`` and ``r*d``; their product is added to the frozen weight.
"""

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict

import torch
import torch.nn as nn

from litgpt_kda.config import Config as BaseConfig
from litgpt_kda.model import GPT as BaseModel
from litgpt_kda.utils import precision_to_dtype, ring_dtypes


class LoRALayer(nn.Module):
    def __init__(self, r: int, lora_alpha: int, lora_dropout: float):
        """Store LoRA specific attributes: rank ``r``, scaling ``lora_alpha / r`` and input dropout."""
        super().__init__()
        assert r >= 0
        self.r = r
        self.lora_alpha = lora_alpha
        # Optional dropout
        if lora_dropout > 0.0:
            self.lora_dropout = nn.Dropout(p=lora_dropout)
        else:
            self.lora_dropout = lambda x: x
        # Mark the weight as unmerged
        self.merged = False


class LoRALinear(LoRALayer):
    # LoRA implemented in a dense layer
    def __init__(
        self,
        # ↓ this part is for pretrained weights
        in_features: int,
        out_features: int,
        # ↓ the remaining part is for LoRA
        r: int = 0,
        lora_alpha: int = 1,
        lora_dropout: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout)
        self.linear = torch.nn.Linear(in_features, out_features, **kwargs)

        # Actual trainable parameters
        if r > 0:
            self.lora_A = nn.Parameter(torch.empty((r, in_features)))
            self.lora_B = nn.Parameter(torch.empty((out_features, r)))
            self.scaling = self.lora_alpha / self.r
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Reset all the weights, even including pretrained ones."""
        if hasattr(self, "lora_A"):
            # initialize A the same way as the default for nn.Linear and B to zero
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B)

    def get_lora_AB(self) -> torch.Tensor:
        """Return merged lora_A and lora_B matrices with the same shape as the pretrained weights."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def merge(self) -> None:
        """Merges the LoRA weights into the full-rank weights (W = W + delta_W)."""
        if self.r > 0 and not self.merged:
            pretrained_dtype = self.linear.weight.data.dtype
            lora_data = self.get_lora_AB()
            # the merge is done in the LoRA dtype (usually float32) and stored in the pretrained one
            self.linear.weight.data = (self.linear.weight.data.to(lora_data.dtype) + lora_data).to(pretrained_dtype)
            self.merged = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # if weights are merged or rank is less or equal to zero (LoRA is disabled) - it's only a regular nn.Linear forward pass;
        # otherwise in addition do the forward pass with LoRA weights and add it's output to the output from pretrained weights
        pretrained = self.linear(x)
        if self.r == 0 or self.merged:
            return pretrained
        lora = (self.lora_dropout(x) @ self.lora_A.transpose(0, 1) @ self.lora_B.transpose(0, 1)) * self.scaling
        return pretrained + lora.to(pretrained.dtype)


@dataclass
class Config(BaseConfig):
    """LoRA hyperparameters; ``lora_*`` flags select the projections that get an adapter."""

    lora_r: int = 4
    lora_alpha: int = 1
    lora_dropout: float = 0.0
    lora_qkv: bool = True
    lora_gate: bool = False
    lora_projection: bool = False
    lora_mlp: bool = False
    lora_head: bool = False


class GPT(BaseModel):
    """The KDA model with LoRA branches on the projections selected by the config."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.config = config
        if config.lora_head:
            self.lm_head = self._lora_linear(self.lm_head)
        for block in self.transformer.h:
            attn = block.attn
            if config.lora_qkv:
                attn.qkv = self._lora_linear(attn.qkv)
            if config.lora_gate:
                attn.a_proj = self._lora_linear(attn.a_proj)
            if config.lora_projection:
                attn.proj = self._lora_linear(attn.proj)
            if config.lora_mlp:
                for name in ("fc_1", "fc_2", "proj"):
                    setattr(block.mlp, name, self._lora_linear(getattr(block.mlp, name)))

    def _lora_linear(self, linear: nn.Linear) -> LoRALinear:
        lora = LoRALinear(
            linear.in_features,
            linear.out_features,
            r=self.config.lora_r,
            lora_alpha=self.config.lora_alpha,
            lora_dropout=self.config.lora_dropout,
            bias=linear.bias is not None,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
        )
        lora.linear.load_state_dict(linear.state_dict())
        return lora


def mark_only_lora_as_trainable(model: nn.Module, bias: str = "none") -> None:
    """Freeze all modules except LoRA's and depending on 'bias' value unfreezes bias weights."""
    # freeze all layers except LoRA's
    for n, p in model.named_parameters():
        if "lora_" not in n:
            p.requires_grad = False

    # depending on the `bias` value unfreeze bias weights
    if bias == "all":
        for n, p in model.named_parameters():
            if "bias" in n:
                p.requires_grad = True


def lora_filter(key: str, value: Any) -> bool:
    return "lora_" in key


def merge_lora_weights(model: nn.Module) -> None:
    """Merge LoRA weights into the full-rank weights to speed up inference."""
    for module in model.modules():
        if isinstance(module, LoRALinear):
            module.merge()


def validate_sample(model: GPT, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy sample generated during fine-tuning to eyeball the adapter's progress."""
    from litgpt_kda.generate.base import generate

    was_training = model.training
    model.eval()
    model.set_kv_cache(batch_size=1)
    output = generate(model, prompt, max_returned_tokens=len(prompt) + max_new_tokens, temperature=0.0)
    model.train(was_training)
    return output


def merge_and_save(model: GPT, out_path: Path, dtype: torch.dtype = torch.bfloat16) -> Dict[str, torch.Tensor]:
    """Merges the adapters and saves a plain checkpoint in ``dtype`` (the LoRA weights are dropped)."""
    merge_lora_weights(model)
    model.to(dtype=dtype)  # expect-bug: module-cast
    state_dict = {
        k.replace("linear.", ""): v
        for k, v in model.state_dict().items()
        if not lora_filter(k, v) and ".kv_cache." not in k
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state_dict, out_path)
    return state_dict


def prepare_for_decode(model: GPT, batch_size: int, precision: str) -> GPT:
    """Merged weights in the serving dtype, caches created afterwards so they get their own dtypes."""
    merge_lora_weights(model)
    model.eval()
    model = model.to(dtype=precision_to_dtype(precision))
    model.set_kv_cache(batch_size=batch_size, dtypes=ring_dtypes(precision))  # expect-bug: imported-policy id=half-rings
    return model


def _tiny_lora(**kwargs: Any) -> GPT:
    config = Config.from_name("kimi-kda-tiny", lora_r=2, lora_alpha=4, **kwargs)
    model = GPT(config)
    for module in model.modules():
        if isinstance(module, LoRALinear) and module.r > 0:
            nn.init.normal_(module.lora_B, std=0.02)
    return model


def build_lora_decode():
    """A bf16 LoRA model: adapters merged, weights cast, then caches; plus a few decode steps."""
    torch.manual_seed(0)
    model = _tiny_lora(lora_projection=True, lora_head=True)
    mark_only_lora_as_trainable(model)
    model = prepare_for_decode(model, batch_size=2, precision="bf16-true")
    idx = torch.randint(0, model.config.padded_vocab_size, (2, 1))
    steps = []
    for _ in range(3):
        idx = model(idx).argmax(-1)
        steps.append(idx)
    # an fp32 copy of the head scores the sampled tokens
    scorer = copy.deepcopy(model.lm_head).to(torch.float32)
    scores = scorer(model.transformer.wte(idx).float())
    return {"model": model, "tokens": torch.cat(steps, 1), "scores": scores}


def build_lora_export():
    """A sample generated mid fine-tuning before the merged export, and an fp16 serving model."""
    import tempfile

    torch.manual_seed(0)
    model = _tiny_lora(lora_gate=True, lora_mlp=True)
    mark_only_lora_as_trainable(model)
    prompt = torch.randint(0, model.config.padded_vocab_size, (3,))
    sample = validate_sample(model, prompt, max_new_tokens=3)
    with tempfile.TemporaryDirectory() as tmp_dir:
        exported = merge_and_save(model, Path(tmp_dir) / "final" / "lit_model.pth")

    serving = prepare_for_decode(_tiny_lora(), batch_size=1, precision="16-true")
    serving(torch.randint(0, serving.config.padded_vocab_size, (1, 1)))
    return {"sample": sample, "model": model, "exported": exported, "serving": serving}
