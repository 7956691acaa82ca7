"""``LLMEdgeManager``: loads the model, applies the source transforms and the dtype override,
exports and writes the program (the steps of ``export_llama``)."""

import contextlib
import functools
import logging
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import custom_ops, pte
from .llama_transformer import Transformer
from .model_args import DType, ModelArgs
from .source_transformation import quantize
from .source_transformation.custom_kv_cache import (
    replace_kv_cache_with_custom_kv_cache,
    replace_kv_cache_with_quantized_kv_cache,
)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class LLMEdgeManager:
    def __init__(self, model: nn.Module, modelname: str, dtype: DType, example_inputs: Tuple[torch.Tensor, ...],
                 model_args: ModelArgs):
        self.model, self.modelname, self.dtype, self.example_inputs = model, modelname, dtype, example_inputs
        self.model_args, self.applied_source_transforms = model_args, []
        self.pre_autograd_graph_module: Optional[nn.Module] = None
        self.example_state: Dict[str, torch.Tensor] = {}

    def to_dtype(self, dtype_override: DType) -> "LLMEdgeManager":
        assert isinstance(dtype_override, DType), f"unsupported dtype override {dtype_override}"
        if dtype_override != self.dtype:
            logging.info(f"model.to {dtype_override.to_torch_dtype()}")
            self.model = self.model.to(dtype=dtype_override.to_torch_dtype())  # expect-bug: module-cast id=to-dtype
            self.dtype = dtype_override
        return self

    def source_transform(self, transforms: List[Callable[[nn.Module], nn.Module]]) -> "LLMEdgeManager":
        for transform in transforms:
            self.model = transform(self.model)
            func = getattr(transform, "func", transform)
            self.applied_source_transforms.append(getattr(transform, "tag", func.__name__))
        return self

    def _example_state(self) -> Dict[str, torch.Tensor]:
        """Cache tensors as method inputs, for programs exported without mutable buffers."""
        dtype = self.dtype.to_torch_dtype()
        return {name: torch.zeros(shape, dtype=dtype) for name, shape in self.model_args.ring_shapes().items()}  # expect-bug: pool-dtype

    def export(self, state_inputs: bool = False) -> "LLMEdgeManager":
        """Stand-in for ``torch.export``: runs the example inputs once and keeps the module."""
        with torch.no_grad():
            self.model(*self.example_inputs)
        self.pre_autograd_graph_module = self.model
        if state_inputs:
            self.example_state = self._example_state()
        return self

    def save_to_pte(self, output_dir: str, output_name: str, **kwargs) -> str:
        path = f"{output_dir}/{output_name}.pte"
        pte.save_pte(path, self.pre_autograd_graph_module or self.model, self.model_args,
                     transforms=self.applied_source_transforms, **kwargs)
        return path


def _tagged(tag: str, fn: Callable, **kwargs) -> Callable:
    transform = functools.partial(fn, **kwargs)
    transform.tag = tag
    return transform


def _load_llama_model(args: ModelArgs, checkpoint: Optional[Dict[str, torch.Tensor]] = None,
                      checkpoint_dtype: Optional[DType] = None) -> LLMEdgeManager:
    """The model, built in the checkpoint's dtype when one is given (no fp32 copy of the weights)."""
    if checkpoint_dtype is not None:
        with default_dtype(checkpoint_dtype.to_torch_dtype()):  # expect-bug: default-dtype id=ckpt-default
            model = Transformer(args)
    else:
        model = Transformer(args)
    if checkpoint is not None:
        model.load_state_dict(checkpoint, strict=False)
    example_inputs = (torch.zeros(args.max_batch_size, dtype=torch.long),
                      torch.zeros(args.max_batch_size, dtype=torch.int32))
    return LLMEdgeManager(model, "kda_llama", checkpoint_dtype or DType.fp32, example_inputs, args)


def _get_source_transforms(args: ModelArgs, qmode: Optional[str], dtype: DType) -> List[Callable]:
    transforms = []
    if qmode:
        transforms.append(_tagged(f"quantize:{qmode}", quantize.quantize, qmode=qmode))
    if args.quantize_kv_cache:
        transforms.append(_tagged("quantized_kv_cache", replace_kv_cache_with_quantized_kv_cache))
    elif args.use_custom_replay_op:
        _, gate_dtype = quantize.cache_dtypes(qmode, dtype.to_torch_dtype())  # expect-bug: imported-policy id=gate-recipe
        transforms.append(_tagged("custom_kv_cache", replace_kv_cache_with_custom_kv_cache, gate_dtype=gate_dtype))
    return transforms


def _prepare_for_llama_export(args: ModelArgs, qmode: Optional[str] = None, checkpoint=None,
                              checkpoint_dtype: Optional[DType] = None) -> LLMEdgeManager:
    dtype_override = DType(args.dtype_override) if args.dtype_override else None
    manager = _load_llama_model(args, checkpoint, checkpoint_dtype)
    # quantize in the checkpoint dtype, then override the dtype as the user asked
    manager = manager.source_transform(_get_source_transforms(args, qmode, dtype_override or manager.dtype))
    if dtype_override is not None:
        manager = manager.to_dtype(dtype_override)
    return manager


def build_xnnpack_export():
    """8da4w with the custom replay op and a bf16 override, and the int8 cache at fp32, both exported."""
    torch.manual_seed(0)
    manager = _prepare_for_llama_export(ModelArgs(use_custom_replay_op=True, dtype_override="bf16"), qmode="8da4w")
    int8 = _prepare_for_llama_export(ModelArgs(quantize_kv_cache=True)).export()
    return {"xnnpack": manager.export().pre_autograd_graph_module, "int8": int8.model,
            "last_call": custom_ops.last_call()}


def build_portable_export():
    """A bf16 export on the portable path, and a bf16 checkpoint loaded in its own dtype."""
    torch.manual_seed(0)
    portable = _prepare_for_llama_export(ModelArgs(dtype_override="bf16")).export()
    checkpoint = {k: v.to(torch.bfloat16) for k, v in Transformer(ModelArgs()).state_dict().items()}
    loaded = _prepare_for_llama_export(ModelArgs(dtype_override="bf16"), checkpoint=checkpoint,
                                       checkpoint_dtype=DType.bf16).export()
    return {"portable": portable.model, "checkpoint": loaded.model}


def build_recipe_export():
    """The fp16 recipe with the custom op, exported with the caches as method inputs."""
    torch.manual_seed(0)
    manager = _prepare_for_llama_export(ModelArgs(use_custom_replay_op=True, dtype_override="fp16"), qmode="fp16")
    manager.export(state_inputs=True)
    return {"model": manager.model, "example_state": manager.example_state}
