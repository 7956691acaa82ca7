"""Fixed launch configs for the decode kernel, one per regime, chosen on an H200.

A config is the V split (how many programs share one (row, value head): each takes
``V / split`` rows of the state) plus Helion's config: the V tile each program loops over
(``block_sizes``), ``num_warps`` and ``num_stages`` (and, in tuning candidates, a persistent
``pid_type`` with ``maxnreg``).

Chosen with ``benchmarks/tune_decode_kernel.py`` (2026-11-29, NVIDIA H200, torch
2.11, triton 3.6, helion 1.5.0; output in ``benchmarks/tune_decode_kernel.json``) for the kernel
body whose flush runs outside the V loop. Kernel-only times under CUDA-graph replay of one
repeated launch, steady-state cursors (1 row in 16 flushes), H = HV = 32, K = V = 128:

* ``small`` (B * HV < 512): split 4, V tile 32, 2 warps: B = 1 fp32 4.9 us, B = 4 bf16 7.0 us,
  K3 TP8 (HV = 12, lb = -5) B = 16 bf16 12.0 us;
* ``mid`` (512 <= B * HV < 4096): split 2, V tile 16, 2 warps: B = 16 / 64 fp32 29.7 / 84.7 us,
  bf16 25.2 / 69.5 us;
* ``fp32`` / ``half`` (larger launches): split 1, V tile 16, 2 warps: B = 256 265.3 / 220.6 us.
  Persistent grids with capped registers (``maxnreg`` 96 / 80 / 64, 10 / 12 / 16 programs per
  SM) were 284.5 / 277.6 / 313.0 us (fp32) and 228.1 / 217.7 / 253.2 us (bf16); the tuner
  picked maxnreg 80 for bf16 by 1.3%, but in the decode benchmark (16 launches with different
  inputs and rotating flush rows) it ran at 250.3 us against ~220 us for this flat grid, whose
  hardware scheduler balances the longer flushing programs; so the flat grid ships everywhere.

Every candidate was checked against the first on the same inputs: outputs, state and rings
agree to 1e-5 (fp32) / 5e-3 (bf16 outputs). The kernel never autotunes at call time: a call
picks one of these by the number of (row, value head) pairs it launches and the state's dtype.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "ConfigKey",
    "config_from_key",
    "config_key",
    "regime",
    "select_config",
]

# Plain dicts: "split" for the launch, the rest are helion.Config keyword arguments (helion is
# imported only when a kernel runs).
Config = dict[str, Any]

# Regimes by the number of (row, value head) pairs B * HV: "small" (e.g. B < 16 at 32 heads,
# or 4 / 12 local heads at TP8), "mid", then the large regimes by state dtype.
SMALL_PAIRS = 512
MID_PAIRS = 4096

CONFIGS: dict[str, Config] = {
    "small": {"split": 4, "block_sizes": [32], "num_warps": 2, "num_stages": 1},
    "mid": {"split": 2, "block_sizes": [16], "num_warps": 2, "num_stages": 1},
    "fp32": {"split": 1, "block_sizes": [16], "num_warps": 2, "num_stages": 1},
    "half": {"split": 1, "block_sizes": [16], "num_warps": 2, "num_stages": 1},
}


def regime(state_dtype: torch.dtype, pairs: int) -> str:
    """The regime a launch falls in: by its (row, value head) count, then the state dtype."""
    if pairs < SMALL_PAIRS:
        return "small"
    if pairs < MID_PAIRS:
        return "mid"
    return "fp32" if state_dtype == torch.float32 else "half"


def select_config(
    state_dtype: torch.dtype, pairs: int, head_v_dim: int, configs: dict[str, Config] | None = None
) -> tuple[int, Config]:
    """The V split and the Helion config for a launch (the split made to divide V, the V tile
    clipped to the slice)."""
    chosen = (CONFIGS if configs is None else configs)[regime(state_dtype, pairs)]
    split = fit_split(int(chosen["split"]), head_v_dim)
    helion_config = {name: value for name, value in chosen.items() if name != "split"}
    block_v = min(int(helion_config["block_sizes"][0]), next_power_of_2(head_v_dim // split))
    helion_config["block_sizes"] = [block_v]
    return split, helion_config


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def fit_split(split: int, head_v_dim: int) -> int:
    """The largest divisor of V not above ``split`` (V = 96 with split 8 gives 8; V = 20, 5)."""
    split = max(1, min(split, head_v_dim))
    while head_v_dim % split:
        split -= 1
    return split


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
