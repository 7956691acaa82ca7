"""ReplaySSM decode vs flash-linear-attention's plain KDA decode on one GPU.

Times, in one run and on the same inputs (H = HV = 32, K = V = 128, L = 16, bf16
activations), for B in {1, 16, 64, 256, 512} and fp32 / bf16 state:

* ours: ``ReplaySSMCache.decode`` (kernel + cursor advance), averaged over a full ring cycle of
  L steps with real cursor movement (every row starts at a different cursor, so each launch
  mixes appends and flushes as in serving) — eager (``do_bench`` of the L-step cycle) and
  CUDA-graph replay of the cycle;
* fla: ``fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd`` on a state pool with
  ``ssm_state_indices``, ``inplace_final_state=True``, gate / L2 norm / beta sigmoid in kernel,
  ``state_v_first=True`` (checked once to change the pool);
* the bandwidth floor: the bytes a steady-state ReplaySSM step must move over the
  device-to-device copy bandwidth measured in the same run.

Also: host time per eager call at B = 1 (guard + validation + dispatch + launch) of
``replayssm_decode`` and of ``ReplaySSMCache.decode``, and of the validation alone. Writes JSON
(``--out``) and prints a table. Needs CUDA and fla-core 0.6.0.

    python benchmarks/decode_kernel.py --out decode_kernel.json [--configs tune.json]

``--configs`` runs with the configs a tuning run selected (its ``selected`` entry) instead of
the shipped ones in replaylint/kernels/_configs.py. Without a GPU,
``--plot decode_kernel.json --png docs/decode_kernel.png`` draws a saved run (matplotlib).
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from replaylint.kernels import ReplaySSMCache, _decode, replayssm_decode
from replaylint.kernels._configs import CONFIGS
from replaylint.kernels._validate import validate_decode_args

H = HV = 32
K = V = 128
L = 16
BATCHES = (1, 16, 64, 256, 512)
DEV = "cuda"


def step_bytes(batch: int, state_dtype: torch.dtype) -> float:
    """Bytes one steady-state ReplaySSM step moves (cursors uniform over the ring)."""
    s = torch.finfo(state_dtype).bits // 8
    r = s  # d/k rings in the state's dtype; g is float32
    live = (L - 1) / 2
    per_head = (
        V * K * s
        + live * (K * 4 + K * r + V * r)
        + (1 - 1 / L) * (K * 4 + V * r + K * r)
        + (1 / L) * V * K * s
        + (3 * K + 2 * V) * 2
    )
    return batch * HV * per_head


def copy_bandwidth() -> float:
    import triton.testing

    n = 1 << 28
    src = torch.empty(n, device=DEV)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200)
    return 2 * n * 4 / (float(ms) * 1e-3)


def graph_of(fn: Any) -> torch.cuda.CUDAGraph:
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
    """Median milliseconds per replay."""
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def bench_ours(batch: int, state_dtype: torch.dtype) -> dict[str, Any]:
    import triton.testing

    gen = torch.Generator(device=DEV).manual_seed(0)
    cache = ReplaySSMCache(batch, H, HV, K, V, L, state_dtype=state_dtype, device=DEV)
    cache.state.copy_(0.1 * torch.randn(cache.state.shape, generator=gen, device=DEV))
    cache.write_pos.copy_(torch.arange(batch, device=DEV) % L)  # staggered cursors
    idx = torch.randperm(batch, generator=gen, device=DEV).to(torch.int32)
    A_log = torch.linspace(-4.0, 0.5, HV, device=DEV)
    dt_bias = 0.5 * torch.randn(HV, K, generator=gen, device=DEV)
    inputs = [
        {
            "mixed_qkv": torch.randn(batch, 2 * H * K + HV * V, generator=gen, device=DEV).to(
                torch.bfloat16
            ),
            "a": torch.randn(batch, HV, K, generator=gen, device=DEV).to(torch.bfloat16),
            "b": torch.randn(batch, HV, generator=gen, device=DEV).to(torch.bfloat16),
        }
        for _ in range(L)
    ]
    out = torch.empty(batch, 1, HV, V, dtype=torch.bfloat16, device=DEV)

    def cycle() -> None:
        for inp in inputs:
            cache.decode(
                **inp,
                A_log=A_log,
                dt_bias=dt_bias,
                scale=K**-0.5,
                out=out,
                ssm_state_indices=idx,
                use_qk_l2norm_in_kernel=True,
            )

    write_pos = cache.write_pos_for(idx)

    def kernel_only() -> None:
        # The kernel alone at fixed staggered cursors (no cursor advance): the same mix of
        # appends and flushes per launch, without the small launch that moves cursors.
        for inp in inputs:
            replayssm_decode(
                inp["mixed_qkv"],
                inp["a"],
                inp["b"],
                A_log,
                dt_bias,
                K**-0.5,
                cache.state,
                cache.d_cache,
                cache.k_cache,
                cache.g_cache,
                out,
                idx,
                write_pos,
                None,
                True,
                None,
            )

    cycle()
    eager_ms = float(triton.testing.do_bench(cycle, rep=200)) / L
    graph_ms = time_graph(graph_of(cycle)) / L
    kernel_ms = time_graph(graph_of(kernel_only)) / L
    result: dict[str, Any] = {
        "eager_us": eager_ms * 1e3,
        "graph_us": graph_ms * 1e3,
        "graph_kernel_only_us": kernel_ms * 1e3,
    }
    if batch == 1:
        result["host_us_per_call"] = host_time_per_call(cache, inputs[0], A_log, dt_bias, idx)
    return result


def host_time_per_call(
    cache: ReplaySSMCache,
    inp: dict[str, torch.Tensor],
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    idx: torch.Tensor,
) -> dict[str, float]:
    """Host wall time per eager call at B = 1 (the GPU waits on the host there), microseconds."""
    out = torch.empty(1, 1, HV, V, dtype=torch.bfloat16, device=DEV)
    write_pos = cache.write_pos_for(idx)
    args = (
        inp["mixed_qkv"],
        inp["a"],
        inp["b"],
        A_log,
        dt_bias,
        K**-0.5,
        cache.state,
        cache.d_cache,
        cache.k_cache,
        cache.g_cache,
        out,
        idx,
        write_pos,
        None,
        True,
        None,
    )

    def per_call_us(fn: Any) -> float:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        n = 2000
        start = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - start) / n
        torch.cuda.synchronize()
        return host * 1e6

    def cache_step() -> None:
        cache.decode(
            inp["mixed_qkv"],
            inp["a"],
            inp["b"],
            A_log,
            dt_bias,
            K**-0.5,
            out,
            idx,
            use_qk_l2norm_in_kernel=True,
        )

    shapes = validate_decode_args(*args, reference=False)
    split, _ = _decode.select_config(cache.state.dtype, HV, V, _decode.CONFIG_OVERRIDE)
    tensors = _decode.kernel_tensors(shapes, split, *args[:5], *args[6:14])
    kernel_args = (*tensors, float(K**-0.5), 0.0, True, False, False, torch.int32, False)
    replayssm_decode(*args)  # make sure the launcher for this launch exists
    # The launcher of this launch: key = ("decode", config, offsets, split, min(B, 2), ...,
    # state dtype at 15, ...) as built in _decode._launch.
    launchers = [
        run
        for key, run in _decode._LAUNCHERS.items()
        if key[0] == "decode" and key[4] == 1 and key[15] == cache.state.dtype
    ]
    cursor = cache.write_pos
    cursor_args = (cursor, idx, idx, write_pos, L, False)
    cursor_key = ("cursor", False, 1, min(cursor.size(0), 2), L)
    cursor_run = _decode._LAUNCHERS.get(cursor_key)
    result = {
        "replayssm_decode": per_call_us(lambda: replayssm_decode(*args)),
        # Everything after validation: views, config choice, launcher lookup, launch.
        "dispatch_and_launch": per_call_us(lambda: _decode._launch(shapes, *args)),
        "views": per_call_us(lambda: _decode.kernel_tensors(shapes, split, *args[:5], *args[6:14])),
        "index_dtype": per_call_us(lambda: _decode.index_dtype(tensors)),
        "cache_decode": per_call_us(cache_step),
        "validation_only": per_call_us(lambda: validate_decode_args(*args, reference=False)),
        "torch_add_reference": per_call_us(lambda: out.add_(0)),
    }
    if len(launchers) == 1:
        # Helion's generated host function (sizes, strides, grid) + the direct launch.
        result["host_function_and_launch"] = per_call_us(lambda: launchers[0](*kernel_args))
    if cursor_run is not None:
        result["cursor_step_launch"] = per_call_us(lambda: cursor_run(*cursor_args))
    return result


def bench_fla(batch: int, state_dtype: torch.dtype) -> dict[str, float]:
    import triton.testing
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    gen = torch.Generator(device=DEV).manual_seed(0)
    act = torch.bfloat16
    q = torch.randn(batch, 1, H, K, generator=gen, device=DEV).to(act)
    k = torch.randn(batch, 1, H, K, generator=gen, device=DEV).to(act)
    v = torch.randn(batch, 1, HV, V, generator=gen, device=DEV).to(act)
    a = torch.randn(batch, 1, HV, K, generator=gen, device=DEV).to(act)
    b = torch.randn(batch, 1, HV, generator=gen, device=DEV).to(act)
    A_log = torch.linspace(-4.0, 0.5, HV, device=DEV)
    dt_bias = 0.5 * torch.randn(HV * K, generator=gen, device=DEV)
    pool = (0.1 * torch.randn(batch, HV, V, K, generator=gen, device=DEV)).to(state_dtype)
    idx = torch.randperm(batch, generator=gen, device=DEV).to(torch.int32)
    out = torch.empty_like(v)

    def step() -> None:
        fused_recurrent_kda_fwd(
            q=q,
            k=k,
            v=v,
            g=a,
            beta=b,
            A_log=A_log,
            dt_bias=dt_bias,
            initial_state=pool,
            scale=K**-0.5,
            inplace_final_state=True,
            state_v_first=True,
            ssm_state_indices=idx,
            use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True,
            out=out,
        )

    before = pool.clone()
    step()
    torch.cuda.synchronize()
    changed = not torch.equal(before, pool)
    eager_ms = float(triton.testing.do_bench(step, rep=200))
    graph_ms = time_graph(graph_of(step))
    return {"eager_us": eager_ms * 1e3, "graph_us": graph_ms * 1e3, "pool_changed": changed}


def plot(report: dict[str, Any], png: Path) -> None:
    """Time per step against B, one panel per state dtype: ours, fla, the bandwidth floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, label in zip(axes, ("fp32", "bf16"), strict=True):
        rows = [r for r in report["rows"] if r["state"] == label]
        batches = [r["B"] for r in rows]
        series = {
            "ReplaySSM step (kernel + cursor step), graph": [r["ours"]["graph_us"] for r in rows],
            "ReplaySSM kernel alone, graph": [r["ours"]["graph_kernel_only_us"] for r in rows],
            "fla fused_recurrent_kda_fwd (plain), graph": [
                r["fla"].get("graph_us", float("nan")) for r in rows
            ],
            "bandwidth floor (bytes / copy bandwidth)": [r["floor_us"] for r in rows],
        }
        styles = ["o-", "s--", "^-", "k:"]
        for (name, values), style in zip(series.items(), styles, strict=True):
            ax.plot(batches, values, style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch B (rows)")
        ax.set_title(f"{label} state (H = HV = 32, K = V = 128, L = 16)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time per decode step (us)")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{report['device']}, {report['date']}, copy bandwidth "
        f"{report['copy_bandwidth_TBps']:.2f} TB/s; CUDA-graph replay, steady state over a ring"
        " cycle",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("decode_kernel.json"))
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

    bandwidth = copy_bandwidth()
    versions = {"torch": torch.__version__, "triton": triton.__version__}
    for name in ("helion", "fla-core"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "versions": versions,
        "copy_bandwidth_TBps": bandwidth / 1e12,
        "shape": {"H": H, "HV": HV, "K": K, "V": V, "L": L},
        "configs": configs,
        "rows": [],
    }
    print(f"{report['device']} {versions} copy {bandwidth / 1e12:.2f} TB/s")
    header = (
        f"{'state':5s} {'B':>4s} {'floor':>8s} {'ours graph':>10s} {'kernel':>8s} "
        f"{'ours eager':>10s} {'fla graph':>9s} {'fla eager':>9s} {'GB/s':>6s} {'fla/ours':>8s}"
    )
    print(header)
    for state_dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for batch in BATCHES:
            row: dict[str, Any] = {"state": label, "B": batch}
            row["bytes"] = step_bytes(batch, state_dtype)
            row["floor_us"] = row["bytes"] / bandwidth * 1e6
            row["ours"] = bench_ours(batch, state_dtype)
            try:
                row["fla"] = bench_fla(batch, state_dtype)
            except Exception as error:  # report, keep going
                row["fla"] = {"error": f"{type(error).__name__}: {error}"[:300]}
            ours = row["ours"]["graph_us"]
            fla = row["fla"].get("graph_us", float("nan"))
            gbps = row["bytes"] / (ours * 1e-6) / 1e9
            row["ours"]["GBps_graph"] = gbps
            report["rows"].append(row)
            print(
                f"{label:5s} {batch:4d} {row['floor_us']:8.1f} {ours:10.1f} "
                f"{row['ours']['graph_kernel_only_us']:8.1f} "
                f"{row['ours']['eager_us']:10.1f} {fla:9.1f} "
                f"{row['fla'].get('eager_us', float('nan')):9.1f} {gbps:6.0f} {fla / ours:8.2f}"
            )
            opts.out.write_text(json.dumps(report, indent=2))
    for row in report["rows"]:
        if row["B"] == 1:
            host = row["ours"]["host_us_per_call"]
            print(
                f"{row['state']} B = 1 host us per eager call: replayssm_decode "
                f"{host['replayssm_decode']:.1f}, ReplaySSMCache.decode {host['cache_decode']:.1f}"
                f", validation {host['validation_only']:.1f}, dispatch + launch "
                f"{host['dispatch_and_launch']:.1f} (views {host['views']:.1f}, "
                f"index dtype {host['index_dtype']:.1f}, host function + launch "
                f"{host.get('host_function_and_launch', float('nan')):.1f}), a torch add_ "
                f"{host['torch_add_reference']:.1f}"
            )
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
