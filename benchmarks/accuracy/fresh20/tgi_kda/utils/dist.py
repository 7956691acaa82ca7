import os
from datetime import timedelta

import torch

# Tensor Parallelism settings
RANK = int(os.getenv("RANK", "0"))
WORLD_SIZE = int(os.getenv("WORLD_SIZE", "1"))


class FakeBarrier:
    def wait(self):
        pass


class FakeGroup:
    """Stands in for a process group when the model runs on a single shard."""

    def __init__(self, rank, size):
        self._rank = rank
        self._size = size

    def allreduce(self, *args, **kwargs):
        return FakeBarrier()

    def barrier(self, *args, **kwargs):
        return FakeBarrier()

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def initialize_torch_distributed():
    if WORLD_SIZE == 1:
        return FakeGroup(RANK, WORLD_SIZE), RANK, WORLD_SIZE

    if torch.cuda.is_available():
        assert WORLD_SIZE <= torch.cuda.device_count(), "Each process is one gpu"
        torch.cuda.set_device(RANK % torch.cuda.device_count())
        backend = "nccl"
    else:
        backend = "gloo"
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend=backend, world_size=WORLD_SIZE, rank=RANK, timeout=timedelta(seconds=60)
        )
    return torch.distributed.group.WORLD, RANK, WORLD_SIZE
