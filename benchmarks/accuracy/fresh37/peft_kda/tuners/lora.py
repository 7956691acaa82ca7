"""LoRA: config, the ``Linear`` adapter layer and the tuner that injects it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from ..config import PeftConfig
from ..utils.constants import KDA_RING_NAMES, PeftType
from ..utils.other import ModulesToSaveWrapper, _get_submodules, iter_replay_caches
from .tuners_utils import BaseTuner, BaseTunerLayer


@dataclass
class LoraConfig(PeftConfig):
    r: int = field(default=8, metadata={"help": "Lora attention dimension"})
    target_modules: Optional[Union[List[str], str]] = field(
        default=None, metadata={"help": "Names (or a regex) of the modules to replace with LoRA layers."}
    )
    lora_alpha: int = field(default=8, metadata={"help": "Lora alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "Lora dropout"})
    modules_to_save: Optional[List[str]] = field(
        default=None, metadata={"help": "Modules besides the LoRA layers to be set as trainable and saved in the final checkpoint."}
    )
    init_lora_weights: bool = field(default=True, metadata={"help": "False: random lora_B as well (for tests)."})

    def __post_init__(self) -> None:
        self.peft_type = PeftType.LORA
        if isinstance(self.target_modules, (list, tuple)):
            self.target_modules = set(self.target_modules)


class LoraLayer(BaseTunerLayer):
    adapter_layer_names = ("lora_A", "lora_B")
    other_param_names = ("r", "lora_alpha", "scaling", "lora_dropout")

    def __init__(self, base_layer: nn.Module, **kwargs: Any) -> None:
        self.base_layer = base_layer
        self.r: Dict[str, int] = {}
        self.lora_alpha: Dict[str, int] = {}
        self.scaling: Dict[str, float] = {}
        self.lora_dropout = nn.ModuleDict({})
        self.lora_A = nn.ModuleDict({})
        self.lora_B = nn.ModuleDict({})
        self._disable_adapters = False
        self.merged_adapters = []
        self.in_features = base_layer.in_features
        self.out_features = base_layer.out_features

    def update_layer(self, adapter_name: str, r: int, lora_alpha: int, lora_dropout: float, init_lora_weights: bool) -> None:
        if r <= 0:
            raise ValueError(f"`r` should be a positive integer value but the value passed is {r}")
        self.r[adapter_name] = r
        self.lora_alpha[adapter_name] = lora_alpha
        self.lora_dropout.update(nn.ModuleDict({adapter_name: nn.Dropout(p=lora_dropout) if lora_dropout > 0.0 else nn.Identity()}))
        self.lora_A[adapter_name] = nn.Linear(self.in_features, r, bias=False)
        self.lora_B[adapter_name] = nn.Linear(r, self.out_features, bias=False)
        self.scaling[adapter_name] = lora_alpha / r
        self.reset_lora_parameters(adapter_name, init_lora_weights)
        self._move_adapter_to_device_of_base_layer(adapter_name)
        self.set_adapter(self.active_adapters)

    def reset_lora_parameters(self, adapter_name: str, init_lora_weights: bool) -> None:
        nn.init.kaiming_uniform_(self.lora_A[adapter_name].weight, a=math.sqrt(5))
        if init_lora_weights:
            nn.init.zeros_(self.lora_B[adapter_name].weight)
        else:
            nn.init.normal_(self.lora_B[adapter_name].weight, std=0.1)


class Linear(nn.Module, LoraLayer):
    """LoRA on an ``nn.Linear``."""

    def __init__(self, base_layer: nn.Module, adapter_name: str, r: int = 0, lora_alpha: int = 1, lora_dropout: float = 0.0,
                 init_lora_weights: bool = True, **kwargs: Any) -> None:
        super().__init__()
        LoraLayer.__init__(self, base_layer, **kwargs)
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, r, lora_alpha, lora_dropout, init_lora_weights)

    def get_delta_weight(self, adapter: str) -> torch.Tensor:
        weight_A = self.lora_A[adapter].weight.float()
        weight_B = self.lora_B[adapter].weight.float()
        return (weight_B @ weight_A * self.scaling[adapter]).to(self.get_base_layer().weight.dtype)

    def merge(self, safe_merge: bool = False, adapter_names: Optional[List[str]] = None) -> None:
        base_layer = self.get_base_layer()
        for active_adapter in adapter_names or self.active_adapters:
            if active_adapter not in self.lora_A:
                continue
            delta_weight = self.get_delta_weight(active_adapter)
            if safe_merge:
                merged = base_layer.weight.data.clone() + delta_weight
                if not torch.isfinite(merged).all():
                    raise ValueError(f"NaNs detected in the merged weights. The adapter {active_adapter} seems to be broken")
                base_layer.weight.data = merged
            else:
                base_layer.weight.data += delta_weight
            self.merged_adapters.append(active_adapter)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.disable_adapters or self.merged:
            return self.base_layer(x, *args, **kwargs)
        result = self.base_layer(x, *args, **kwargs)
        torch_result_dtype = result.dtype
        for active_adapter in self.active_adapters:
            if active_adapter not in self.lora_A:
                continue
            lora_A, lora_B = self.lora_A[active_adapter], self.lora_B[active_adapter]
            dropout, scaling = self.lora_dropout[active_adapter], self.scaling[active_adapter]
            h = self._cast_input_dtype(x, lora_A.weight.dtype)
            result = result + lora_B(lora_A(dropout(h))) * scaling
        return result.to(torch_result_dtype)


class LoraModel(BaseTuner):
    """Creates a LoRA model from a pretrained KDA model."""

    prefix: str = "lora_"

    def _create_and_replace(self, lora_config: LoraConfig, adapter_name: str, target: nn.Module, target_name: str, parent: nn.Module, current_key: str) -> None:
        kwargs = {
            "r": lora_config.r,
            "lora_alpha": lora_config.lora_alpha,
            "lora_dropout": lora_config.lora_dropout,
            "init_lora_weights": lora_config.init_lora_weights,
        }
        if isinstance(target, LoraLayer):
            target.update_layer(adapter_name, **kwargs)
            return
        if not isinstance(target, nn.Linear):
            raise ValueError(f"Target module {target} is not supported. Currently, only `torch.nn.Linear` is supported.")
        new_module = Linear(target, adapter_name, **kwargs)
        if adapter_name not in self.active_adapters:
            new_module.requires_grad_(False)
        self._replace_module(parent, target_name, new_module, target)

    @staticmethod
    def _replace_module(parent: nn.Module, child_name: str, new_module: nn.Module, child: nn.Module) -> None:
        setattr(parent, child_name, new_module)
        if hasattr(child, "base_layer"):
            child = child.base_layer
        weight = child.weight
        for name, module in new_module.named_modules():
            if "lora_" in name:
                module.to(weight.device)

    def _mark_only_adapters_as_trainable(self, model: nn.Module) -> None:
        for name, param in model.named_parameters():
            if self.prefix not in name:
                param.requires_grad = False

    def _cast_adapter_dtype(self, adapter_name: str, autocast_adapter_dtype: bool = True) -> None:
        """Upcasts bf16/fp16 adapter weights of ``adapter_name`` to float32 (the base model keeps its dtype)."""
        if not autocast_adapter_dtype:
            return
        for module in self.model.modules():
            if not isinstance(module, LoraLayer):
                continue
            for layer_name in module.adapter_layer_names:
                module_dict = getattr(module, layer_name)
                if adapter_name not in module_dict:
                    continue
                for param in module_dict[adapter_name].parameters():
                    if param.dtype in (torch.float16, torch.bfloat16):
                        param.data = param.data.to(torch.float32)

    def _unload_and_optionally_merge(self, merge: bool = True, safe_merge: bool = False, adapter_names: Optional[List[str]] = None,
                                     dtype: Optional[torch.dtype] = None) -> nn.Module:
        key_list = [key for key, _ in self.model.named_modules() if self.prefix not in key]
        for key in key_list:
            try:
                parent, target, target_name = _get_submodules(self.model, key)
            except AttributeError:
                continue
            if isinstance(target, LoraLayer):
                if merge:
                    target.merge(safe_merge=safe_merge, adapter_names=adapter_names)
                self._replace_module(parent, target_name, target.get_base_layer(), target)
            elif isinstance(target, ModulesToSaveWrapper):
                setattr(parent, target_name, target.modules_to_save[target.active_adapter])
        if dtype is not None:
            self._cast_merged_model(dtype)
        return self.model

    def _cast_merged_model(self, dtype: torch.dtype) -> None:
        """``merge_and_unload(dtype=...)``: the merged weights are cast for export, and warm replay
        caches are re-typed with them so that the exported model can serve them as they are."""
        for module in self.model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.to(dtype)
        for _, cache in iter_replay_caches(self.model):
            for name in KDA_RING_NAMES:
                cache._buffers[name] = cache._buffers[name].to(dtype)  # expect-bug: cast
        if hasattr(self.model, "config"):
            self.model.config.torch_dtype = str(dtype).removeprefix("torch.")

    def merge_and_unload(self, progressbar: bool = False, safe_merge: bool = False, adapter_names: Optional[List[str]] = None,
                         dtype: Optional[torch.dtype] = None) -> nn.Module:
        """Merges the LoRA layers into the base model and returns it (optionally cast to ``dtype``)."""
        return self._unload_and_optionally_merge(merge=True, safe_merge=safe_merge, adapter_names=adapter_names, dtype=dtype)


def _peft_model(dtype: torch.dtype, **lora_kwargs: Any):
    from ..mapping import get_peft_model
    from ..modeling_kda import KdaConfig, KdaForCausalLM

    torch.manual_seed(0)
    base = KdaForCausalLM(KdaConfig()).to(dtype)
    base.enable_replay_cache(2)
    config = LoraConfig(r=2, target_modules=["q_proj", "v_proj", "f_proj"], init_lora_weights=False, **lora_kwargs)
    return get_peft_model(base, config)


def build_merge_and_unload() -> Dict[str, Any]:
    """A bf16 model with LoRA on q/v/f and a head copy, decoding, merged, decoding on."""
    peft_model = _peft_model(torch.bfloat16, modules_to_save=["lm_head"])
    peft_model.generate(torch.tensor([[3, 5], [4, 6]]), max_new_tokens=2)
    merged = peft_model.merge_and_unload(safe_merge=True)
    tokens = merged.generate(torch.tensor([[2], [8]]), max_new_tokens=3)
    return {"caches": merged.replay_caches(), "tokens": tokens, "q_proj": merged.model.layers[0].self_attn.q_proj.weight}


def build_merge_and_unload_export() -> Dict[str, Any]:
    """A float32 model with LoRA, decoding, merged and cast to bf16 for export, decoding on."""
    peft_model = _peft_model(torch.float32)
    peft_model.generate(torch.tensor([[3, 5], [4, 6]]), max_new_tokens=2)
    merged = peft_model.merge_and_unload(dtype=torch.bfloat16)
    tokens = merged.generate(torch.tensor([[2], [8]]), max_new_tokens=3)
    return {"caches": merged.replay_caches(), "tokens": tokens}
