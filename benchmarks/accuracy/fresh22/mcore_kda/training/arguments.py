"""Megatron arguments (the subset a Kimi Linear server needs)."""

import argparse
import dataclasses
from typing import List, Optional

import torch

from mcore_kda.core.transformer.transformer_config import TransformerConfig


def parse_args(argv: Optional[List[str]] = None, ignore_unknown_args: bool = False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    group = parser.add_argument_group(title="network size")
    group.add_argument("--num-layers", type=int, default=2)
    group.add_argument("--hidden-size", type=int, default=16)
    group.add_argument("--num-attention-heads", type=int, default=2)
    group.add_argument("--padded-vocab-size", type=int, default=32)
    group.add_argument("--init-method-std", type=float, default=0.2)
    group = parser.add_argument_group(title="kda")
    group.add_argument("--linear-num-key-heads", type=int, default=2)
    group.add_argument("--linear-num-value-heads", type=int, default=4)
    group.add_argument("--linear-key-head-dim", type=int, default=8)
    group.add_argument("--linear-value-head-dim", type=int, default=4)
    group.add_argument("--kda-ring-length", type=int, default=4)
    group.add_argument("--kda-gate-lower-bound", type=float, default=None)
    group.add_argument("--kda-state-dtype", type=str, default=None, choices=["fp32", "bf16", "fp16"])
    group.add_argument("--kda-resident-inference-state", action="store_true")
    group.add_argument("--inference-max-batch-size", type=int, default=1)
    group = parser.add_argument_group(title="mixed precision")
    group.add_argument("--fp16", action="store_true", help="Run model in fp16 mode.")
    group.add_argument("--bf16", action="store_true", help="Run model in bfloat16 mode.")
    if ignore_unknown_args:
        args, _ = parser.parse_known_args(argv)
    else:
        args = parser.parse_args(argv)
    return validate_args(args)


def validate_args(args):
    assert not (args.fp16 and args.bf16), "cannot have both fp16 and bf16 enabled."
    # Parameters dtype.
    args.params_dtype = torch.float
    if args.fp16:
        args.params_dtype = torch.half
    if args.bf16:
        args.params_dtype = torch.bfloat16
    return args


def core_transformer_config_from_args(args, config_class=TransformerConfig):
    # Config class.
    kw_args = {}
    for f in dataclasses.fields(config_class):
        if hasattr(args, f.name):
            kw_args[f.name] = getattr(args, f.name)
    return config_class(**kw_args)
