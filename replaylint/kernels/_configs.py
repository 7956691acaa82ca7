"""Fixed launch configs for the decode kernel, one per regime, chosen on an H200.

A config is the V split (how many programs share one (row, value head): each takes
``V / split`` rows of the state), how a flushing program forms its ring term (``"dot"``: one
matrix product per V tile at ``dot_precision``; ``"rows"``: row by row over the ring), plus
Helion's config: the V tile each program loops over (``block_sizes``), ``num_warps`` and
``num_stages``.

Chosen with ``benchmarks/tune_decode_kernel.py`` on one NVIDIA H200 (torch 2.11, triton 3.6,
helion 1.5.0; output in ``benchmarks/tune_decode_kernel.json``, summary in
docs/benchmarks.md): kernel-only times under CUDA-graph replay, steady-state cursors (1 row in
16 flushes), H = HV = 32, K = V = 128 and Kimi-K3's TP8 shape (HV = 12, lower bound -5).
One warp per program won every regime but the smallest (summed over the regime's problems):
the K reductions stay inside a warp (lane shuffles, no shared-memory round trips or barriers)
and an SM holds the most programs, so the most loads are in flight. The flush's ring term as
an exact float32 ("ieee") matrix product beat its tf32x3 tensor-core form wherever both were
timed (the tf32x3 operand splits double the live registers). Below 128 (row, head) pairs
(B = 1..3 at 32 heads) the launch is one short wave whose time is one program's latency:
split 8 with two warps per program was fastest there (kernel-only 4.8 / 5.0 us at B = 1 fp32 /
bf16, against 6.6 / 7.1 with split 4). bf16 state at large B runs in two passes (appending
rows, then flushing rows; each launch compiled without the other's branch): the append pass
needs 151 registers instead of 220, so 12 programs fit on an SM instead of 8 (ncu), and the
step ran 180 us against 199 (one pass, matrix-product flush) and 202 (one pass, row by row)
at B = 256. fp32 state gains nothing from it (227 against 211 us): its append pass is no
faster at the higher occupancy (DRAM-bound at 72% of peak), and the second launch adds
~8 us. Two passes lose at small B, where the flushing rows' programs then run after, not
beside, the appending ones (B = 16: 28.5 against 15.8 us). The "mid" regime was timed with
tf32x3 candidates only (split 2 won); it ships split 2 with the ieee product, as its neighbours
do (docs/benchmarks.md has its numbers in that config).

The kernel never autotunes at call time: a call picks one of these by the number of
(row, value head) pairs it launches and the state's dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "ALL_ROWS",
    "APPEND_ROWS",
    "CONFIGS",
    "FLUSH_ROWS",
    "Config",
    "ConfigKey",
    "LaunchConfig",
    "config_from_key",
    "config_key",
    "launch_config",
    "next_power_of_2",
    "regime",
]

# Plain dicts: "split", "flush" and "dot_precision" for the launch, the rest are helion.Config
# keyword arguments (helion is imported only when a kernel runs).
Config = dict[str, Any]

# Regimes by the number of (row, value head) pairs B * HV ("micro": B < 4 at 32 heads, a
# single wave of programs whose time is one program's latency; "tiny": B < 16 at 32 heads, or
# a few rows at 4 / 12 local heads; "small": B = 16..31; "mid": up to B = 127), then the
# state dtype ("fp32" or "half" for bf16 / fp16).
MICRO_PAIRS = 128
TINY_PAIRS = 512
SMALL_PAIRS = 1024
MID_PAIRS = 4096

_LAUNCH_KEYS = ("split", "flush", "dot_precision", "passes")

# Which rows one launch of the decode body serves (its ``phase``): every row, or, for a step in
# two passes, the appending rows and then the flushing ones. Each pass compiles only its own
# branch, so the append pass keeps none of the flush's registers live.
ALL_ROWS = 0
APPEND_ROWS = 1
FLUSH_ROWS = 2


def _one_warp(split: int, flush: str = "dot", passes: int = 1, num_warps: int = 1) -> Config:
    return {
        "split": split,
        "flush": flush,
        "dot_precision": "ieee",
        "passes": passes,
        "block_sizes": [16],
        "num_warps": num_warps,
        "num_stages": 1,
    }


CONFIGS: dict[str, Config] = {
    "micro-fp32": _one_warp(8, num_warps=2),
    "micro-half": _one_warp(8, num_warps=2),
    "tiny-fp32": _one_warp(4),
    "tiny-half": _one_warp(8),
    "small-fp32": _one_warp(2),
    "small-half": _one_warp(2),
    "mid-fp32": _one_warp(2),
    "mid-half": _one_warp(2),
    "large-fp32": _one_warp(1),
    "large-half": _one_warp(1, passes=2),
}


def regime(state_dtype: torch.dtype, pairs: int) -> str:
    """The regime a launch falls in: by its (row, value head) count, then the state dtype."""
    if pairs < MICRO_PAIRS:
        size = "micro"
    elif pairs < TINY_PAIRS:
        size = "tiny"
    elif pairs < SMALL_PAIRS:
        size = "small"
    elif pairs < MID_PAIRS:
        size = "mid"
    else:
        size = "large"
    return f"{size}-{'fp32' if state_dtype == torch.float32 else 'half'}"


@dataclass(frozen=True)
class LaunchConfig:
    """Everything a launch fixes: the V split, the flush form, and Helion's config."""

    split: int
    block_v: int
    flush_by_dot: bool
    dot_precision: str
    helion: ConfigKey  # hashable helion.Config keyword arguments
    passes: int = 1  # 2: the appending rows and the flushing rows in separate launches

    @property
    def phases(self) -> tuple[int, ...]:
        """The kernel body's ``phase`` for each launch of a step, in order."""
        return (ALL_ROWS,) if self.passes == 1 else (APPEND_ROWS, FLUSH_ROWS)


def launch_config(config: Config, head_k_dim: int, head_v_dim: int, ring_len: int) -> LaunchConfig:
    """A regime's config fitted to a shape: the split made to divide V, the V tile clipped to
    the slice, and the flush's matrix product used only where every dimension is >= 16 (the
    tensor-core minimum; smaller shapes walk the ring row by row)."""
    return _fitted(config_key(config), head_k_dim, head_v_dim, ring_len)


@functools.lru_cache(maxsize=256)
def _fitted(config: ConfigKey, head_k_dim: int, head_v_dim: int, ring_len: int) -> LaunchConfig:
    chosen = config_from_key(config)
    split = fit_split(int(chosen["split"]), head_v_dim)
    helion_config = {name: value for name, value in chosen.items() if name not in _LAUNCH_KEYS}
    block_v = min(int(helion_config["block_sizes"][0]), next_power_of_2(head_v_dim // split))
    helion_config["block_sizes"] = [block_v]
    by_dot = (
        chosen.get("flush", "rows") == "dot"
        and min(block_v, next_power_of_2(ring_len), next_power_of_2(head_k_dim)) >= 16
    )
    return LaunchConfig(
        split=split,
        block_v=block_v,
        flush_by_dot=by_dot,
        dot_precision=str(chosen.get("dot_precision", "tf32x3")),
        helion=config_key(helion_config),
        passes=2 if int(chosen.get("passes", 1)) == 2 else 1,
    )


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
