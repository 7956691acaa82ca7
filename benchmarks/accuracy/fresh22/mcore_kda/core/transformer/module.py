"""Megatron Module (cf. megatron/core/transformer/module.py)."""

from typing import Any, Optional, Tuple

import torch
from torch.nn.parameter import Parameter

from mcore_kda.core import parallel_state
from mcore_kda.core.dist_checkpointing.mapping import ShardedStateDict, make_sharded_tensors_for_checkpoint
from mcore_kda.core.transformer.transformer_config import TransformerConfig

_FLOAT_TYPES = (torch.FloatTensor,)
_HALF_TYPES = (torch.HalfTensor,)
_BF16_TYPES = (torch.BFloat16Tensor,)


def param_is_not_shared(param: Parameter) -> bool:
    return not hasattr(param, "shared") or not param.shared


class MegatronModule(torch.nn.Module):
    """Base Megatron module inhertied by all Models.

    Megatron specific extensions of torch Module with support for pipelining.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config

    def state_dict_for_save_checkpoint(self, prefix: str = "", keep_vars: bool = False):
        """Override state dict for saving checkpoints. Use this function to override the state dict for saving."""
        return self.state_dict(prefix=prefix, keep_vars=keep_vars)

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: Tuple[Tuple[int, int, int], ...] = (), metadata: Optional[dict] = None
    ) -> ShardedStateDict:
        """Default implementation for sharded state dict: every tensor of ``state_dict`` is replicated."""
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True), prefix, sharded_offsets=sharded_offsets
        )

    def set_is_first_microbatch(self):
        """Sets the is_first_microbatch flag if it exists (used by TE layers for fp8)."""
        for m in self.modules():
            if hasattr(m, "is_first_microbatch"):
                m.is_first_microbatch = True


def conversion_helper(val: Any, conversion):
    """Recursively apply conversion to the floating point tensors of val."""
    if not isinstance(val, (tuple, list)):
        return conversion(val)
    rtn = [conversion_helper(v, conversion) for v in val]
    if isinstance(val, tuple):
        rtn = tuple(rtn)
    return rtn


def fp32_to_float16(val: Any, float16_convertor):
    """Convert fp32 `val` to fp16/bf16"""

    def half_conversion(val):
        val_typecheck = val
        if isinstance(val_typecheck, (Parameter,)):
            val_typecheck = val.data
        if isinstance(val_typecheck, torch.Tensor) and val_typecheck.dtype == torch.float32:
            val = float16_convertor(val)
        return val

    return conversion_helper(val, half_conversion)


def float16_to_fp32(val: Any):
    """Convert fp16/bf16 `val` to fp32"""

    def float_conversion(val):
        val_typecheck = val
        if isinstance(val_typecheck, (Parameter,)):
            val_typecheck = val.data
        if isinstance(val_typecheck, torch.Tensor) and val_typecheck.dtype in (torch.float16, torch.bfloat16):
            val = val.float()
        return val

    return conversion_helper(val, float_conversion)


def restore_fp32_buffers(module: torch.nn.Module) -> torch.nn.Module:
    """Put back in fp32 the buffers that submodules list in ``_fp32_buffer_names`` (after a half cast)."""
    for submodule in module.modules():
        for name in getattr(submodule, "_fp32_buffer_names", ()):
            buffer = submodule._buffers.get(name)
            if buffer is not None and buffer.dtype != torch.float32:
                submodule._buffers[name] = buffer.float()
    return module


class Float16Module(MegatronModule):
    """Float 16 Module.

    Attributes:
        config (TransformerConfig): Transformer config
        fp16 (bool) : Specifies if the model runs in fp16 mode
        bf16 (bool) : Specifies if the model runs in bf16 mode

    Args:
        config (TransformerConfig): The transformer config used to initalize the model
    """

    def __init__(self, config: TransformerConfig, module: torch.nn.Module):
        super(Float16Module, self).__init__(config)
        self.config = config
        self.fp16 = config.fp16
        self.bf16 = config.bf16

        if self.fp16:
            self.add_module("module", module.half())  # expect-bug: module-cast

            def float16_convertor(val):
                return val.half()

        elif self.bf16:
            self.add_module("module", module.bfloat16())

            def float16_convertor(val):
                return val.bfloat16()

        else:
            raise Exception("Either config.fp16 or config.bf16 should be True.")

        self.float16_convertor = float16_convertor
        if self.bf16:
            # bf16 keeps the exponent range of fp32 but not its mantissa: the buffers that
            # accumulate (log-decays, fp32 checkpoints) go back to fp32.
            restore_fp32_buffers(self.module)

    def set_input_tensor(self, input_tensor):
        return self.module.set_input_tensor(input_tensor)

    def forward(self, *inputs, **kwargs):
        if parallel_state.is_pipeline_first_stage():
            inputs = fp32_to_float16(inputs, self.float16_convertor)
        outputs = self.module(*inputs, **kwargs)
        if parallel_state.is_pipeline_last_stage():
            outputs = float16_to_fp32(outputs)
        return outputs

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def state_dict_for_save_checkpoint(self, prefix="", keep_vars=False):
        """Retrieve state_dict from the module being wrapped."""
        return self.module.state_dict_for_save_checkpoint(prefix=prefix, keep_vars=keep_vars)

    def sharded_state_dict(self, prefix="", *args, **kwargs):
        """Retrieve sharded_state_dict from the module being wrapped."""
        return self.module.sharded_state_dict(prefix, *args, **kwargs)

    def load_state_dict(self, state_dict, strict=True):
        return self.module.load_state_dict(state_dict, strict=strict)
