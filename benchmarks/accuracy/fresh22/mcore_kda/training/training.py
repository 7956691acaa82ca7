"""Model construction for the text generation server (cf. megatron/training/training.py)."""

from typing import Callable

import torch

from mcore_kda.core.models.kimi_linear.kimi_linear_layer_specs import kimi_linear_stack_spec
from mcore_kda.core.models.kimi_linear.kimi_linear_model import KimiLinearModel
from mcore_kda.core.transformer.module import Float16Module

from .arguments import core_transformer_config_from_args, parse_args
from .global_vars import get_args, set_args


def model_provider(pre_process: bool = True, post_process: bool = True) -> KimiLinearModel:
    """Builds the model from the global arguments."""
    args = get_args()
    config = core_transformer_config_from_args(args)
    return KimiLinearModel(
        config=config,
        kda_stack_spec=kimi_linear_stack_spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=64,
        pre_process=pre_process,
        post_process=post_process,
    )


def get_model(model_provider_func: Callable, wrap_with_ddp: bool = False):
    """Build the model for training: fp32 weights, Float16Module for mixed precision."""
    args = get_args()
    model = model_provider_func(pre_process=True, post_process=True)
    for param in model.parameters():
        setattr(param, "allreduce", True)
    if args.fp16 or args.bf16:
        model = Float16Module(model.config, model)
    return model


def get_inference_model(model_provider_func: Callable = model_provider):
    """Build the model for serving: weights allocated straight in the serving dtype, so that no
    fp32 copy of the model is ever materialised (and no Float16Module is needed)."""
    args = get_args()
    torch.set_default_dtype(args.params_dtype)  # expect-bug: default-dtype id=build-default
    try:
        model = model_provider_func(pre_process=True, post_process=True)
    finally:
        torch.set_default_dtype(torch.float32)
    model.eval()
    return model


def build_inference_model_from_args():
    """``--bf16 --kda-resident-inference-state``: the text generation server's model."""
    from mcore_kda.core.inference.engines.static_engine import make_static_engine

    torch.manual_seed(0)
    set_args(parse_args([
        "--bf16", "--kda-gate-lower-bound", "-5", "--kda-state-dtype", "fp32",
        "--kda-resident-inference-state", "--inference-max-batch-size", "2",
    ]))
    model = get_inference_model()
    engine = make_static_engine(model, max_batch_size=2)
    tokens = engine.generate([[4, 2, 4, 2, 1, 3], [1, 1, 2, 3, 5, 8]], num_tokens_to_generate=3)
    return {"model": model, "tokens": tokens}
