"""Module surgery, trainable-module wrappers and dtype helpers."""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .constants import DTYPE_ALIASES


def str_to_torch_dtype(value: Union[str, torch.dtype, None]) -> Optional[torch.dtype]:
    """``"bf16"``, ``"torch.bfloat16"``, ``torch.bfloat16`` -> ``torch.bfloat16``; ``None`` stays ``None``."""
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.")
    dtype = getattr(torch, DTYPE_ALIASES.get(name, name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"Unknown dtype {value!r}")
    return dtype


def dtype_to_str(dtype: Optional[torch.dtype]) -> Optional[str]:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _get_submodules(model: nn.Module, key: str) -> Tuple[nn.Module, nn.Module, str]:
    """``(parent, target, target_name)`` of the module at dotted path ``key``."""
    parent = model.get_submodule(".".join(key.split(".")[:-1]))
    target_name = key.split(".")[-1]
    target = model.get_submodule(key)
    return parent, target, target_name


def _is_replay_cache(module: nn.Module) -> bool:
    return bool(getattr(module, "_is_replay_cache", False))


def iter_replay_caches(model: nn.Module) -> Iterable[Tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if _is_replay_cache(module):
            yield name, module


class ModulesToSaveWrapper(nn.Module):
    """Keeps a trainable copy of ``module_to_save`` per adapter next to the frozen original."""

    def __init__(self, module_to_save: nn.Module, adapter_name: str) -> None:
        super().__init__()
        self.original_module = module_to_save
        self.modules_to_save = nn.ModuleDict({})
        self._active_adapter = adapter_name
        self._disable_adapters = False
        self.update(adapter_name)

    @property
    def active_adapter(self) -> str:
        return self._active_adapter

    @property
    def disable_adapters(self) -> bool:
        return self._disable_adapters

    def update(self, adapter_name: str) -> None:
        # deepcopy keeps dtypes and devices: a copy of a bf16 head is a bf16 head
        self.modules_to_save.update(nn.ModuleDict({adapter_name: copy.deepcopy(self.original_module)}))
        self.original_module.requires_grad_(False)
        if adapter_name == self.active_adapter:
            self.modules_to_save[adapter_name].requires_grad_(True)

    def set_adapter(self, adapter_name: str) -> None:
        if adapter_name not in self.modules_to_save:
            raise ValueError(f"Adapter {adapter_name} not found in {list(self.modules_to_save)}")
        self.modules_to_save[self.active_adapter].requires_grad_(False)
        self.modules_to_save[adapter_name].requires_grad_(True)
        self._active_adapter = adapter_name

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.disable_adapters or self.active_adapter not in self.modules_to_save:
            return self.original_module(*args, **kwargs)
        return self.modules_to_save[self.active_adapter](*args, **kwargs)


def _set_trainable(model: nn.Module, adapter_name: str, module_names: Optional[Sequence[str]]) -> None:
    """Wraps every module whose name ends with one of ``module_names`` in a ``ModulesToSaveWrapper``."""
    if not module_names:
        return
    key_list = [key for key, _ in model.named_modules()]
    for key in key_list:
        if not any(key == name or key.endswith(f".{name}") for name in module_names):
            continue
        parent, target, target_name = _get_submodules(model, key)
        if isinstance(target, ModulesToSaveWrapper):
            target.update(adapter_name)
            target.set_adapter(target.active_adapter)
        else:
            setattr(parent, target_name, ModulesToSaveWrapper(target, adapter_name))


def _set_adapter(model: nn.Module, adapter_name: str) -> None:
    for module in model.modules():
        if isinstance(module, ModulesToSaveWrapper) and adapter_name in module.modules_to_save:
            module.set_adapter(adapter_name)


def get_ring_dtypes_from_model(model: nn.Module, cache_dtype: Union[str, torch.dtype, None] = None) -> Dict[str, torch.dtype]:
    """Ring dtypes for serving ``model``.

    The rings follow ``cache_dtype`` (by default the model's dtype); the log-decay ring follows
    ``config.replay_gate_dtype`` where the checkpoint sets one.
    """
    dtype = str_to_torch_dtype(cache_dtype) or model.dtype
    gate_dtype = str_to_torch_dtype(getattr(model.config, "replay_gate_dtype", None)) or dtype  # expect-bug: imported-policy id=model-ring-dtypes
    return {"delta_ring": dtype, "key_ring": dtype, "log_decay_ring": gate_dtype}


def cast_mixed_precision_params(model: nn.Module, dtype: torch.dtype) -> None:
    """Casts frozen parameters and floating buffers to ``dtype`` for inference.

    Trainable parameters (the adapters) are kept in float32, and so are the buffers that a module
    lists in ``_keep_in_fp32_buffers`` (replay caches list their checkpoint and log-decay ring).
    """
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.float32)
        elif param.is_floating_point():
            param.data = param.data.to(dtype)
    for module in model.modules():
        keep = getattr(module, "_keep_in_fp32_buffers", ())
        for name, buf in list(module._buffers.items()):
            if buf is None or not buf.is_floating_point() or name in keep:
                continue
            module._buffers[name] = buf.to(dtype)


def cast_replay_cache(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Stores the replay rings of ``model`` in ``dtype`` (``float16`` on GPUs without bf16).

    The checkpoint state and the write positions keep their dtypes.
    """
    for _, cache in iter_replay_caches(model):
        for name, buf in list(cache.named_buffers(recurse=False)):
            if name.endswith("_ring"):
                cache._buffers[name] = buf.to(dtype)  # expect-bug: cast
    return model


def prepare_model_for_low_precision_serving(
    model: nn.Module,
    dtype: torch.dtype = torch.bfloat16,
    layer_norm_names: Sequence[str] = ("layernorm", "norm"),
    keep_in_fp32_modules: Optional[Sequence[str]] = None,
) -> nn.Module:
    """Casts ``model`` for serving in ``dtype``, leaf module by leaf module.

    The counterpart of ``prepare_model_for_kbit_training`` for inference: norms (and any module
    named in ``keep_in_fp32_modules``) are kept in float32, everything else goes to ``dtype``, and
    the model is frozen.
    """
    keep = tuple(layer_norm_names) + tuple(keep_in_fp32_modules or ())
    for param in model.parameters():
        param.requires_grad_(False)
    for name, module in model.named_modules():
        if next(module.children(), None) is not None:
            continue
        if any(part in name.split(".")[-1] for part in keep):
            module.to(torch.float32)
        else:
            module.to(dtype)  # expect-bug: module-cast
    if hasattr(model, "config"):
        model.config.torch_dtype = dtype_to_str(dtype)
    return model


def _tiny_warm_model(dtype: torch.dtype, num_slots: int = 2):
    from ..modeling_kda import KdaConfig, KdaForCausalLM

    torch.manual_seed(0)
    model = KdaForCausalLM(KdaConfig()).to(dtype)
    model.enable_replay_cache(num_slots)
    model.generate(torch.tensor([[3, 5, 7], [2, 4, 6]]), max_new_tokens=2, slot_mapping=torch.tensor([1, 0], dtype=torch.int32))
    return model


def build_prepare_for_fp16_serving() -> Dict[str, Any]:
    """A float32 model with a warm cache prepared for fp16 serving (GPUs without bf16), its replay
    rings moved to fp16 as well, then decoding on."""
    model = _tiny_warm_model(torch.float32)
    prepare_model_for_low_precision_serving(model, torch.float16)
    cast_replay_cache(model, torch.float16)
    tokens = model.generate(torch.tensor([[9], [8]]), max_new_tokens=3)
    return {"caches": model.replay_caches(), "tokens": tokens}


def build_mixed_precision_params() -> Dict[str, Any]:
    """A LoRA-wrapped float32 model with a warm cache cast for bf16 inference (adapters stay float32)."""
    from ..mapping import get_peft_model
    from ..tuners.lora import LoraConfig

    model = _tiny_warm_model(torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "f_proj"], init_lora_weights=False))
    cast_mixed_precision_params(peft_model, torch.bfloat16)
    tokens = peft_model.generate(torch.tensor([[4], [6]]), max_new_tokens=3)
    lora_a = peft_model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight
    return {"caches": peft_model.replay_caches(), "tokens": tokens, "lora_A": lora_a}
