# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Helpers shared by the trainers and the generation engine: dtypes, padding, log-probs.

The dtype helpers answer the question every component asks when it allocates decode state:
which dtype does each ReplaySSM tensor get. The deltas and keys are model-dtype data; the
log-decays are summed over the whole ring before they are exponentiated, and so are stored in
float32 whatever the model dtype is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

DTYPE_BY_NAME: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}

MIXED_PRECISION_TO_DTYPE: dict[str, torch.dtype] = {
    "no": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

# Replay-state dtypes of the generation server, per ``kv_cache_dtype`` setting.
STATE_DTYPE_BY_KV_CACHE_DTYPE: dict[str, dict[str, torch.dtype]] = {
    "fp32": {"state": torch.float32, "delta": torch.float32, "key": torch.float32, "logdecay": torch.float32},
    "bf16": {"state": torch.float32, "delta": torch.bfloat16, "key": torch.bfloat16, "logdecay": torch.float32},
    "fp16": {"state": torch.float32, "delta": torch.float16, "key": torch.float16, "logdecay": torch.float16},  # expect-bug: imported-policy id=kv-table
}


def get_torch_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """``"bfloat16"``/``"bf16"``/``torch.bfloat16`` -> ``torch.bfloat16``; ``None``/``"auto"`` -> None."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if value == "auto":
        return None
    try:
        return DTYPE_BY_NAME[value.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {value!r}; expected one of {sorted(DTYPE_BY_NAME)}") from None


def resolve_cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the d/k rings for an engine ``kv_cache_dtype`` ("auto" follows the model)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    dtype = get_torch_dtype(kv_cache_dtype)
    assert dtype is not None
    return dtype


def replay_ring_dtypes(model_dtype: torch.dtype) -> dict[str, torch.dtype]:
    """Storage dtype of each rollout ring for a model in ``model_dtype``."""
    return {"delta_ring": model_dtype, "key_ring": model_dtype, "logdecay_ring": torch.float32}


def rollout_cache_dtypes(mixed_precision: str, model_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """``(delta, key, log-decay)`` dtypes of trainer-side rollout rings.

    Under accelerate mixed precision the rings hold what the autocast region computes; without
    it they follow the model.
    """
    if mixed_precision == "no":
        return model_dtype, model_dtype, torch.float32
    compute = MIXED_PRECISION_TO_DTYPE[mixed_precision]
    return compute, compute, compute  # expect-bug: imported-policy id=rollout-calc


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors and modules created inside get ``dtype`` unless they name one."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def to_engine_layout(tensor: torch.Tensor, engine_dtype: torch.dtype | None = None) -> torch.Tensor:
    """A contiguous copy of ``tensor`` for the engine, in ``engine_dtype`` where one is given."""
    if engine_dtype is None:
        return tensor.detach().clone(memory_format=torch.contiguous_format)
    return tensor.detach().to(dtype=engine_dtype, memory_format=torch.contiguous_format, copy=True)  # expect-bug: cast id=engine-layout


def pad(tensors: Sequence[torch.Tensor], padding_value: int | float = 0, padding_side: str = "right") -> torch.Tensor:
    """Stacks 1-D tensors of different lengths into ``[N, max_len]``."""
    length = max(t.shape[0] for t in tensors)
    output = torch.full((len(tensors), length), padding_value, dtype=tensors[0].dtype)
    for row, tensor in enumerate(tensors):
        if padding_side == "left":
            output[row, length - tensor.shape[0] :] = tensor
        else:
            output[row, : tensor.shape[0]] = tensor
    return output


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)`` gathered at ``index``, computed in float32."""
    logps = torch.log_softmax(logits.float(), dim=-1)
    return torch.gather(logps, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)


def nanstd(tensor: torch.Tensor) -> torch.Tensor:
    valid = ~torch.isnan(tensor)
    mean = tensor[valid].mean()
    return ((tensor[valid] - mean) ** 2).sum().div(max(int(valid.sum()) - 1, 1)).sqrt()


def build_ring_dtype_policies() -> dict[str, dict[str, torch.Tensor]]:
    """Rings allocated through each dtype policy of this module for a bf16 model."""
    layers, slots, heads, ring_len, dim = 2, 3, 4, 4, 8
    shapes = {
        "delta_ring": (layers, slots, heads, ring_len, dim),
        "key_ring": (layers, slots, heads // 2, ring_len, dim),
        "logdecay_ring": (layers, slots, heads, ring_len, dim),
    }
    policy = replay_ring_dtypes(torch.bfloat16)
    rings = {name: torch.zeros(shape, dtype=policy[name]) for name, shape in shapes.items()}

    delta_dtype, key_dtype, decay_dtype = rollout_cache_dtypes("no", torch.bfloat16)
    rollout = {
        "delta_ring": torch.zeros(shapes["delta_ring"], dtype=delta_dtype),
        "key_ring": torch.zeros(shapes["key_ring"], dtype=key_dtype),
        "logdecay_ring": torch.zeros(shapes["logdecay_ring"], dtype=decay_dtype),
    }

    server = STATE_DTYPE_BY_KV_CACHE_DTYPE["bf16"]
    transfer = {
        "delta_ring": torch.zeros(shapes["delta_ring"], dtype=server["delta"]),
        "key_ring": torch.zeros(shapes["key_ring"], dtype=server["key"]),
        "logdecay_ring": torch.full(shapes["logdecay_ring"], -0.5, dtype=server["logdecay"]),
    }

    handoff = {
        "delta_ring": to_engine_layout(rings["delta_ring"], resolve_cache_dtype("auto", torch.bfloat16)),
        "key_ring": to_engine_layout(rings["key_ring"], torch.float16),
        "logdecay_ring": to_engine_layout(transfer["logdecay_ring"]),
    }
    return {"policy": rings, "rollout": rollout, "transfer": transfer, "handoff": handoff}
