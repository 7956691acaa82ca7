"""Choose the decode kernel's fixed Helion configs on a GPU (one H200 here).

For each regime of replaylint/kernels/_configs.py it times a small grid of candidate configs
under CUDA-graph replay, checks each candidate's output against a reference config, and keeps
the fastest. Inputs are steady-state: every row's cursor is staggered (``b % L``), so a launch
mixes appends and flushes as serving does (1 row in L flushes).

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
from replaylint.kernels._configs import CONFIGS, config_key, regime
from replaylint.kernels._decode import kernel_arguments
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


# Each regime is tuned on the problems it serves (the small regime on several).
PROBLEMS: dict[str, list[Problem]] = {
    "fp32": [Problem("kimi-b256-fp32", 256, 32, 32, 128, 16, torch.float32)],
    "half": [Problem("kimi-b256-bf16", 256, 32, 32, 128, 16, torch.bfloat16)],
    "small": [
        Problem("kimi-b4-fp32", 4, 32, 32, 128, 16, torch.float32),
        Problem("kimi-b4-bf16", 4, 32, 32, 128, 16, torch.bfloat16),
        Problem("k3tp8-b16-bf16", 16, 12, 12, 128, 16, torch.bfloat16, -5.0),
    ],
}


def _config(
    block_v: int, num_warps: int, order: tuple[int, int] = (0, 1), stages: int = 0
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "block_sizes": [block_v],
        "num_warps": num_warps,
        "num_stages": 1,
        "loop_orders": [list(order)],
    }
    if stages:
        config["range_num_stages"] = [stages, 0, 0]  # software-pipeline the V-tile loop
    return config


# Candidates per regime. A first, wider sweep (BV 16/32/64 x 2/4/8 warps x both grid orders)
# left these: 8 warps lose 1.5-2x everywhere, BV 64 spills at B = 256, BV 64 wins at small B.
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    # Finalists of the earlier runs first: --quick keeps only those.
    "large": [
        _config(16, 2, (1, 0)),
        _config(16, 2, (1, 0), stages=2),
        _config(32, 4),
        _config(16, 4),
        _config(16, 4, (1, 0)),
        _config(16, 4, stages=2),
        _config(32, 4, stages=2),
    ],
    "small": [
        _config(64, 4),
        _config(64, 4, stages=2),
        _config(32, 4),
        _config(16, 4),
    ],
}


def candidates(regime_name: str, quick: bool) -> list[dict[str, Any]]:
    grid = CANDIDATES["small" if regime_name == "small" else "large"]
    return grid[: (2 if regime_name == "small" else 4)] if quick else grid


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


def make_args(p: Problem) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
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
    tensors, scalars = kernel_arguments(shapes, *call, *rest)
    return tensors, (*scalars, torch.int32, False)  # int32 offsets, compiled


def time_config(p: Problem, config: dict[str, Any], args: tuple[Any, ...]) -> tuple[float, Any]:
    import triton.testing

    kernel = _kernel.compiled_kernel(config_key(config), torch.int32)
    tensors, scalars = args
    state, d, k, g, out = tensors[7], tensors[8], tensors[9], tensors[10], tensors[11]
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
    ms = triton.testing.do_bench_cudagraph(lambda: kernel(*tensors, *scalars), rep=200)
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
            programs = p.batch * p.num_value_heads
            assert regime(p.state_dtype, programs) == name, (p, name)
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
                        if not err < 1e-3:  # configs differ only in summation order
                            entry["ok"] = False
                            entry["error"] = f"mismatch on {p.name}: {float(err):.2e}"
                entry["us"][p.name] = us
            if entry["ok"]:
                entry["total_us"] = sum(entry["us"].values())
            rows.append(entry)
            shown = " ".join(f"{k}={v:8.1f}us" for k, v in entry["us"].items())
            print(
                f"{name:5s} {json.dumps(config):80s} {shown} {'' if entry['ok'] else entry['error']}"
            )
        good = [r for r in rows if r["ok"]]
        best = min(good, key=lambda r: r["total_us"])
        report["regimes"][name] = rows
        report["selected"][name] = best["config"]
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
