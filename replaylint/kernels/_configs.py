"""Fixed Helion configs for the decode kernel, one per regime, chosen on an H200.

Chosen with ``benchmarks/tune_decode_kernel.py`` (last run: ``--quick``, 2026-11-29, NVIDIA H200,
torch 2.11, triton 3.6, helion 1.5.0; output in ``benchmarks/tune_decode_kernel.json``). Earlier
full sweeps that day (block_v 16/32/64 x 2/4/8 warps x both grid orders, and pipelining of the
V loop) found: 8 warps 1.5-2x slower everywhere, block_v 64 spilling at B = 256 but best at
small B, and ``range_num_stages=2`` within 0.1 us of the same config without it. Times under
CUDA-graph replay, steady-state cursors (1 row in 16 flushes):

* ``fp32``  (Kimi B = 256, fp32 state and rings): 268.0 us (block_v 32 / 4 warps: 276.8 us);
* ``half``  (Kimi B = 256, bf16 state and rings): 235.8 us (block_v 32 / 4 warps: 279.3 us);
* ``small`` (Kimi B = 4, fp32 / bf16; K3 TP8 HV = 12, B = 16): 7.2 / 7.1 / 14.7 us.

The pipelined variants tied within noise; the entries below are the ones the GPU test suite ran
with. The kernel never autotunes at call time: a call picks one of these by the state dtype and
the number of (row, value head) programs it launches.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ConfigKey", "config_from_key", "config_key", "interpreter_block_v", "select_config"]

# Plain dicts of helion.Config keyword arguments (helion is imported only when a kernel runs).
Config = dict[str, Any]

# "small": fewer than SMALL_GRID programs (B * HV), e.g. 4 or 12 local heads at TP8, or small B.
# With few programs each one's serial V loop is the latency; a wide V tile shortens it.
SMALL_GRID = 512

CONFIGS: dict[str, Config] = {
    "fp32": {"block_sizes": [16], "num_warps": 2, "num_stages": 1, "loop_orders": [[1, 0]]},
    "half": {"block_sizes": [16], "num_warps": 2, "num_stages": 1, "loop_orders": [[1, 0]]},
    "small": {"block_sizes": [64], "num_warps": 4, "num_stages": 1, "loop_orders": [[0, 1]]},
}


def regime(state_dtype: torch.dtype, programs: int) -> str:
    """The regime a launch falls in: by its grid size, then by the state's dtype."""
    if programs < SMALL_GRID:
        return "small"
    return "fp32" if state_dtype == torch.float32 else "half"


def select_config(state_dtype: torch.dtype, programs: int, head_v_dim: int) -> Config:
    """The fixed config for a launch, its V tile clipped to the value dimension."""
    config = dict(CONFIGS[regime(state_dtype, programs)])
    block_v = min(config["block_sizes"][0], _next_power_of_2(head_v_dim))
    config["block_sizes"] = [max(block_v, 1)]
    return config


# A config as a hashable key (nested lists become tuples), so compiled kernels can be cached.
ConfigKey = tuple[tuple[str, Any], ...]


def config_key(config: Config) -> ConfigKey:
    return tuple((name, _freeze(value)) for name, value in sorted(config.items()))


def config_from_key(key: ConfigKey) -> Config:
    return {name: _thaw(value) for name, value in key}


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, (list, tuple)) else value


def _thaw(value: Any) -> Any:
    return [_thaw(v) for v in value] if isinstance(value, (list, tuple)) else value


def interpreter_block_v(head_v_dim: int) -> int:
    """The interpreter takes all of V in one tile: fewer Python iterations, the same math."""
    return _next_power_of_2(head_v_dim)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
