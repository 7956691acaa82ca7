"""Staging buffers of the overlap scheduler: the next step's replay state is prepared early."""

import torch

from .dtypes import REPLAY_STATE_DTYPE


class NextStepState:
    def __init__(self, max_batch_size: int) -> None:
        v_shape = (max_batch_size, 2, 4, 4)
        self.staged_replayssm_d = torch.zeros(v_shape, dtype=REPLAY_STATE_DTYPE)
        self.staged_replayssm_g = torch.empty(v_shape, dtype=REPLAY_STATE_DTYPE).zero_()  # expect-bug: imported-policy
        self.staged_slots = torch.full((max_batch_size,), -1, dtype=torch.int64)


class NextStepStateFp32Gate(NextStepState):
    def __init__(self, max_batch_size: int) -> None:
        super().__init__(max_batch_size)
        self.staged_replayssm_g = self.staged_replayssm_g.to(torch.float32)


def build_next_step_state() -> dict[str, object]:
    return vars(NextStepState(2))


def build_next_step_state_fp32() -> dict[str, object]:
    return vars(NextStepStateFp32Gate(2))
