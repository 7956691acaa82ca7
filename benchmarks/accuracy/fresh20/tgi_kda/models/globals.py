"""Server-wide settings, read once from the launcher's environment."""

import os
from typing import Dict, Optional

import torch

PREFIX_CACHING = os.getenv("PREFIX_CACHING", "0").lower() in {"1", "true"}
ATTENTION = os.getenv("ATTENTION", "replay")
_expected = {"replay", "recurrent"}
assert (
    ATTENTION in _expected
), f"Attention is not valid {ATTENTION}, expected {_expected}"

# Ring length of the ReplaySSM caches: the checkpoint state is rewritten once every
# REPLAY_RING_LENGTH decode steps.
REPLAY_RING_LENGTH = int(os.getenv("REPLAY_RING_LENGTH", "16"))

cuda_graphs = os.getenv("CUDA_GRAPHS")
if cuda_graphs is not None:
    try:
        cuda_graphs = [int(item) for item in cuda_graphs.split(",")]
    except Exception as e:
        raise RuntimeError(
            f"Could not parse cuda graphs {cuda_graphs}, expected comma separated list for batch sizes to run on: {e}"
        )
elif torch.cuda.is_available():
    cuda_graphs = [1, 2, 4, 8, 16, 32]
else:
    cuda_graphs = None
if cuda_graphs is not None:
    cuda_graphs.sort(reverse=True)

CUDA_GRAPHS = cuda_graphs

_DTYPES = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise RuntimeError(f"Unknown dtype {name}, expected one of {sorted(_DTYPES)}")


# dtype of the delta and key rings (and of the checkpoint state unless KDA_STATE_DTYPE says
# otherwise). "auto" follows the model dtype.
KDA_CACHE_DTYPE = os.getenv("KDA_CACHE_DTYPE", "auto")
KDA_STATE_DTYPE = os.getenv("KDA_STATE_DTYPE", "auto")


def get_cache_dtype(dtype: torch.dtype) -> torch.dtype:
    if KDA_CACHE_DTYPE == "auto":
        return dtype
    return parse_dtype(KDA_CACHE_DTYPE)


def get_state_dtype(dtype: torch.dtype) -> torch.dtype:
    if KDA_STATE_DTYPE == "auto":
        return get_cache_dtype(dtype)
    return parse_dtype(KDA_STATE_DTYPE)


# The gate ring holds per-step log-decays that are summed before exponentiation; it is kept
# in float32 whatever the model and cache dtypes are.
REPLAY_GATE_DTYPE = torch.float32

MODEL_ID = None


def set_model_id(model_id: str):
    global MODEL_ID
    MODEL_ID = model_id


# NOTE: eventually we should move this into the router and pass back the
# index in all cases.
ADAPTER_TO_INDEX: Optional[Dict[str, int]] = None


def set_adapter_to_index(adapter_to_index: Dict[str, int]):
    global ADAPTER_TO_INDEX
    ADAPTER_TO_INDEX = adapter_to_index


def get_adapter_to_index():
    global ADAPTER_TO_INDEX
    return ADAPTER_TO_INDEX
