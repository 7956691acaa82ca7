"""Host-side bookkeeping: slot allocation, tracked sequences and the description of one ragged
forward pass."""

from typing import Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..config_v2 import DSStateManagerConfig


class BlockedAllocator:
    """Free list of ``num_blocks`` block ids (here: SSM cache slots)."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"cannot allocate from {num_blocks} blocks")
        self._num_blocks = num_blocks
        self._free: List[int] = list(range(num_blocks))

    def allocate(self, num_blocks: int) -> torch.Tensor:
        if num_blocks > len(self._free):
            raise ValueError(f"requested {num_blocks} blocks, {len(self._free)} free")
        taken, self._free = self._free[:num_blocks], self._free[num_blocks:]
        return torch.tensor(taken, dtype=torch.int32)

    def free(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            block = int(block)
            if block < 0 or block >= self._num_blocks or block in self._free:
                raise ValueError(f"block {block} is not allocated")
            self._free.append(block)
        self._free.sort()


class DSSequenceDescriptor:
    """One tracked sequence: its uid, its cache slot and how many tokens the cache has seen."""

    def __init__(self, uid: int, slot: Optional[int]) -> None:
        self.uid = uid
        self.slot = slot
        self.seen_tokens = 0
        self.in_flight_tokens = 0
        self.swap_entry: Optional[int] = None

    @property
    def is_resident(self) -> bool:
        return self.slot is not None

    def pre_forward(self, num_tokens: int) -> None:
        self.in_flight_tokens = num_tokens

    def post_forward(self) -> None:
        self.seen_tokens += self.in_flight_tokens
        self.in_flight_tokens = 0


class RaggedBatchWrapper:
    """Sequences of one forward, their new tokens and their slots.

    The ReplaySSM kernel takes one token per sequence per launch, so :meth:`finalize` lays the
    batch out as ``num_steps`` launches of ``len(current_sequences)`` rows. A sequence with fewer
    new tokens than the longest one contributes padding rows (slot ``-1``) to the later launches.
    """

    def __init__(self, config: DSStateManagerConfig) -> None:
        self._config = config
        self.clear()

    def clear(self) -> None:
        self._seqs: List[DSSequenceDescriptor] = []
        self._tokens: List[Tensor] = []
        self._finalized = False

    def insert_sequence(self, seq_desc: DSSequenceDescriptor, tokens: Tensor, do_checks: bool = True) -> None:
        if self._finalized:
            raise RuntimeError("the batch is finalized; clear() it first")
        if do_checks:
            if not seq_desc.is_resident:
                raise RuntimeError(f"sequence {seq_desc.uid} has no cache slot (swapped out?)")
            if len(self._seqs) >= self._config.max_ragged_sequence_count:
                raise RuntimeError("too many sequences in one ragged batch")
            if self.current_tokens + tokens.numel() > self._config.max_ragged_batch_size:
                raise RuntimeError("too many tokens in one ragged batch")
            if seq_desc.seen_tokens + tokens.numel() > self._config.max_context:
                raise RuntimeError(f"sequence {seq_desc.uid} exceeds max_context")
        seq_desc.pre_forward(tokens.numel())
        self._seqs.append(seq_desc)
        self._tokens.append(tokens.reshape(-1).long())

    def finalize(self) -> None:
        steps = max((t.numel() for t in self._tokens), default=0)
        rows = len(self._seqs)
        self._input_ids = torch.zeros(steps, rows, dtype=torch.long)
        self._slot_ids = torch.full((steps, rows), -1, dtype=torch.int32)
        for row, (seq, tokens) in enumerate(zip(self._seqs, self._tokens)):
            self._input_ids[: tokens.numel(), row] = tokens
            self._slot_ids[: tokens.numel(), row] = seq.slot
        self._last_step = torch.tensor([t.numel() - 1 for t in self._tokens], dtype=torch.long)
        self._finalized = True

    @property
    def current_sequences(self) -> Sequence[DSSequenceDescriptor]:
        return tuple(self._seqs)

    @property
    def current_tokens(self) -> int:
        return sum(t.numel() for t in self._tokens)

    @property
    def num_steps(self) -> int:
        return self._input_ids.shape[0]

    def step(self, index: int) -> Tuple[Tensor, Tensor]:
        """Token ids ``[rows]`` and int32 slot ids ``[rows]`` of launch ``index``."""
        return self._input_ids[index], self._slot_ids[index]

    def last_step(self) -> Tensor:
        """Per row, the launch that carries the sequence's last new token."""
        return self._last_step
