"""Per-call cost of dtype guards on the float32 path of a 14-tensor decode entry point.

Variants, all measured in one run, on the same tensors, interleaved repeat by repeat:

* bare: the undecorated function;
* replaylint: ``@fp32_gate_cache``;
* args/kwargs closure: a hand-written ``*args, **kwargs`` wrapper that takes the argument by a
  precomputed index or name (the obvious hand-rolled guard; shown for reference);
* signature.bind: a wrapper that binds ``inspect.signature(fn)`` on every call, then checks;
* jaxtyping+beartype: ``@jaxtyped(typechecker=beartype)`` with only ``g_cache`` annotated as
  ``Float32[Tensor, "..."]`` (needs ``pip install jaxtyping beartype``).

Each is called positionally and by keyword. A sample times a loop of calls long enough to take
about ``--sample-ms``; the table shows the median over ``--repeats`` samples, the difference to
the bare call and the ratio to it.

A second, smaller table shows what policy ``"cast"`` costs per call on a bfloat16 gate cache of
``--cast-shape`` (default ``8,4,16,128``: 8 slots, 4 value heads, ring 16, K 128), for a call that
only reads it and one that writes one ring row: copy in, snapshot, comparison, copy back (one
intra-op thread).
Run: ``python benchmarks/guard_overhead.py``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import inspect
import os
import platform
import statistics
import timeit
from collections.abc import Callable
from typing import Any

import torch

from replaylint.guards import fp32_gate_cache

NAMES = [
    "mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "d_cache",
    "k_cache", "out", "g_cache", "ssm_state_indices", "write_pos", "force_flush", "cu_seqlens",
]  # fmt: skip
GUARDED = "g_cache"
TARGET_POSITIONAL_NS = 300.0
TARGET_KEYWORD_NS = 600.0


def step(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    out: torch.Tensor,
    g_cache: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    """Stands in for a kernel launch: does nothing, so the table shows only the guards' cost."""
    return out


def closure_guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    index = NAMES.index(GUARDED)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tensor = args[index] if len(args) > index else kwargs[GUARDED]
        if isinstance(tensor, torch.Tensor) and tensor.dtype is torch.float32:
            return fn(*args, **kwargs)
        raise TypeError(f"{GUARDED} must be a float32 tensor")

    return wrapper


def bind_guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tensor = signature.bind(*args, **kwargs).arguments[GUARDED]
        if isinstance(tensor, torch.Tensor) and tensor.dtype is torch.float32:
            return fn(*args, **kwargs)
        raise TypeError(f"{GUARDED} must be a float32 tensor")

    return wrapper


def jaxtyping_guard() -> Callable[..., Any] | str:
    """``step`` checked by jaxtyping+beartype, or why that is not available."""
    try:
        from beartype import beartype
        from jaxtyping import Float32, jaxtyped
    except ImportError as error:
        return f"not installed ({error.name}); pip install jaxtyping beartype"

    # A copy of step whose only annotation is the jaxtyping dtype of the gate cache.
    annotated = functools.wraps(step)(
        type(step)(step.__code__, step.__globals__, "step", step.__defaults__)
    )
    annotated.__annotations__ = {GUARDED: Float32[torch.Tensor, "..."]}
    del annotated.__wrapped__  # beartype must read this function's annotations, not step's
    checked: Callable[..., Any] = jaxtyped(typechecker=beartype)(annotated)
    return checked


def sample_ns(call: Callable[[], object], number: int) -> float:
    return timeit.Timer(call).timeit(number) / number * 1e9


def calibrate(call: Callable[[], object], sample_ms: float) -> int:
    number = 1
    while True:
        elapsed = timeit.Timer(call).timeit(number)
        if elapsed * 1e3 >= sample_ms / 4:
            return max(1, int(number * sample_ms / 1e3 / elapsed))
        number *= 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=41, help="samples per variant and mode")
    parser.add_argument("--sample-ms", type=float, default=10.0, help="length of one sample")
    parser.add_argument(
        "--cast-shape", default="8,4,16,128", help="gate-cache shape for the cast table"
    )
    options = parser.parse_args()

    tensors = [torch.zeros(4) for _ in NAMES]
    keywords = dict(zip(NAMES, tensors, strict=True))
    variants: dict[str, Callable[..., Any] | str] = {
        "bare": step,
        "replaylint fp32_gate_cache": fp32_gate_cache(step),
        "args/kwargs closure (reference)": closure_guard(step),
        "signature.bind": bind_guard(step),
        "jaxtyping+beartype": jaxtyping_guard(),
    }
    callables = {name: fn for name, fn in variants.items() if not isinstance(fn, str)}
    for name, fn in callables.items():  # every checked variant must accept float32 ...
        fn(*tensors)
        if name != "bare":  # ... and reject bfloat16
            wrong = dict(keywords, **{GUARDED: torch.zeros(4, dtype=torch.bfloat16)})
            try:
                fn(**wrong)
            except Exception:
                pass
            else:
                raise SystemExit(f"{name} accepted a bfloat16 gate cache")

    load_before = _load()
    calls: dict[tuple[str, str], Callable[[], object]] = {}
    for name, fn in callables.items():
        calls[name, "positional"] = _positional_call(fn, tensors)
        calls[name, "keyword"] = _keyword_call(fn, tensors)
    numbers = {key: calibrate(call, options.sample_ms) for key, call in calls.items()}
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    for _ in range(options.repeats):
        for key, call in calls.items():
            samples[key].append(sample_ns(call, numbers[key]))
    median = {key: statistics.median(values) for key, values in samples.items()}

    print(f"# guard overhead, float32 path, {len(NAMES)} tensor arguments")
    print(
        f"# {datetime.date.today()} | {_cpu()} | {os.cpu_count()} cpus | "
        f"Python {platform.python_version()} | torch {torch.__version__} | "
        f"median of {options.repeats} samples of ~{options.sample_ms:g} ms | "
        f"load average {load_before} before, {_load()} after (other processes compete)"
    )
    print()
    print("| variant | positional ns/call | added | x bare | keyword ns/call | added | x bare |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, fn in variants.items():
        if isinstance(fn, str):
            print(f"| {name} | {fn} | | | | | |")
            continue
        cells = []
        for mode in ("positional", "keyword"):
            value, bare = median[name, mode], median["bare", mode]
            cells += [f"{value:.0f}", f"{value - bare:+.0f}", f"{value / bare:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    ours = "replaylint fp32_gate_cache"
    checked = [name for name in callables if name not in ("bare", ours)]
    for mode, target in (("positional", TARGET_POSITIONAL_NS), ("keyword", TARGET_KEYWORD_NS)):
        added = median[ours, mode] - median["bare", mode]
        fastest = all(median[ours, mode] < median[other, mode] for other in checked)
        print(
            f"{mode}: replaylint adds {added:.0f} ns (target <= {target:.0f}): "
            f"{'PASS' if added <= target else 'FAIL'}; fastest checked variant: "
            f"{'yes' if fastest else 'NO'}"
        )
    _cast_table(tuple(int(n) for n in options.cast_shape.split(",")), options)


def _cast_table(shape: tuple[int, ...], options: argparse.Namespace) -> None:
    """Per-call cost of policy 'cast' on a bfloat16 gate cache (CPU, the current thread count)."""
    import warnings

    def read_only(g_cache: torch.Tensor, row: int) -> torch.Tensor:
        return g_cache

    def write_row(g_cache: torch.Tensor, row: int) -> None:
        g_cache[..., row, :] = 1.0

    # One intra-op thread: on a shared machine, a parallel kernel waits for a descheduled
    # worker thread (milliseconds), and the table would measure the scheduler.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.zeros(shape, dtype=torch.bfloat16)
    rows: dict[str, Callable[[], object]] = {}
    for name, fn in (("read only", read_only), ("writes one ring row", write_row)):
        guarded = fp32_gate_cache(policy="cast")(fn)
        rows[name] = functools.partial(guarded, g, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        numbers = {name: calibrate(call, options.sample_ms) for name, call in rows.items()}
        samples: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(options.repeats):
            for name, call in rows.items():
                samples[name].append(sample_ns(call, numbers[name]))
    torch.set_num_threads(threads)
    print()
    print(
        f"# policy 'cast', bfloat16 gate cache {list(shape)} ({g.numel()} elements), "
        "1 intra-op thread"
    )
    print()
    print("| call | us/call |")
    print("|---|---:|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values) / 1e3:.1f} |")


def _positional_call(fn: Callable[..., Any], tensors: list[torch.Tensor]) -> Callable[[], object]:
    # Spelled out so that the timed call passes 14 locals, as real call sites do.
    (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13) = tensors

    def call() -> object:
        return fn(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13)

    return call


def _keyword_call(fn: Callable[..., Any], tensors: list[torch.Tensor]) -> Callable[[], object]:
    (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13) = tensors

    def call() -> object:
        return fn(
            mixed_qkv=t0, a=t1, b=t2, A_log=t3, dt_bias=t4, initial_state=t5, d_cache=t6,
            k_cache=t7, out=t8, g_cache=t9, ssm_state_indices=t10, write_pos=t11,
            force_flush=t12, cu_seqlens=t13,
        )  # fmt: skip

    return call


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
