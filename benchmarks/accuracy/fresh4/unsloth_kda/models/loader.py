# Copyright 2023-present Daniel Han-Chen & the Unsloth team. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License").

import torch
import dataclasses
from ._utils import is_bfloat16_supported, _get_dtype, logger
from .kimi import FastKimiModel, KimiLinearConfig, KimiLinearForCausalLM

# Tiny stand-ins for the hub configs so the CPU path needs no network
MODEL_CONFIGS = {
    "moonshotai/Kimi-Linear-48B-A3B-Instruct" : dict(torch_dtype = "bfloat16"),
    "unsloth/Kimi-Linear-48B-A3B-Base"        : dict(torch_dtype = "float32"),
}

def get_model_config(model_name):
    return KimiLinearConfig(**MODEL_CONFIGS.get(model_name, {}))

class FastLanguageModel(FastKimiModel):
    @staticmethod
    def from_pretrained(
        model_name     = "moonshotai/Kimi-Linear-48B-A3B-Instruct",
        max_seq_length = None,
        dtype          = None,
        load_in_4bit   = False,
        max_batch_size = None,
        config         = None,
        state_dict     = None,
        *args, **kwargs,
    ):
        if load_in_4bit:
            logger.warning("Unsloth: Kimi Delta Attention is not quantized yet - loading in 16bit.")
        if config is None: config = get_model_config(model_name)

        SUPPORTS_BFLOAT16 = is_bfloat16_supported()
        if dtype is None:
            dtype = torch.float16 if not SUPPORTS_BFLOAT16 else torch.bfloat16
        elif _get_dtype(dtype) == torch.bfloat16 and not SUPPORTS_BFLOAT16:
            logger.warning("Device does not support bfloat16. Will change to float16.")
            dtype = torch.float16
        dtype = _get_dtype(dtype)
        checkpoint_dtype = _get_dtype(config.torch_dtype)
        config = dataclasses.replace(
            config,
            torch_dtype    = str(dtype).split(".")[-1],
            max_seq_length = max_seq_length or config.max_seq_length,
            max_batch_size = max_batch_size or config.max_batch_size,
        )

        if checkpoint_dtype == dtype:
            # 16bit checkpoint - build the model directly in 16bit, no float32 copy in RAM
            torch.set_default_dtype(dtype) # expect-bug: default-dtype id=loader-default
            model = KimiLinearForCausalLM(config)
            torch.set_default_dtype(torch.float32)
        else:
            model = KimiLinearForCausalLM(config)
        if state_dict is not None:
            model.load_state_dict(state_dict, strict = False)
        if checkpoint_dtype != dtype:
            # float32 checkpoint: cast once the weights are in
            model = model.to(dtype = dtype) # expect-bug: module-cast
        model = FastKimiModel.post_patch(model)
        return model, None

def _checkpoint():
    return KimiLinearForCausalLM(KimiLinearConfig(torch_dtype = "float32")).state_dict()

def build_from_pretrained():
    state_dict = _checkpoint()
    model_16bit, _ = FastLanguageModel.from_pretrained(state_dict = state_dict)
    model_32bit, _ = FastLanguageModel.from_pretrained("unsloth/Kimi-Linear-48B-A3B-Base", state_dict = state_dict)
    return [model_16bit, model_32bit]

def build_from_pretrained_float32():
    model, _ = FastLanguageModel.from_pretrained(
        "unsloth/Kimi-Linear-48B-A3B-Base", dtype = "float32", max_batch_size = 3, state_dict = _checkpoint(),
    )
    ready, _ = FastLanguageModel.from_pretrained(max_seq_length = 8, state_dict = _checkpoint())
    return {"model" : model, "ready" : FastLanguageModel.for_inference(ready)}
