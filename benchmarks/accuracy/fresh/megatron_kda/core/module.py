"""Megatron Module."""

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parameter import Parameter

from megatron_kda.core.transformer_config import TransformerConfig

_FLOAT_TYPES = (torch.float32,)
_HALF_TYPES = (torch.float16, torch.bfloat16)


class MegatronModule(torch.nn.Module):
    """Base Megatron module inhertied by all Models.

    Megatron specific extensions of torch Module with support for pipelining.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config


def conversion_helper(val: Any, conversion: Callable[[Any], Any]) -> Any:
    if not isinstance(val, (tuple, list)):
        return conversion(val)
    rtn = [conversion_helper(v, conversion) for v in val]
    if isinstance(val, tuple):
        rtn = tuple(rtn)
    return rtn


def fp32_to_float16(val: Any, float16_convertor: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    def half_conversion(val: Any) -> Any:
        val_typecheck = val
        if isinstance(val_typecheck, Parameter):
            val_typecheck = val.data
        if isinstance(val_typecheck, torch.Tensor) and val_typecheck.dtype in _FLOAT_TYPES:
            val = float16_convertor(val)
        return val

    return conversion_helper(val, half_conversion)


def float16_to_fp32(val: Any) -> Any:
    def float_conversion(val: Any) -> Any:
        val_typecheck = val
        if isinstance(val_typecheck, Parameter):
            val_typecheck = val.data
        if isinstance(val_typecheck, torch.Tensor) and val_typecheck.dtype in _HALF_TYPES:
            val = val.float()
        return val

    return conversion_helper(val, float_conversion)


class Float16Module(MegatronModule):
    """Float 16 Module.

    Attributes:
        config (TransformerConfig): The transformer config used to initalize the model
    """

    def __init__(self, config: TransformerConfig, module: torch.nn.Module):
        super().__init__(config)
        self.fp16 = config.fp16
        self.bf16 = config.bf16

        if self.fp16:
            self.add_module("module", module.half())  # expect-bug: module-cast id=mg-fp16

            def float16_convertor(val: torch.Tensor) -> torch.Tensor:
                return val.half()  # expect-bug: cast id=mg-positional-states

        elif self.bf16:
            self.add_module(  # expect-bug: module-cast id=mg-fp16
                "module", module.bfloat16()
            )

            def float16_convertor(val: torch.Tensor) -> torch.Tensor:
                return val.bfloat16()  # expect-bug: cast id=mg-positional-states

        else:
            raise Exception("Either config.fp16 or config.bf16 should be True.")

        self.float16_convertor = float16_convertor

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        inputs = fp32_to_float16(  # expect-bug: cast id=mg-positional-states
            inputs, self.float16_convertor
        )
        outputs = self.module(*inputs, **kwargs)
        return float16_to_fp32(outputs)

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict)
