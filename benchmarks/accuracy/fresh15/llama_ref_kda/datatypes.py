# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

"""Enums and small value types shared by the model, the generator and the quantizers."""

from enum import Enum
from typing import Any, Dict, NamedTuple

import torch


class QuantizationMode(str, Enum):
    none = "none"
    fp8_mixed = "fp8_mixed"
    int4_mixed = "int4_mixed"


class CacheDtype(Enum):
    """Names accepted for the ``dtype``, ``cache_dtype`` and ``logdecay_cache_dtype`` params."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.value]

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()


DTYPE_BY_NAME: Dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


class RingDtypes(NamedTuple):
    """Dtypes of one KDA layer's decode cache.

    The checkpoint state and the delta/key rings follow the model; the log-decay ring is summed
    and exponentiated over its whole length at every step, so it is kept in float32.
    """

    state: torch.dtype
    delta: torch.dtype
    key: torch.dtype
    logdecay: torch.dtype


def ring_dtypes(params: Any) -> RingDtypes:
    """The cache dtypes that ``params`` (a ``ModelArgs``) asks for."""
    model_dtype = CacheDtype(params.cache_dtype).torch_dtype
    return RingDtypes(
        state=model_dtype,
        delta=model_dtype,
        key=model_dtype,
        logdecay=CacheDtype(params.logdecay_cache_dtype).torch_dtype,
    )


def activation_dtype(params: Any) -> torch.dtype:
    """Dtype of the activations between layers; quantized checkpoints run them in bf16."""
    quant = getattr(params, "quantization_args", None)
    if quant is not None and QuantizationMode(quant.mode) != QuantizationMode.none:
        return torch.bfloat16
    return DTYPE_BY_NAME[params.dtype]


def ring_bytes_per_slot(params: Any) -> int:
    """Bytes that one cache slot takes in every layer together."""
    dtypes = ring_dtypes(params)
    hv, h, k, v, length = (
        params.n_v_heads,
        params.n_heads,
        params.head_dim,
        params.v_head_dim,
        params.ring_len,
    )
    size = lambda dtype: torch.empty((), dtype=dtype).element_size()  # noqa: E731
    per_layer = (
        hv * v * k * size(dtypes.state)
        + hv * length * v * size(dtypes.delta)
        + h * length * k * size(dtypes.key)
        + hv * length * k * size(dtypes.logdecay)
        + 4
    )
    return per_layer * params.n_layers
