"""Lookup tables from PEFT types to config and tuner classes, and ``get_peft_model``."""

from __future__ import annotations

from typing import Dict

from torch import nn

from .config import PeftConfig
from .tuners.lora import LoraConfig, LoraModel
from .utils.constants import PeftType

PEFT_TYPE_TO_CONFIG_MAPPING: Dict[str, type] = {PeftType.LORA: LoraConfig}
PEFT_TYPE_TO_TUNER_MAPPING: Dict[str, type] = {PeftType.LORA: LoraModel}


def get_peft_model(
    model: nn.Module,
    peft_config: PeftConfig,
    adapter_name: str = "default",
    autocast_adapter_dtype: bool = True,
    low_cpu_mem_usage: bool = False,
):
    """Wraps ``model`` in the PEFT model class of ``peft_config.task_type``.

    ``autocast_adapter_dtype``: upcast bf16/fp16 adapter weights to float32 (the base model keeps
    its dtype).
    """
    from .peft_model import MODEL_TYPE_TO_PEFT_MODEL_MAPPING, PeftModel

    model_config = getattr(model, "config", None)
    if model_config is not None and peft_config.base_model_name_or_path is None:
        peft_config.base_model_name_or_path = getattr(model_config, "name_or_path", None)
    cls = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(peft_config.task_type, PeftModel)
    return cls(model, peft_config, adapter_name=adapter_name, autocast_adapter_dtype=autocast_adapter_dtype, low_cpu_mem_usage=low_cpu_mem_usage)
