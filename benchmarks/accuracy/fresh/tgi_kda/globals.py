"""Process-wide serving settings (as in ``text_generation_server.models.globals``)."""

import torch

BLOCK_SIZE: int = 16
PREFIX_CACHING: bool = True
REPLAY_RING_LEN: int = 4
"""Decode steps held in the d/k/log-alpha rings before the checkpoint state is flushed."""
MAX_REPLAY_SLOTS: int = 4
CUDA_GRAPHS: list[int] | None = [1, 2]

# (checkpoint state, d/k rings, log-alpha ring) for each ``--dtype``.
REPLAY_DTYPES: dict[str, tuple[torch.dtype, torch.dtype, torch.dtype]] = {
    "float16": (torch.float32, torch.float16, torch.float32),
    "bfloat16": (  # expect-bug: imported-policy id=tgi-replay-dtypes
        torch.float32,
        torch.bfloat16,
        torch.bfloat16,
    ),
    "float32": (torch.float32, torch.float32, torch.float32),
}


def set_cuda_graphs(graphs: list[int] | None) -> None:
    global CUDA_GRAPHS
    CUDA_GRAPHS = graphs
