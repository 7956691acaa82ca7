"""ReplaySSM decode on one GPU: ours against sglang's ReplaySSM kernels, fla's plain decode and
the bandwidth floor, in one run on the same inputs.

Shape: H = HV = 32, K = V = 128, L = 16 (Kimi-Linear at TP1), bf16 activations, L2-normalised
q/k, unbounded gate; B in {1, 16, 64, 256, 512}; fp32 state (d/k rings fp32) and bf16 state
(rings bf16); g is always float32. Also Kimi-K3's TP8 shape (HV = H = 12, lower bound -5),
ours against sglang's Helion kernel (sglang's Triton kernel has no bounded gate).

Timed kernels (each on its own copy of one pool, the same inputs):

* ours: ``replaylint.kernels.replayssm_decode``;
* sglang Helion: ``helion_fused_recurrent_kda_replayssm_decode`` (sglang 0.5.23);
* sglang Triton: ``fused_recurrent_linear_replayssm_decode(..., is_kda=True)``;
* fla plain: ``fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd`` on a pool with
  ``ssm_state_indices`` and ``inplace_final_state=True`` (gate, L2 norm and beta sigmoid in
  kernel, ``state_v_first=True``; checked once to change the pool) — a plain step, no ring;
* floor: the bytes a step must move over the device-to-device copy bandwidth of this run.

Every row sits at the same cursor c; one CUDA graph per c holds the same step 8 times (so the
graph launch is amortised), replayed 10 times (median, divided by 8). ``step`` is the mean over the non-flushing cursors c = 0 .. L-2, ``flush`` the step
at c = L-1 (every row flushes), and ``cycle`` the steady-state mean ((L-1) step + flush) / L.
An agreement check runs ours and sglang's Helion kernel for a ring cycle and a half from one
pool at staggered cursors (b % L, so every step mixes appends and flushes) and compares
outputs, checkpoint and rings. Host time per eager call at B = 1 is wall time over many calls.

The sglang modules are read from the sglang 0.5.23 wheel at run time: unzip its
``sglang/kernels/ops/attention/helion/{__init__,kda_decode,kda_replayssm}.py`` and
``sglang/kernels/ops/attention/linear/fused_recurrent_linear_replayssm.py`` into a folder
(``--sglang DIR``) with empty ``__init__.py`` files for ``sglang``, ``sglang/kernels``,
``sglang/kernels/ops``, ``sglang/kernels/ops/attention`` and ``.../linear`` (the real package
``__init__`` imports the whole server). They need only torch, triton and helion.

    python benchmarks/decode_kernel.py --sglang DIR --out decode_kernel.json [--configs T.json]
    python benchmarks/decode_kernel.py --plot decode_kernel.json --png docs/decode_kernel.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from replaylint.kernels import ReplaySSMCache, _decode, next_write_pos, replayssm_decode
from replaylint.kernels._configs import CONFIGS

DEV = "cuda"
BATCHES = (1, 16, 64, 256, 512)
K3_BATCHES = (16, 64, 256)
REPEATS = 8  # steps per captured graph
Step = Callable[..., Any]


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int  # H = HV
    lower_bound: float | None
    K: int = 128
    V: int = 128
    L: int = 16


KIMI = Shape("kimi-linear", 32, None)
K3_TP8 = Shape("k3-tp8", 12, -5.0)


def label(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "bf16"


def step_bytes(s: Shape, batch: int, state_dtype: torch.dtype, cursor: int) -> float:
    """Bytes one step at cursor ``cursor`` (every row) must move: the checkpoint, the live ring
    rows, the appended row or (at a flush) the checkpoint written, and the activations."""
    e = torch.finfo(state_dtype).bits // 8  # state and d/k rings; g is float32
    K, V, HV = s.K, s.V, s.heads
    per_head = V * K * e + cursor * (K * 4 + K * e + V * e)
    if cursor == s.L - 1:
        per_head += V * K * e
    else:
        per_head += K * 4 + V * e + K * e
    per_head += (3 * K + V) * 2 + V * 2  # q, k, a, v in; out (bf16)
    return batch * HV * per_head


def copy_bandwidth() -> float:
    import triton.testing

    n = 1 << 28
    src = torch.randn(n, device=DEV)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=300, return_mode="median")
    return 2 * n * 4 / (float(ms) * 1e-3)


def graph_of(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def time_graph(graph: torch.cuda.CUDAGraph, reps: int = 20) -> float:
    """Median microseconds per replay."""
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


class Problem:
    """One pool and L input sets; every kernel gets its own copy of the pool."""

    def __init__(self, s: Shape, batch: int, state_dtype: torch.dtype, seed: int = 0) -> None:
        gen = torch.Generator(device=DEV).manual_seed(seed)
        H = HV = s.heads
        K, V, L = s.K, s.V, s.L
        self.shape, self.batch, self.state_dtype = s, batch, state_dtype
        act = torch.bfloat16
        self.inputs = [
            {
                "mixed_qkv": torch.randn(batch, 2 * H * K + HV * V, generator=gen, device=DEV).to(
                    act
                ),
                "a": torch.randn(batch, HV, K, generator=gen, device=DEV).to(act),
                "b": torch.randn(batch, HV, generator=gen, device=DEV).to(act),
            }
            for _ in range(L)
        ]
        self.A_log = torch.linspace(-4.0, 0.5, HV, device=DEV)
        self.dt_bias = 0.5 * torch.randn(HV, K, generator=gen, device=DEV)
        slots = batch
        self.state = (0.1 * torch.randn(slots, HV, V, K, generator=gen, device=DEV)).to(state_dtype)
        self.d = (0.1 * torch.randn(slots, HV, L, V, generator=gen, device=DEV)).to(state_dtype)
        k = torch.randn(slots, H, L, K, generator=gen, device=DEV)
        self.k = (k / k.norm(dim=-1, keepdim=True)).to(state_dtype)
        self.g = -0.5 * torch.rand(slots, HV, L, K, generator=gen, device=DEV)
        self.idx = torch.randperm(slots, generator=gen, device=DEV).to(torch.int32)

    def pool(self) -> tuple[torch.Tensor, ...]:
        return tuple(t.clone() for t in (self.state, self.d, self.k, self.g))

    def args(
        self,
        step: int,
        pool: tuple[torch.Tensor, ...],
        out: torch.Tensor,
        write_pos: torch.Tensor,
    ) -> tuple[Any, ...]:
        inp = self.inputs[step % self.shape.L]
        return (
            inp["mixed_qkv"],
            inp["a"],
            inp["b"],
            self.A_log,
            self.dt_bias,
            self.shape.K**-0.5,
            *pool,
            out,
            self.idx,
            write_pos,
            None,
            True,
        )


def load_peers(sglang_dir: Path | None) -> dict[str, Step]:
    peers: dict[str, Step] = {}
    if sglang_dir is None:
        return peers
    sys.path.insert(0, str(sglang_dir))
    from sglang.kernels.ops.attention.helion.kda_replayssm import (
        helion_fused_recurrent_kda_replayssm_decode,
    )
    from sglang.kernels.ops.attention.linear.fused_recurrent_linear_replayssm import (
        fused_recurrent_linear_replayssm_decode,
    )

    peers["sglang_helion"] = helion_fused_recurrent_kda_replayssm_decode

    def sglang_triton(*args: Any, lower_bound: float | None = None) -> Any:
        if lower_bound is not None:
            raise NotImplementedError("no bounded gate")
        return fused_recurrent_linear_replayssm_decode(*args, is_kda=True)

    peers["sglang_triton"] = sglang_triton
    return peers


def time_cursors(p: Problem, fn: Step) -> dict[str, Any]:
    """Graph-replay time of one step at each cursor (all rows), and the step/flush/cycle means."""
    L = p.shape.L
    pool = p.pool()
    out = torch.empty(p.batch, 1, p.shape.heads, p.shape.V, dtype=torch.bfloat16, device=DEV)
    per_cursor = []
    for c in range(L):
        write_pos = torch.full((p.batch,), c, dtype=torch.int32, device=DEV)
        args = p.args(c, pool, out, write_pos)

        def run(args: tuple[Any, ...] = args) -> None:
            for _ in range(REPEATS):
                fn(*args, lower_bound=p.shape.lower_bound)

        per_cursor.append(time_graph(graph_of(run), reps=10) / REPEATS)
    step = sum(per_cursor[:-1]) / (L - 1)
    flush = per_cursor[-1]
    return {
        "per_cursor_us": per_cursor,
        "step_us": step,
        "flush_us": flush,
        "cycle_us": ((L - 1) * step + flush) / L,
        "flush_over_step": flush / step,
    }


def ours(*args: Any, lower_bound: float | None = None) -> Any:
    return replayssm_decode(*args, lower_bound)


def time_cache_cycle(p: Problem) -> float:
    """``ReplaySSMCache.decode`` (cursor step + kernel) over one ring cycle at staggered
    cursors, graph replay, microseconds per step."""
    s = p.shape
    cache = ReplaySSMCache(
        p.batch, s.heads, s.heads, s.K, s.V, s.L, state_dtype=p.state_dtype, device=DEV
    )
    cache.state.copy_(p.state)
    cache.write_pos.copy_(torch.arange(p.batch, device=DEV) % s.L)
    out = torch.empty(p.batch, 1, s.heads, s.V, dtype=torch.bfloat16, device=DEV)

    def cycle() -> None:
        for inp in p.inputs:
            cache.decode(
                **inp,
                A_log=p.A_log,
                dt_bias=p.dt_bias,
                scale=s.K**-0.5,
                out=out,
                ssm_state_indices=p.idx,
                use_qk_l2norm_in_kernel=True,
                lower_bound=s.lower_bound,
            )

    return time_graph(graph_of(cycle)) / s.L


def agreement(p: Problem, peer: Step) -> dict[str, float]:
    """Ours against a peer over 24 steps from one pool at staggered, advancing cursors."""
    L = p.shape.L
    pools = (p.pool(), p.pool())
    write_pos = (torch.arange(p.batch, device=DEV) % L).to(torch.int32)
    worst = {"out_max_abs": 0.0, "out_rel": 0.0, "out_scale": 0.0}
    for step in range(L + L // 2):
        outs = []
        for fn, pool in zip((ours, peer), pools, strict=True):
            out = torch.empty(p.batch, 1, p.shape.heads, p.shape.V, dtype=torch.bfloat16)
            out = out.to(DEV)
            fn(*p.args(step, pool, out, write_pos), lower_bound=p.shape.lower_bound)
            outs.append(out.float())
        diff = (outs[0] - outs[1]).abs()
        worst["out_max_abs"] = max(worst["out_max_abs"], float(diff.max()))
        worst["out_rel"] = max(worst["out_rel"], float(diff.norm() / outs[1].norm()))
        worst["out_scale"] = max(worst["out_scale"], float(outs[1].abs().max()))
        write_pos = next_write_pos(write_pos, L)
    for name, a, b in zip(("state", "d_cache", "k_cache", "g_cache"), *pools, strict=True):
        diff = (a.float() - b.float()).abs()
        worst[f"{name}_max_abs"] = float(diff.max())
        worst[f"{name}_rel"] = float(diff.norm() / b.float().norm())
    return worst


def time_fla(p: Problem) -> dict[str, Any]:
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    s = p.shape
    B, H, K = p.batch, s.heads, s.K
    inp = p.inputs[0]
    x = inp["mixed_qkv"]
    q = x[:, : H * K].reshape(B, 1, H, K).contiguous()
    k = x[:, H * K : 2 * H * K].reshape(B, 1, H, K).contiguous()
    v = x[:, 2 * H * K :].reshape(B, 1, H, s.V).contiguous()
    a = inp["a"].reshape(B, 1, H, K)
    beta = inp["b"].reshape(B, 1, H)
    pool = p.state.clone()
    out = torch.empty_like(v)

    def step() -> None:
        fused_recurrent_kda_fwd(
            q=q,
            k=k,
            v=v,
            g=a,
            beta=beta,
            A_log=p.A_log,
            dt_bias=p.dt_bias.reshape(-1),
            initial_state=pool,
            scale=K**-0.5,
            inplace_final_state=True,
            state_v_first=True,
            ssm_state_indices=p.idx,
            use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True,
            out=out,
        )

    before = pool.clone()
    step()
    torch.cuda.synchronize()
    changed = not torch.equal(before, pool)

    def steps() -> None:
        for _ in range(REPEATS):
            step()

    return {"step_us": time_graph(graph_of(steps), reps=10) / REPEATS, "pool_changed": changed}


def host_us(fn: Callable[[], Any], n: int = 3000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def host_times(p: Problem, peers: dict[str, Step]) -> dict[str, float]:
    """Host wall time per eager call at B = 1 (the GPU waits on the host there)."""
    s = p.shape
    pool = p.pool()
    out = torch.empty(p.batch, 1, s.heads, s.V, dtype=torch.bfloat16, device=DEV)
    write_pos = torch.zeros(p.batch, dtype=torch.int32, device=DEV)  # appends, no flush
    args = p.args(0, pool, out, write_pos)
    cache = ReplaySSMCache(
        p.batch, s.heads, s.heads, s.K, s.V, s.L, state_dtype=p.state_dtype, device=DEV
    )
    inp = p.inputs[0]
    result = {
        "replayssm_decode": host_us(lambda: replayssm_decode(*args, None)),
        "ReplaySSMCache.decode": host_us(
            lambda: cache.decode(
                inp["mixed_qkv"],
                inp["a"],
                inp["b"],
                p.A_log,
                p.dt_bias,
                s.K**-0.5,
                out,
                p.idx,
                use_qk_l2norm_in_kernel=True,
            )
        ),
        "torch_add_": host_us(lambda: out.add_(0)),
    }
    for name, fn in peers.items():
        result[name] = host_us(lambda fn=fn: fn(*args))  # type: ignore[misc]
    return result


def run_shape(
    s: Shape,
    batches: tuple[int, ...],
    peers: dict[str, Step],
    bandwidth: float,
    report: dict[str, Any],
    out_path: Path,
) -> None:
    for state_dtype in (torch.float32, torch.bfloat16):
        for batch in batches:
            p = Problem(s, batch, state_dtype)
            row: dict[str, Any] = {"shape": s.name, "state": label(state_dtype), "B": batch}
            floors = [step_bytes(s, batch, state_dtype, c) / bandwidth * 1e6 for c in range(s.L)]
            row["floor"] = {
                "step_us": sum(floors[:-1]) / (s.L - 1),
                "flush_us": floors[-1],
                "cycle_us": sum(floors) / s.L,
            }
            row["ours"] = time_cursors(p, ours)
            for name, fn in peers.items():
                try:
                    row[name] = time_cursors(p, fn)
                except Exception as error:  # report, keep going
                    row[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
            if s.lower_bound is None:
                try:
                    row["fla_plain"] = time_fla(p)
                except Exception as error:
                    row["fla_plain"] = {"error": f"{type(error).__name__}: {error}"[:300]}
                row["ours_cache_cycle_us"] = time_cache_cycle(p)
            if "sglang_helion" in peers:
                row["agreement_vs_sglang_helion"] = agreement(p, peers["sglang_helion"])
            if batch == 1 and s.lower_bound is None:
                row["host_us_per_call"] = host_times(p, peers)
            report["rows"].append(row)
            out_path.write_text(json.dumps(report, indent=2))
            print_row(row)


def _us(row: dict[str, Any], name: str, key: str) -> float:
    return float(row.get(name, {}).get(key, float("nan")))


def print_row(row: dict[str, Any]) -> None:
    cyc = _us(row, "ours", "cycle_us")
    print(
        f"{row['shape']:11s} {row['state']} B={row['B']:4d} | floor {_us(row, 'floor', 'cycle_us'):7.1f}"
        f" | ours step {_us(row, 'ours', 'step_us'):7.1f} flush {_us(row, 'ours', 'flush_us'):7.1f}"
        f" cycle {cyc:7.1f} | sglH step {_us(row, 'sglang_helion', 'step_us'):7.1f} flush"
        f" {_us(row, 'sglang_helion', 'flush_us'):7.1f} cycle"
        f" {_us(row, 'sglang_helion', 'cycle_us'):7.1f} | sglT cycle"
        f" {_us(row, 'sglang_triton', 'cycle_us'):7.1f} | fla {_us(row, 'fla_plain', 'step_us'):7.1f}"
        f" | sglH/ours {_us(row, 'sglang_helion', 'cycle_us') / cyc:5.2f}"
        f" ours/floor {cyc / _us(row, 'floor', 'cycle_us'):5.2f}",
        flush=True,
    )


def plot(report: dict[str, Any], png: Path) -> None:
    """Cycle-mean time per step against B, one panel per state dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    series = [
        ("ours", "ours (replaylint)", "o-"),
        ("sglang_helion", "sglang Helion ReplaySSM", "s--"),
        ("sglang_triton", "sglang Triton ReplaySSM", "^--"),
        ("fla_plain", "fla plain decode (in place)", "v:"),
        ("floor", "floor (bytes / copy bandwidth)", "k-"),
    ]
    for ax, state in zip(axes, ("fp32", "bf16"), strict=True):
        rows = [r for r in report["rows"] if r["state"] == state and r["shape"] == "kimi-linear"]
        batches = [r["B"] for r in rows]
        for key, name, style in series:
            field = "step_us" if key == "fla_plain" else "cycle_us"
            ax.plot(batches, [_us(r, key, field) for r in rows], style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch B (rows)")
        ax.set_title(f"{state} state (H = HV = 32, K = V = 128, L = 16)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("µs per decode step (ring-cycle mean)")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{report['device']}, {report['date'][:10]}, copy bandwidth "
        f"{report['copy_bandwidth_TBps']:.2f} TB/s; CUDA-graph replay",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("decode_kernel.json"))
    parser.add_argument("--sglang", type=Path, help="folder holding sglang's two kernel modules")
    parser.add_argument("--configs", type=Path, help="a tune_decode_kernel.py JSON to run with")
    parser.add_argument("--plot", type=Path, help="draw this saved JSON instead of running")
    parser.add_argument("--png", type=Path, default=Path("decode_kernel.png"))
    opts = parser.parse_args()
    if opts.plot is not None:
        plot(json.loads(opts.plot.read_text()), opts.png)
        print(f"wrote {opts.png}")
        return
    configs = dict(CONFIGS)
    if opts.configs is not None:
        configs.update(json.loads(opts.configs.read_text())["selected"])
        _decode.CONFIG_OVERRIDE = configs
    if not torch.cuda.is_available():
        raise SystemExit("decode_kernel.py needs a CUDA device")
    import triton

    peers = load_peers(opts.sglang)
    bandwidth = copy_bandwidth()
    versions = {"torch": torch.__version__, "triton": triton.__version__}
    for name in ("helion", "fla-core"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["sglang"] = "0.5.23 (two kernel modules)" if peers else "not loaded"
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "versions": versions,
        "copy_bandwidth_TBps": bandwidth / 1e12,
        "configs": configs,
        "rows": [],
    }
    print(f"{report['device']} {versions} copy {bandwidth / 1e12:.2f} TB/s", flush=True)
    run_shape(KIMI, BATCHES, peers, bandwidth, report, opts.out)
    bounded = {k: v for k, v in peers.items() if k == "sglang_helion"}
    run_shape(K3_TP8, K3_BATCHES, bounded, bandwidth, report, opts.out)
    for row in report["rows"]:
        if "host_us_per_call" in row:
            host = row["host_us_per_call"]
            print(f"{row['state']} B=1 host us per eager call: " + json.dumps(host))
        if "agreement_vs_sglang_helion" in row and row["B"] in (16, 256):
            print(
                f"{row['shape']} {row['state']} B={row['B']} agreement: "
                + json.dumps({k: f"{v:.2e}" for k, v in row["agreement_vs_sglang_helion"].items()})
            )
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
