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
from replaylint.kernels._configs import CONFIGS, launch_config, regime
from replaylint.kernels._decode import index_dtype, kernel_arguments, kernel_tensors
from replaylint.kernels._validate import DecodeArgs, ValidDecode, validate_decode_args


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


def _k3(batch: int, dtype: torch.dtype) -> Problem:
    label = "fp32" if dtype == torch.float32 else "bf16"
    return Problem(f"k3tp8-b{batch}-{label}", batch, 12, 12, 128, 16, dtype, -5.0)


# Each regime is tuned on the problems it serves.
PROBLEMS: dict[str, list[Problem]] = {
    "micro-fp32": [_kimi(1, torch.float32)],
    "micro-half": [_kimi(1, torch.bfloat16)],
    "tiny-fp32": [_k3(16, torch.float32)],
    "tiny-half": [_k3(16, torch.bfloat16)],
    "small-fp32": [_kimi(16, torch.float32)],
    "small-half": [_kimi(16, torch.bfloat16)],
    "mid-fp32": [_kimi(64, torch.float32), _k3(256, torch.float32)],
    "mid-half": [_kimi(64, torch.bfloat16), _k3(256, torch.bfloat16)],
    "large-fp32": [_kimi(256, torch.float32)],
    "large-half": [_kimi(256, torch.bfloat16)],
}


def _config(
    split: int,
    block_v: int = 16,
    num_warps: int = 1,
    flush: str = "dot",
    num_stages: int = 1,
    dot_precision: str = "ieee",
    passes: int = 1,
) -> dict[str, Any]:
    return {
        "split": split,
        "flush": flush,
        "dot_precision": dot_precision,
        "passes": passes,
        "block_sizes": [block_v],
        "num_warps": num_warps,
        "num_stages": num_stages,
    }


# Candidates per regime size; the first is checked against every other on the same inputs.
# History (H200): two warps per program and V tiles of 16 with the flush in a second pass over
# the slice shipped before; a Triton probe of the non-flush step then reached 1.05x the
# bandwidth floor (fp32, B = 256) with one warp per program, V tiles of 16 and lane-shuffle
# K reductions, and lost with tensor-core dots for S0 @ [u_q, u_k]. One-warp layouts with the
# flush folded into the V loop (its ring term as an exact float32 matrix product, or row by
# row) then won every regime over tf32x3 products, larger tiles, two pipeline stages and two
# warps. The candidates below add steps in two passes (appending rows, then flushing rows, each
# compiled without the other's branch) and wider splits for the smallest launches.
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "micro": [
        _config(4),
        _config(8),
        _config(8, num_warps=2),
        _config(16),
        _config(16, num_warps=2),
        _config(8, passes=2),
        _config(16, passes=2),
    ],
    "tiny": [
        _config(4),
        _config(8),
        _config(4, passes=2),
        _config(2, passes=2),
    ],
    "small": [
        _config(2),
        _config(2, passes=2),
        _config(4, passes=2),
        _config(4),
    ],
    "mid": [
        _config(2),
        _config(2, passes=2),
        _config(1, passes=2),
        _config(2, flush="rows", passes=2),
    ],
    "large": [
        _config(1),
        _config(1, flush="rows"),
        _config(1, passes=2),
        _config(1, flush="rows", passes=2),
        _config(1, num_stages=2, passes=2),
        _config(1, 32, passes=2),
        _config(1, 8, passes=2),
        _config(1, num_warps=2, passes=2),
    ],
}


def candidates(regime_name: str, quick: bool) -> list[dict[str, Any]]:
    grid = CANDIDATES[regime_name.split("-")[0]]
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


def make_args(p: Problem) -> ValidDecode:
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
    args = DecodeArgs(
        mixed, a, b, A_log, dt_bias, K**-0.5, state, d, k, g, out, idx, write_pos,
        None, True, p.lower_bound,
    )  # fmt: skip
    return validate_decode_args(args, reference=False)


def time_config(p: Problem, config: dict[str, Any], valid: ValidDecode) -> tuple[float, Any]:
    import triton.testing

    launch = launch_config(config, p.head_dim, p.head_dim, p.ring_len)
    offsets = index_dtype(kernel_tensors(valid, launch.split))
    kernel = _kernel.compiled_kernel(launch.helion, offsets, launch.dot_precision)
    args = valid.args
    state, d, k, g, out = args.initial_state, args.d_cache, args.k_cache, args.g_cache, args.out
    saved = [t.clone() for t in (state, d, k, g)]

    def restore() -> None:
        for t, s in zip((state, d, k, g), saved, strict=True):
            t.copy_(s)

    passes = [
        kernel_arguments(valid, launch, offsets, phase, interpret=False) for phase in launch.phases
    ]

    def step() -> None:
        for body_args in passes:
            kernel(*body_args)

    step()  # compile
    restore()
    step()
    result = (out.clone(), state.clone(), d.clone())
    restore()
    # do_bench_cudagraph starts on a fresh side stream that does not wait for this one: without
    # a barrier its warm-up launch can land before the clones above and the restore.
    torch.cuda.synchronize()
    # The same step repeated: each replay starts from the state the last one left, which
    # moves the same bytes (cursors are fixed, so the same rows append and flush).
    ms = triton.testing.do_bench_cudagraph(step, rep=100)
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
    parser.add_argument(
        "--regimes", help="comma-separated regime sizes (micro,tiny,small,mid,large)"
    )
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
    sizes = None if opts.regimes is None else set(opts.regimes.split(","))
    for name, problems in PROBLEMS.items():
        if sizes is not None and name.split("-")[0] not in sizes:
            continue
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
