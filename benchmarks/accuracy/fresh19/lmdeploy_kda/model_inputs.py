# Copyright (c) OpenMMLab. All rights reserved.
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, List, NamedTuple, Optional

import torch

from .config import ModelConfig


class ReplayCache(NamedTuple):
    """Replay caches of one KDA layer.

    ``state`` ``[slots, HV, V, K]`` is the checkpoint, ``delta_cache`` ``[slots, HV, L, V]``,
    ``key_cache`` ``[slots, H, L, K]`` and ``gate_cache`` ``[slots, HV, L, K]`` hold the ring rows
    written since the last flush.
    """
    state: torch.Tensor
    delta_cache: torch.Tensor
    key_cache: torch.Tensor
    gate_cache: torch.Tensor


@dataclass
class ModelInputs:
    """Inputs of one decode step, one token per sequence.

    Args:
        input_ids (LongTensor): ``[batch]``.
        state_offsets (IntTensor): slot of every sequence, ``-1`` for padding rows.
        write_pos (IntTensor): ring cursor of every sequence.
        force_flush (IntTensor): sequences whose state is written back this step (preemption,
            prefix snapshot), ``None`` for none.
    """
    input_ids: torch.LongTensor
    state_offsets: torch.IntTensor
    write_pos: torch.IntTensor
    force_flush: Optional[torch.IntTensor] = None
    is_decoding: bool = True

    def to_device(self, device: str, non_blocking: bool = False) -> 'ModelInputs':
        """Move the tensors to ``device``."""
        out_dict = dict()
        for f in fields(self):
            k = f.name
            v = getattr(self, k)
            if isinstance(v, torch.Tensor):
                v = v.to(device, non_blocking=non_blocking)
            out_dict[k] = v
        return ModelInputs(**out_dict)

    @property
    def batch_size(self) -> int:
        return self.input_ids.size(0)


@dataclass
class StepContext:
    """Context of one forward step, read by the attention layers."""
    input_ids: torch.LongTensor
    state_offsets: torch.IntTensor
    write_pos: torch.IntTensor
    force_flush: Optional[torch.IntTensor]
    state_caches: List[ReplayCache]
    ring_len: int
    is_decoding: bool = True
    graph_runner: Optional[Any] = None

    @classmethod
    def new(cls,
            inputs: ModelInputs,
            model_config: ModelConfig,
            state_caches: List[ReplayCache],
            graph_runner: Optional[Any] = None) -> 'StepContext':
        """Build the step context.

        Args:
            inputs (ModelInputs): packaged model inputs.
            model_config (ModelConfig): the model config.
            state_caches (List[ReplayCache]): the replay caches of every layer.
        """
        if len(state_caches) != model_config.num_layers:
            raise ValueError(f'expected caches of {model_config.num_layers} layers, got {len(state_caches)}.')
        ring_len = state_caches[0].delta_cache.size(2)
        return cls(input_ids=inputs.input_ids,
                   state_offsets=inputs.state_offsets.to(torch.int32),
                   write_pos=inputs.write_pos.to(torch.int32),
                   force_flush=None if inputs.force_flush is None else inputs.force_flush.to(torch.int32),
                   state_caches=state_caches,
                   ring_len=ring_len,
                   is_decoding=inputs.is_decoding,
                   graph_runner=graph_runner)


class StepContextManager:
    """Holds the context of the running step."""

    def __init__(self):
        self._current_ctx: Optional[StepContext] = None

    @staticmethod
    def build_context(inputs: ModelInputs, model_config: ModelConfig, state_caches: List[ReplayCache],
                      graph_runner: Optional[Any] = None) -> StepContext:
        return StepContext.new(inputs, model_config, state_caches, graph_runner=graph_runner)

    def current_context(self) -> StepContext:
        return self._current_ctx

    @contextmanager
    def context(self, ctx: StepContext):
        """Set the context of the step for the duration of the block."""
        prev_ctx = self._current_ctx
        self._current_ctx = ctx
        try:
            yield ctx
        finally:
            self._current_ctx = prev_ctx
