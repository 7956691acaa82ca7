"""Logging, data types and the ReplaySSM buffer policies (lightllm/utils/*)."""

import contextlib
import functools
import logging

import torch

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"

_DATA_TYPES = {
    "fp16": torch.float16,
    "float16": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "float32": torch.float32,
}

# Storage of the ReplaySSM buffers per memory-manager policy; "model" is the model's data_type.
DEFAULT_BUFFER_POLICY = {"state": "fp32", "delta": "model", "key": "model", "alpha": "fp32"}
# selected by the ``compact_state`` mode
COMPACT_BUFFER_POLICY = {  # expect-bug: imported-policy id=ll-compact
    "state": "fp32",
    "delta": "model",
    "key": "model",
    "alpha": "model",
}
REPLAY_BUFFER_POLICIES = {"default": DEFAULT_BUFFER_POLICY, "compact": COMPACT_BUFFER_POLICY}


def init_logger(name):
    logging.basicConfig(format=_FORMAT, datefmt="%m-%d %H:%M:%S")
    logger = logging.getLogger(name)
    logger.setLevel(logging.WARNING)
    return logger


def get_dtype(data_type):
    if isinstance(data_type, torch.dtype):
        return data_type
    if data_type not in _DATA_TYPES:
        raise ValueError(f"Unsupport datatype {data_type}!")
    return _DATA_TYPES[data_type]


def replay_buffer_dtypes(policy, data_type):
    return {
        name: data_type if value == "model" else get_dtype(value)
        for name, value in REPLAY_BUFFER_POLICIES[policy].items()
    }


def to_dtype(tensor, dtype):
    """``tensor`` in ``dtype``, without a copy when it already is."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


@contextlib.contextmanager
def torch_default_dtype(dtype):
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old_dtype)


def in_model_dtype(func):
    """Runs a model method with torch's default dtype set to the model's ``data_type``."""

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        with torch_default_dtype(self.data_type):
            return func(self, *args, **kwargs)

    return wrapper
