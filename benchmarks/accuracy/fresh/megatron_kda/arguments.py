"""Megatron arguments (the subset the KDA hybrid model reads)."""

import argparse

import torch

_GLOBAL_ARGS: argparse.Namespace | None = None


def _add_network_size_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(title="network size")
    group.add_argument("--num-layers", type=int, default=2, help="Number of transformer layers.")
    group.add_argument("--hidden-size", type=int, default=8, help="Transformer hidden size.")
    group.add_argument("--padded-vocab-size", type=int, default=32)
    group.add_argument("--kda-num-heads", type=int, default=2, help="Number of KDA value heads.")
    group.add_argument("--kda-num-k-heads", type=int, default=1, help="Number of KDA key heads.")
    group.add_argument("--kda-head-dim", type=int, default=4)
    group.add_argument(
        "--kda-gate-type", type=str, default="softplus", choices=["softplus", "logsigmoid"]
    )
    group.add_argument("--kda-gate-logit-normalizer", type=float, default=16.0)
    return parser


def _add_mixed_precision_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(title="mixed precision")
    group.add_argument("--fp16", action="store_true", help="Run model in fp16 mode.")
    group.add_argument("--bf16", action="store_true", help="Run model in bfloat16 mode.")
    return parser


def _add_inference_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(title="inference")
    group.add_argument("--inference-max-batch-size", type=int, default=2)
    group.add_argument("--inference-max-seq-length", type=int, default=16)
    group.add_argument(
        "--replay-ring-len", type=int, default=4, help="Decode steps kept before a flush."
    )
    group.add_argument(
        "--static-replay-cache",
        action="store_true",
        help="Layers own a batch-1 decode state as buffers (for graph export).",
    )
    return parser


def parse_args(args_list: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Megatron-LM KDA Arguments", allow_abbrev=False)
    parser = _add_network_size_args(parser)
    parser = _add_mixed_precision_args(parser)
    parser = _add_inference_args(parser)
    return parser.parse_args(args_list or [])


def _replay_state_dtypes(args: argparse.Namespace) -> tuple[torch.dtype, torch.dtype]:
    """dtypes of the ReplaySSM decode rings: (d/k rings, gate ring)."""
    if args.fp16:
        return torch.half, torch.float
    if args.bf16:
        return torch.bfloat16, args.params_dtype  # expect-bug: imported-policy id=mg-replay-dtypes
    return torch.float, torch.float


def validate_args(args: argparse.Namespace) -> argparse.Namespace:
    assert not (args.fp16 and args.bf16), "cannot use both fp16 and bf16"
    args.params_dtype = torch.float
    if args.fp16:
        args.params_dtype = torch.half
    if args.bf16:
        args.params_dtype = torch.bfloat16
    args.replay_ring_dtype, args.replay_gate_dtype = _replay_state_dtypes(args)
    return args


def set_args(args: argparse.Namespace) -> None:
    global _GLOBAL_ARGS
    _GLOBAL_ARGS = args


def get_args() -> argparse.Namespace:
    assert _GLOBAL_ARGS is not None, "args is not initialized."
    return _GLOBAL_ARGS
