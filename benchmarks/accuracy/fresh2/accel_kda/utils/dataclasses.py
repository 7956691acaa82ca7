"""General namespace and dataclass related classes."""

from dataclasses import dataclass

import torch

WEIGHTS_NAME = "pytorch_model.bin"
OFFLOAD_INDEX_NAME = "index.json"


PRECISION_TO_DTYPE = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class ReplayCacheKwargs:
    """
    Sizes the ReplaySSM buffers used for decoding with a dispatched model.

    Args:
        num_slots (`int`, defaults to 2): request slots per layer.
        ring_len (`int`, defaults to 4): length of the d/k/g replay rings.
        mixed_precision (`str`, defaults to `"no"`): precision of the d/k rings. The checkpoint state and the gate
            ring stay in float32 (the kernel takes prefix sums of the log-decays).
    """

    num_slots: int = 2
    ring_len: int = 4
    mixed_precision: str = "no"

    @property
    def ring_dtype(self) -> torch.dtype:
        return PRECISION_TO_DTYPE[self.mixed_precision]

    def buffer_dtypes(self) -> dict[str, torch.dtype]:
        """dtype of each ReplaySSM buffer, keyed like the kernel arguments."""
        ring = self.ring_dtype
        return {"initial_state": torch.float32, "d_cache": ring, "k_cache": ring, "g_cache": torch.float32}
