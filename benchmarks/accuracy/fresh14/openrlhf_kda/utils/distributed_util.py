"""Single-process stand-in for the ``torch.distributed`` group OpenRLHF opens between the trainer
(rank 0) and the rollout engines for weight sync. ``broadcast`` from the source rank posts the
tensor to every other rank; the same call on a receiving rank copies the oldest posted tensor into
the given buffer."""

import collections
from datetime import timedelta

import torch

_GROUPS = {}


class StatelessProcessGroup:
    def __init__(self, group_name: str, world_size: int, rank: int):
        self.group_name = group_name
        self.world_size = world_size
        self.rank = rank
        mailboxes = _GROUPS.setdefault(group_name, {})
        self._mailboxes = mailboxes
        mailboxes.setdefault(rank, collections.deque())

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.rank == src:
            for rank in range(self.world_size):
                if rank != src:
                    self._mailboxes.setdefault(rank, collections.deque()).append(tensor.detach().clone())
            return tensor
        posted = self._mailboxes[self.rank].popleft()
        if posted.shape != tensor.shape or posted.dtype != tensor.dtype:
            raise RuntimeError(
                f"broadcast on {self.group_name!r}: posted {tuple(posted.shape)} {posted.dtype}, "
                f"receiving into {tuple(tensor.shape)} {tensor.dtype}"
            )
        tensor.copy_(posted)
        return tensor


def init_process_group(
    backend=None,
    init_method=None,
    timeout=timedelta(minutes=30),
    world_size: int = -1,
    rank: int = -1,
    group_name: str = "openrlhf",
) -> StatelessProcessGroup:
    """Joins (or opens) the named group; ``backend``/``init_method`` are accepted and ignored."""
    return StatelessProcessGroup(group_name, world_size, rank)


def destroy_process_group(group: StatelessProcessGroup) -> None:
    _GROUPS.pop(group.group_name, None)
