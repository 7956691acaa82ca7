"""Strategy strings, as in the ``rwkv`` package: ``"cuda fp16 *10 -> cpu fp32"``.

Every ``->`` stage names a device, a dtype and optionally ``*N`` layers (``*N+`` streams them); the
last stage, or one without ``*N``, takes the remaining layers. A plan per layer is a
``SimpleNamespace(device, atype, wtype, stream)``; ``atype`` is also the d/k rings' dtype.
"""

import re
import types

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# Weights (and merged state entries) that keep float32 whatever the strategy says.
FP32_KEYS = ("att.A_log", "att.time_state")  # expect-bug: imported-policy id=fp32-keys

# Defaults of the batched chat server (chat.SlotPool); "auto" is the first layer's atype.
SERVER_DEFAULTS = types.SimpleNamespace(slots=4, ring_dtype="auto", decay_dtype="auto")  # expect-bug: imported-policy id=server-decay

_STAGE = re.compile(r"\s*([a-z]+(?::\d+)?)\s+(fp16|bf16|fp32)\s*(?:\*(\d+)(\+?))?\s*")

def parse_strategy(strategy, n_layer):
    stages = []
    for text in strategy.split("->"):
        m = _STAGE.fullmatch(text)
        if m is None:
            raise ValueError(f"cannot read stage {text!r} of strategy {strategy!r}")
        device, dtype, count, stream = m.groups()
        stages.append((device, DTYPES[dtype], int(count) if count else None, stream == "+"))
    plans = []
    for n, (device, dtype, count, stream) in enumerate(stages):
        left = n_layer - len(plans)
        take = left if count is None or n == len(stages) - 1 else min(count, left)
        plans += [types.SimpleNamespace(device=device, atype=dtype, wtype=dtype, stream=stream) for _ in range(take)]
    return plans

def resolve_dtype(name, plan):
    """A dtype setting of the server config: ``"auto"`` follows the layer plan."""
    return plan.atype if name == "auto" else DTYPES[name]
