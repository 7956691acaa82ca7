"""Choose the decode kernel's fixed launch configs on a GPU (one H200 here).

A config is the V split (programs per (row, value head)) plus Helion's num_warps / num_stages.
For each regime of replaylint/kernels/_configs.py it times every candidate under CUDA-graph
replay on the problems that regime serves, checks each candidate's outputs against the first
candidate's, and keeps the fastest (sum of times over the regime's problems). Inputs are
steady-state: every row's cursor is staggered (``b % L``), so a launch mixes appends and
flushes as serving does (1 row in L flushes).

    python benchmarks/tune_decode_kernel.py [--out tune_decode_kernel.json] [--quick]

Prints a table and the ``CONFIGS`` dict to paste into replaylint/kernels/_configs.py; writes
every measurement to the JSON file (default: next to this script). Never runs in tests.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from replaylint.kernels import _kernel
from replaylint.kernels._configs import CONFIGS, config_key, fit_split, next_power_of_2, regime
from replaylint.kernels._decode import kernel_tensors
from replaylint.kernels._validate import validate_decode_args


@dataclass(frozen=True)
class Problem:
    name: str
    batch: int
    num_heads: int
    num_value_heads: int
    head_dim: int
    ring_len: int
    state_dtype: torch.dtype
    lower_bound: float | None = None

    @property
    def ring_dtype(self) -> torch.dtype:
        return self.state_dtype


def _kimi(batch: int, dtype: torch.dtype) -> Problem:
    label = "fp32" if dtype == torch.float32 else "bf16"
    return Problem(f"kimi-b{batch}-{label}", batch, 32, 32, 128, 16, dtype)


# Each regime is tuned on the problems it serves.
PROBLEMS: dict[str, list[Problem]] = {
    "small": [
        _kimi(1, torch.float32),
        _kimi(4, torch.bfloat16),
        Problem("k3tp8-b16-bf16", 16, 12, 12, 128, 16, torch.bfloat16, -5.0),
    ],
    "mid": [
        _kimi(16, torch.float32),
        _kimi(64, torch.float32),
        _kimi(16, torch.bfloat16),
        _kimi(64, torch.bfloat16),
    ],
    "fp32": [_kimi(256, torch.float32)],
    "half": [_kimi(256, torch.bfloat16)],
}


def _config(split: int, block_v: int, num_warps: int, **extra: Any) -> dict[str, Any]:
    return {
        "split": split,
        "block_sizes": [block_v],
        "num_warps": num_warps,
        "num_stages": 1,
        **extra,
    }


def _resident(programs_per_sm: int, maxnreg: int | None) -> dict[str, Any]:
    """A persistent grid of ``programs_per_sm`` programs per SM, registers capped at ``maxnreg``
    (Helion accepts ``maxnreg`` only with a persistent ``pid_type``)."""
    extra: dict[str, Any] = {
        "pid_type": "persistent_interleaved",
        "num_sm_multiplier": programs_per_sm,
    }
    if maxnreg is not None:
        extra["maxnreg"] = maxnreg
    return extra


# (split, V tile, warps, extras) per regime; the first is the shipped one, which every other
# candidate is checked against. History (H200): on 2026-11-29 a first version loaded its whole
# slice at once; splits 8 and 16 lost everywhere (the K-side work is repeated by every slice's
# program), then the V loop (tiles of 16, 2 warps) won at large B. The ncu profile of 2026-11-29
# (docs/benchmarks.md) showed that kernel limited by registers (128 fp32 / 145 bf16
# per thread: 25% / 18.75% occupancy) and instruction issue, not DRAM (53% / 32% of peak):
# moving the flush out of the V loop cut bf16 to 128 registers; the candidates below cap the
# registers further (persistent grids with maxnreg) to fit more programs per SM.
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "small": [_config(4, 32, 2), _config(2, 32, 4), _config(4, 32, 4)],
    "mid": [
        _config(2, 16, 2),
        _config(2, 16, 2, **_resident(12, 80)),
        _config(2, 32, 4),
    ],
    "large": [
        _config(1, 16, 2),
        _config(1, 16, 2, **_resident(8, None)),
        _config(1, 16, 2, **_resident(10, 96)),
        _config(1, 16, 2, **_resident(12, 80)),
        _config(1, 16, 2, **_resident(16, 64)),
    ],
}


def candidates(regime_name: str, quick: bool) -> list[dict[str, Any]]:
    grid = CANDIDATES[regime_name if regime_name in ("small", "mid") else "large"]
    return grid[:2] if quick else grid


def step_bytes(p: Problem) -> float:
    """Bytes one steady-state step must move (cursors uniform over the ring)."""
    K = V = p.head_dim
    s = torch.finfo(p.state_dtype).bits // 8
    r = torch.finfo(p.ring_dtype).bits // 8
    L = p.ring_len
    rows_read = (L - 1) / 2  # mean live ring rows
    flush = 1 / L
    per_head = (
        V * K * s  # read the checkpoint
        + rows_read * (K * 4 + K * r + V * r)  # live g, k, d rows
        + (1 - flush) * (K * 4 + V * r + K * r * p.num_heads / p.num_value_heads)  # append
        + flush * V * K * s  # fold at a flush
        + 2 * K * 2
        + V * 2
        + K * 2
        + V * 2  # q, k, v, a in, out (bf16 activations)
    )
    return p.batch * p.num_value_heads * per_head


def make_args(p: Problem) -> tuple[Any, ...]:
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    B, H, HV, K, L = p.batch, p.num_heads, p.num_value_heads, p.head_dim, p.ring_len
    V = K
    slots = B
    act = torch.bfloat16
    mixed = torch.randn(B, 2 * H * K + HV * V, generator=gen, device=dev).to(act)
    a = torch.randn(B, HV, K, generator=gen, device=dev).to(act)
    b = torch.randn(B, HV, generator=gen, device=dev).to(act)
    A_log = torch.linspace(-4.0, 0.5, HV, device=dev)
    dt_bias = 0.5 * torch.randn(HV, K, generator=gen, device=dev)
    # Realistic magnitudes: past deltas ~0.1, unit keys, negative log-decays.
    state = (0.1 * torch.randn(slots, HV, V, K, generator=gen, device=dev)).to(p.state_dtype)
    d = (0.1 * torch.randn(slots, HV, L, V, generator=gen, device=dev)).to(p.ring_dtype)
    k = torch.randn(slots, H, L, K, generator=gen, device=dev)
    k = (k / k.norm(dim=-1, keepdim=True)).to(p.ring_dtype)
    g = -0.5 * torch.rand(slots, HV, L, K, generator=gen, device=dev)
    out = torch.empty(B, 1, HV, V, dtype=act, device=dev)
    idx = torch.randperm(slots, generator=gen, device=dev).to(torch.int32)
    write_pos = (torch.arange(B, device=dev) % L).to(torch.int32)
    call = (mixed, a, b, A_log, dt_bias, K**-0.5, state, d, k, g, out, idx, write_pos)
    rest = (None, True, p.lower_bound)
    shapes = validate_decode_args(*call, *rest, reference=False)
    return shapes, call, rest


def kernel_args(
    p: Problem, split: int, prepared: tuple[Any, ...]
) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
    shapes, call, rest = prepared
    tensors = kernel_tensors(shapes, fit_split(split, p.head_dim), *call[:5], *call[6:13], rest[0])
    scalars = (
        float(call[5]),
        0.0 if p.lower_bound is None else float(p.lower_bound),
        True,
        p.lower_bound is not None,
        False,
        torch.int32,
        False,
    )
    return tensors, scalars


def time_config(p: Problem, config: dict[str, Any], prepared: tuple[Any, ...]) -> tuple[float, Any]:
    import triton.testing

    split = fit_split(config["split"], p.head_dim)
    helion_config = {name: value for name, value in config.items() if name != "split"}
    block_v = min(config["block_sizes"][0], next_power_of_2(p.head_dim // split))
    helion_config["block_sizes"] = [block_v]
    kernel = _kernel.compiled_kernel(config_key(helion_config), torch.int32)
    tensors, scalars = kernel_args(p, config["split"], prepared)
    call = prepared[1]
    state, d, k, g, out = call[6], call[7], call[8], call[9], call[10]
    saved = [t.clone() for t in (state, d, k, g)]

    def restore() -> None:
        for t, s in zip((state, d, k, g), saved, strict=True):
            t.copy_(s)

    kernel(*tensors, *scalars)  # compile
    restore()
    kernel(*tensors, *scalars)
    result = (out.clone(), state.clone(), d.clone())
    restore()
    # do_bench_cudagraph starts on a fresh side stream that does not wait for this one: without
    # a barrier its warm-up launch can land before the clones above and the restore.
    torch.cuda.synchronize()
    # The same launch repeated: each replay starts from the state the last one left, which
    # moves the same bytes (cursors are fixed, so the same rows append and flush).
    ms = triton.testing.do_bench_cudagraph(lambda: kernel(*tensors, *scalars), rep=100)
    restore()
    return ms * 1e3, result


def copy_bandwidth() -> float:
    import triton.testing

    n = 1 << 28  # 1 GiB of fp32
    src = torch.empty(n, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200)
    return 2 * n * 4 / (float(ms) * 1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    parser.add_argument("--quick", action="store_true", help="the finalists only")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tune_decode_kernel.py needs a CUDA device")
    import triton

    bandwidth = copy_bandwidth()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "helion": metadata.version("helion"),
        "copy_bandwidth_TBps": bandwidth / 1e12,
        "regimes": {},
        "selected": {},
    }
    print(f"{report['device']}  copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    for name, problems in PROBLEMS.items():
        for p in problems:
            pairs = p.batch * p.num_value_heads
            assert regime(p.state_dtype, pairs) == name, (p, name)
        args = {p.name: make_args(p) for p in problems}
        rows = []
        reference: dict[str, Any] = {}
        for config in candidates(name, opts.quick):
            entry: dict[str, Any] = {"config": config, "us": {}, "ok": True}
            for p in problems:
                try:
                    us, result = time_config(p, config, args[p.name])
                except Exception as error:  # a config that fails to compile is skipped
                    entry["ok"] = False
                    entry["error"] = f"{type(error).__name__}: {error}"[:300]
                    break
                if p.name not in reference:
                    reference[p.name] = result
                else:
                    for got, want in zip(result, reference[p.name], strict=True):
                        err = (got.double() - want.double()).norm() / want.double().norm()
                        # Configs differ only in summation order: fp32 values agree to ~1e-7,
                        # bf16 ones to about one bf16 rounding (2^-8) in a few elements.
                        tol = 1e-5 if got.dtype == torch.float32 else 5e-3
                        if not err < tol:
                            entry["ok"] = False
                            entry["error"] = f"mismatch on {p.name}: {float(err):.2e}"
                entry["us"][p.name] = us
            if entry["ok"]:
                entry["total_us"] = sum(entry["us"].values())
            rows.append(entry)
            shown = " ".join(f"{k}={v:8.1f}us" for k, v in entry["us"].items())
            print(
                f"{name:5s} {json.dumps(config):50s} {shown} {'' if entry['ok'] else entry['error']}"
            )
        good = [r for r in rows if r["ok"]]
        best = min(good, key=lambda r: r["total_us"])
        report["regimes"][name] = rows
        report["selected"][name] = best["config"]
        opts.out.write_text(json.dumps(report, indent=2))  # partial results survive a timeout
        for p in problems:
            us = best["us"][p.name]
            gbps = step_bytes(p) / (us * 1e-6) / 1e9
            print(
                f"  best {name}: {p.name} {us:.1f} us, {step_bytes(p) / 1e6:.1f} MB/step, "
                f"{gbps:.0f} GB/s ({100 * gbps * 1e9 / bandwidth:.0f}% of copy), "
                f"floor {step_bytes(p) / bandwidth * 1e6:.1f} us"
            )
    opts.out.write_text(json.dumps(report, indent=2))
    print("\nCONFIGS = " + json.dumps(report["selected"], indent=4))
    print(f"(previously shipped: {json.dumps(CONFIGS)})")
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
