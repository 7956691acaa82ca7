"""dtype name tables shared by the executor and the model code."""

import torch

_str_to_torch_dtype_dict = dict(
    bfloat16=torch.bfloat16,
    float16=torch.float16,
    float32=torch.float32,
    int64=torch.int64,
    int32=torch.int32,
    int8=torch.int8,
    bool=torch.bool,
    fp8=torch.float8_e4m3fn,
)

_torch_to_str_dtype_dict = {v: k for k, v in _str_to_torch_dtype_dict.items()}


def str_dtype_to_torch(dtype: str) -> torch.dtype:
    ret = _str_to_torch_dtype_dict.get(dtype)
    assert ret is not None, f"Unsupported dtype: {dtype}"
    return ret


def torch_dtype_to_str(dtype: torch.dtype) -> str:
    return _torch_to_str_dtype_dict[dtype]


def binding_to_torch_dtype(binding_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    return model_dtype if binding_dtype == "auto" else str_dtype_to_torch(binding_dtype)

# Activation-side caches (conv state, d/k rings) default to bf16 on Hopper.
DEFAULT_REPLAY_DTYPE = torch.bfloat16
