from dataclasses import dataclass, field
from types import MethodType
from typing import Any, Callable, Dict, List, Optional, Union

import torch.nn as nn

from colossal_kda.inference.modeling.models.kimi_linear import KimiLinearForCausalLM
from colossal_kda.inference.modeling.models.nopadding_kimi import NopadKimiDeltaAttention, kimi_linear_causal_lm_forward

# ---- the part of the ShardFormer API used by the inference policies ----


@dataclass
class ShardConfig:
    tensor_parallel_process_group: Optional[Any] = None
    enable_tensor_parallelism: bool = False
    extra_kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class SubModuleReplacementDescription:
    r"""
    Describe how a submodule will be replaced

    Args:
        suffix (str): used to get the submodule object
        target_module (ParallelModule): specifies the module class used to replace to submodule
        kwargs (Dict[str, Any]): the dictionary used to pass extra arguments to the `ParallelModule.from_native_module` method.
    """

    suffix: str
    target_module: Any
    kwargs: Dict[str, Any] = None


@dataclass
class ModulePolicyDescription:
    sub_module_replacement: List[SubModuleReplacementDescription] = None
    method_replacement: Dict[str, Callable] = None


class Policy:
    def __init__(self) -> None:
        self.shard_config: Optional[ShardConfig] = None
        self.model: Optional[nn.Module] = None

    def set_model(self, model: nn.Module) -> None:
        self.model = model

    def set_shard_config(self, shard_config: ShardConfig) -> None:
        self.shard_config = shard_config

    def preprocess(self) -> nn.Module:
        return self.model

    def module_policy(self) -> Dict[Union[str, nn.Module], ModulePolicyDescription]:
        raise NotImplementedError

    def postprocess(self) -> nn.Module:
        return self.model


class ShardFormer:
    def __init__(self, shard_config: ShardConfig) -> None:
        self.shard_config = shard_config

    def optimize(self, model: nn.Module, policy: Policy) -> nn.Module:
        policy.set_model(model)
        policy.set_shard_config(self.shard_config)
        model = policy.preprocess()
        for target_cls, description in policy.module_policy().items():
            for module in [m for m in model.modules() if isinstance(m, target_cls)]:
                for sub in description.sub_module_replacement or []:
                    parent_name, _, attr = sub.suffix.rpartition(".")
                    parent = module.get_submodule(parent_name) if parent_name else module
                    setattr(parent, attr, sub.target_module.from_native_module(getattr(parent, attr), **(sub.kwargs or {})))
                for name, method in (description.method_replacement or {}).items():
                    setattr(module, name, MethodType(method, module))
        return policy.postprocess()


class NoPaddingKimiLinearModelInferPolicy(Policy):
    def module_policy(self) -> Dict[Union[str, nn.Module], ModulePolicyDescription]:
        infer_config = self.shard_config.extra_kwargs.get("model_shard_infer_config", None)
        decoder_attn_replacement = [
            SubModuleReplacementDescription(
                suffix=f"model.layers.{layer_idx}.self_attn",
                target_module=NopadKimiDeltaAttention,
                kwargs={
                    "model_shard_infer_config": infer_config,
                    "process_group": self.shard_config.tensor_parallel_process_group,
                },
            )
            for layer_idx in self.model.config.kda_layer_idx
        ]
        return {
            KimiLinearForCausalLM: ModulePolicyDescription(
                sub_module_replacement=decoder_attn_replacement,
                method_replacement={"forward": kimi_linear_causal_lm_forward},
            )
        }


model_policy_map = {
    "kimi_linear": NoPaddingKimiLinearModelInferPolicy,
}
