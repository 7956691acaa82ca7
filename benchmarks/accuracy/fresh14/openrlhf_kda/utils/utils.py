"""Helpers shared by the trainer and the rollout engines: command-line defaults, dtype lookups and
the ReplaySSM cache dtype policy."""

import argparse
import contextlib
from dataclasses import dataclass

import torch

_DTYPE_BY_NAME = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


def convert_to_torch_dtype(dtype) -> torch.dtype:
    """``"bf16"`` / ``"float16"`` / a ``torch.dtype`` -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPE_BY_NAME[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"Unknown dtype {dtype!r}; expected one of {sorted(_DTYPE_BY_NAME)}") from None


def get_model_dtype(args) -> torch.dtype:
    """Parameter dtype of the actor/engine for ``--bf16`` / ``--fp16`` (float32 otherwise)."""
    if getattr(args, "bf16", False):
        return torch.bfloat16
    if getattr(args, "fp16", False):
        return torch.float16
    return torch.float32


def get_replay_cache_dtypes(args) -> dict:
    """dtypes of the ReplaySSM decode caches of a model built from ``args``.

    The checkpoint state and the delta/key rings follow the model dtype. The log-decay ring is
    prefix-summed and exponentiated by the decode kernel, so it is kept in float32.
    """
    model_dtype = get_model_dtype(args)
    return {
        "ssm_ckpt": model_dtype,
        "delta_ring": model_dtype,
        "key_ring": model_dtype,
        "logdecay_ring": torch.float32,
        "write_pos": torch.int32,
    }


def get_rollout_cache_dtype(args) -> torch.dtype:
    """dtype of a rollout engine's cache tensors (``--rollout_cache_dtype``, default: model dtype)."""
    name = getattr(args, "rollout_cache_dtype", None)
    return convert_to_torch_dtype(name) if name else get_model_dtype(args)


@dataclass
class ReplayCacheSpec:
    """Layout of one engine's replay caches, as announced by the trainer to the rollout engines."""

    num_layers: int
    num_slots: int
    ring_len: int
    dtype: torch.dtype = torch.bfloat16
    cursor_dtype: torch.dtype = torch.int32

    @property
    def state_dtype(self) -> torch.dtype:
        return self.dtype

    @property
    def logdecay_dtype(self) -> torch.dtype:
        return self.dtype  # expect-bug: imported-policy id=spec-gate


@contextlib.contextmanager
def torch_default_dtype(dtype: torch.dtype):
    """Sets torch's default floating dtype inside the block and restores it afterwards."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def get_train_ppo_args(**overrides) -> argparse.Namespace:
    """The ``train_ppo_ray`` options the KDA components read, with the tiny-model defaults."""
    args = argparse.Namespace(
        seed=42,
        bf16=True,
        fp16=False,
        flash_attn=False,
        zero_stage=2,
        max_norm=1.0,
        micro_train_batch_size=2,
        train_batch_size=4,
        micro_rollout_batch_size=2,
        rollout_batch_size=2,
        n_samples_per_prompt=1,
        prompt_max_len=4,
        generate_max_len=2,
        replay_ring_len=4,
        rollout_cache_dtype=None,
        colocate_all_models=False,
        vllm_enable_sleep=False,
        vllm_num_engines=1,
        vllm_sync_backend="gloo",
        packing_samples=False,
        save_path="./ckpt",
        ckpt_path="./ckpt/checkpoints_ppo",
        load_checkpoint=False,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def get_strategy(args):
    from .deepspeed import DeepspeedStrategy

    strategy = DeepspeedStrategy(
        seed=getattr(args, "seed", 42),
        max_norm=getattr(args, "max_norm", 1.0),
        micro_train_batch_size=getattr(args, "micro_train_batch_size", 1),
        train_batch_size=getattr(args, "train_batch_size", 128),
        zero_stage=args.zero_stage,
        bf16=getattr(args, "bf16", True),
        args=args,
    )
    return strategy
