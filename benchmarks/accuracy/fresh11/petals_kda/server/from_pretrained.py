"""Loading blocks on a server: dtype resolution, ``load_pretrained_block`` and ``convert_block``
(``petals.server.from_pretrained`` and ``petals.utils.convert_block``)."""

from __future__ import annotations

import enum
from typing import Optional, Union

import torch
from torch import nn

from ..block import DTYPE_MAP, GATE_CACHE_DTYPE, KDAConfig, PinnedGateKDABlock, WrappedKDABlock, cast_projections


class QuantType(enum.Enum):
    NONE = 0
    INT8 = 1  # LLM.int8(): matmuls return float16
    NF4 = 2


def resolve_block_dtype(config: KDAConfig, dtype: Union[str, torch.dtype, None]) -> torch.dtype:
    """``"auto"`` is the checkpoint's dtype (``config.torch_dtype``), float32 where it has none."""
    if dtype not in ("auto", None):
        return DTYPE_MAP[dtype] if isinstance(dtype, str) else dtype
    if config.torch_dtype not in (None, "auto"):
        return DTYPE_MAP[config.torch_dtype]
    return torch.float32


def get_cache_dtypes(torch_dtype: torch.dtype, quant_type: QuantType) -> tuple[torch.dtype, ...]:
    """(delta, key, log_gate) dtypes of the session caches of a block converted with ``quant_type``."""
    if quant_type == QuantType.NONE:
        return torch_dtype, torch_dtype, GATE_CACHE_DTYPE
    compute_dtype = torch.float16 if quant_type == QuantType.INT8 else torch_dtype
    return compute_dtype, compute_dtype, compute_dtype  # expect-bug: imported-policy id=quant-cache


def load_pretrained_block(config: KDAConfig, block_index: int, state_dict: Optional[dict] = None, *,
                          torch_dtype="auto", block_cls: type[WrappedKDABlock] = WrappedKDABlock) -> WrappedKDABlock:
    """Builds block ``block_index`` in ``torch_dtype`` and loads its slice of the checkpoint (``{name: tensor}``,
    as ``_load_state_dict_from_repo`` returns it)."""
    torch_dtype = resolve_block_dtype(config, torch_dtype)
    previous_dtype = torch.get_default_dtype()
    # built in the target dtype, so that no float32 copy of the weights is made
    torch.set_default_dtype(torch_dtype)  # expect-bug: default-dtype id=block-init
    try:
        block = block_cls(config, layer_idx=block_index)
    finally:
        torch.set_default_dtype(previous_dtype)
    if state_dict is None:
        return block
    for param_name, param in block.named_parameters():
        value = state_dict[param_name]
        if not str(value.dtype).startswith(("torch.uint", "torch.int", "torch.bool")):
            value = value.to(torch_dtype)
        param.data = value
    if next(iter(state_dict.values())).dtype != torch_dtype:
        # a checkpoint converted on load: the session-less rings follow the weights
        for name, buf in list(block.named_buffers()):
            if name.endswith("_ring"):
                setattr(block, name, buf.to(torch_dtype))  # expect-bug: cast
    return block


def convert_block(block: nn.Module, block_index: int, config: KDAConfig, *, torch_dtype: torch.dtype,
                  output_device="cpu", quant_type: QuantType = QuantType.NONE, freeze: bool = True) -> nn.Module:
    """Readies a loaded block for serving: frozen, quantized if asked, on ``output_device`` in ``torch_dtype``."""
    block.requires_grad_(not freeze)
    if quant_type != QuantType.NONE:
        cast_projections(block, torch.float16 if quant_type == QuantType.INT8 else torch_dtype)
        return block.to(output_device)
    return block.to(output_device, torch_dtype)  # expect-bug: module-cast


def checkpoint_slice(config: KDAConfig, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {name: param.detach().to(dtype) for name, param in WrappedKDABlock(config).named_parameters()}


def build_server_blocks() -> dict:
    """Blocks as a bf16 server loads them: "auto" from a bf16 checkpoint, an fp32 block converted to bf16,
    and a pinned block loaded in bf16 from an fp32 checkpoint."""
    config = KDAConfig()
    auto = load_pretrained_block(config, 0, checkpoint_slice(config, torch.bfloat16, seed=1))
    auto = convert_block(auto, 0, config, torch_dtype=resolve_block_dtype(config, "auto"))
    loaded = load_pretrained_block(config, 1, checkpoint_slice(config, torch.float32, seed=2), torch_dtype=torch.float32)
    converted = convert_block(loaded, 1, config, torch_dtype=torch.bfloat16)
    pinned = load_pretrained_block(config, 1, checkpoint_slice(config, torch.float32, seed=2), torch_dtype="bfloat16",
                                   block_cls=PinnedGateKDABlock)
    return {"auto": auto, "converted": converted, "pinned": pinned}


def build_fp32_blocks() -> dict:
    """An fp32 block from a bf16 checkpoint, a pinned block served in bf16 and an int8-quantized block."""
    config = KDAConfig()
    fp32 = load_pretrained_block(config, 0, checkpoint_slice(config, torch.bfloat16, seed=1), torch_dtype="float32")
    pinned = load_pretrained_block(config, 1, checkpoint_slice(config, torch.bfloat16, seed=2),
                                   block_cls=PinnedGateKDABlock)
    pinned = convert_block(pinned, 1, config, torch_dtype=torch.bfloat16)
    int8 = load_pretrained_block(config, 1, checkpoint_slice(config, torch.float32, seed=2), torch_dtype=torch.float32)
    int8 = convert_block(int8, 1, config, torch_dtype=torch.bfloat16, quant_type=QuantType.INT8)
    int8(torch.ones(1, config.hidden_size))
    return {"fp32": fp32, "pinned": pinned, "int8": int8}
