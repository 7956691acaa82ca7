"""CUDA: the float32 path does no device work and never synchronises; cast refuses capture."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import GateCacheDtypeError, fp32_gate_cache  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def ring_append(x: Any, g_cache: Any, out: Any) -> Any:
    """Shifts the ring by one row and appends x (in place), then writes a checksum into out."""
    g_cache.copy_(torch.roll(g_cache, shifts=-1, dims=0))
    g_cache[-1].copy_(x)
    out.copy_(g_cache.sum(dim=0))
    return out


@pytest.fixture
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_float32_path_never_synchronises() -> None:
    guarded = fp32_gate_cache(ring_append)
    x, g, out = (
        torch.ones(4, device="cuda"),
        torch.zeros(3, 4, device="cuda"),
        torch.zeros(4, device="cuda"),
    )
    guarded(x, g, out)  # warm-up outside the sync check (first-call allocator work)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            guarded(x, g, out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.tolist() == [3.0] * 4  # the ring's three rows all hold x = 1 after four appends


def test_captured_guarded_function_replays_correctly() -> None:
    guarded = fp32_gate_cache(ring_append)
    x = torch.zeros(4, device="cuda")
    g = torch.zeros(3, 4, device="cuda")
    out = torch.zeros(4, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        guarded(x, g, out)  # warm-up on a side stream, as torch.cuda.graphs recommends
    torch.cuda.current_stream().wait_stream(side)
    g.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        guarded(x, g, out)
    g.zero_()
    for step in range(1, 6):
        x.fill_(float(step))
        graph.replay()
    torch.cuda.synchronize()
    assert g[:, 0].tolist() == [3.0, 4.0, 5.0]  # the last three appended rows
    assert out.tolist() == [12.0] * 4


def test_cast_refuses_to_run_inside_capture(quiet: None) -> None:
    guarded = fp32_gate_cache(policy="cast")(ring_append)
    x, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
    g = torch.zeros(3, 4, device="cuda", dtype=torch.bfloat16)
    guarded(x, g, out)  # eager cast is fine
    torch.cuda.synchronize()
    assert g.dtype is torch.bfloat16
    assert g.device.type == "cuda"
    assert g[-1].tolist() == [1.0] * 4
    graph = torch.cuda.CUDAGraph()
    with (
        pytest.raises(GateCacheDtypeError, match=r"a CUDA graph is being captured") as info,
        torch.cuda.graph(graph),
    ):
        guarded(x, g, out)
    assert "allocate it as torch.float32 before capture" in str(info.value)


def test_reject_and_warn_inside_capture(quiet: None) -> None:
    g = torch.zeros(3, 4, device="cuda", dtype=torch.bfloat16)
    x, out = (
        torch.ones(4, device="cuda", dtype=torch.bfloat16),
        torch.zeros(4, device="cuda", dtype=torch.bfloat16),
    )
    with (
        pytest.raises(GateCacheDtypeError, match=r"must be torch\.float32"),
        torch.cuda.graph(torch.cuda.CUDAGraph()),
    ):
        fp32_gate_cache(ring_append)(x, g, out)
    graph = torch.cuda.CUDAGraph()
    warn_guarded = fp32_gate_cache(policy="warn")(ring_append)
    warn_guarded(x, g, out)  # warm-up
    with torch.cuda.graph(graph):
        warn_guarded(x, g, out)  # passes through: the kernel runs on the caller's bf16 tensor
    g.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert g[-1].tolist() == [1.0] * 4


def test_compiled_guard_on_cuda(quiet: None) -> None:
    torch._dynamo.reset()
    x, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
    g = torch.zeros(3, 4, device="cuda")
    torch.compile(fp32_gate_cache(ring_append), fullgraph=True)(x, g, out)
    g16 = torch.zeros(3, 4, device="cuda", dtype=torch.bfloat16)
    torch.compile(fp32_gate_cache(policy="cast")(ring_append), fullgraph=True)(x, g16, out)
    torch.cuda.synchronize()
    assert g[-1].tolist() == [1.0] * 4
    assert g16[-1].tolist() == [1.0] * 4
    torch._dynamo.reset()
