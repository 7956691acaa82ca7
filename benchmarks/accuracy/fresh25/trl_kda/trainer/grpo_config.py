# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Configuration of :class:`~trl_kda.trainer.grpo_trainer.GRPOTrainer`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch


class RolloutBufferDtypes(NamedTuple):
    """Storage dtypes of the trainer-side rollout rings (deltas, keys, log-decays)."""

    delta: torch.dtype = torch.bfloat16
    key: torch.dtype = torch.bfloat16
    logdecay: torch.dtype = torch.bfloat16  # expect-bug: container id=buffer-dtypes


@dataclass
class GRPOConfig:
    """Arguments of the GRPO trainer.

    Generation arguments named ``vllm_*`` configure the colocated engine (``vllm_mode=
    "colocate"``) or the client of a generation server (``"server"``). ``model_init_kwargs``
    are passed to ``from_pretrained`` when the trainer is given a model id; its
    ``torch_dtype`` may be ``"auto"``, a dtype name or a ``torch.dtype``.
    """

    output_dir: str = "trl-kda-grpo"
    learning_rate: float = 1e-6
    per_device_train_batch_size: int = 2
    gradient_accumulation_steps: int = 1
    num_generations: int = 2
    max_prompt_length: int | None = 8
    max_completion_length: int = 4
    temperature: float = 1.0
    beta: float = 0.04
    epsilon: float = 0.2
    epsilon_high: float | None = None
    loss_type: str = "dapo"
    scale_rewards: bool = True
    reward_weights: list[float] | None = None
    bf16: bool = False
    fp16: bool = False
    seed: int = 42
    model_init_kwargs: dict[str, Any] | str | None = None
    disable_dropout: bool = False

    use_vllm: bool = True
    vllm_mode: str = "colocate"
    vllm_dtype: str = "auto"
    vllm_kv_cache_dtype: str = "auto"
    vllm_max_num_seqs: int = 4
    vllm_replay_ring_len: int = 4
    vllm_enable_sleep_mode: bool = False
    vllm_gpu_memory_utilization: float = 0.3

    generation_dtype: str | None = None
    rollout_buffer_dtypes: RolloutBufferDtypes = field(default_factory=RolloutBufferDtypes)
    prefill_with_policy: bool = False
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512

    def __post_init__(self) -> None:
        if isinstance(self.model_init_kwargs, str):
            self.model_init_kwargs = json.loads(self.model_init_kwargs)
        if self.bf16 and self.fp16:
            raise ValueError("bf16 and fp16 are mutually exclusive")
        if self.vllm_mode not in ("colocate", "server"):
            raise ValueError(f"vllm_mode must be 'colocate' or 'server', got {self.vllm_mode!r}")
        global_batch = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if global_batch % self.num_generations:
            raise ValueError(
                f"the global batch size ({global_batch}) must be a multiple of num_generations "
                f"({self.num_generations})"
            )
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon

    @property
    def mixed_precision(self) -> str:
        """The accelerate mixed-precision mode these arguments ask for."""
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "no"

    @property
    def replay_gate_dtype(self) -> torch.dtype:
        """Storage dtype of the log-decay rings of the engine the trainer starts."""
        return torch.float32

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["rollout_buffer_dtypes"] = {k: str(v) for k, v in self.rollout_buffer_dtypes._asdict().items()}
        return values
