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


def test_cast_on_cuda_copies_back_only_the_changed_elements(quiet: None) -> None:
    @fp32_gate_cache(policy="cast")
    def write_row(g_cache: Any) -> None:
        g_cache[1] = 0.25

    g = torch.full((3, 2), 1 / 3, dtype=torch.float64, device="cuda")
    write_row(g)
    assert g.cpu().tolist() == [[1 / 3, 1 / 3], [0.25, 0.25], [1 / 3, 1 / 3]]
    read_only = fp32_gate_cache(policy="cast")(lambda g_cache: g_cache.sum())
    expanded = torch.zeros(1, 4, dtype=torch.bfloat16, device="cuda").expand(3, 4)
    assert read_only(expanded).item() == 0.0
    with pytest.raises(GateCacheDtypeError, match=r"outside the range of torch\.float32"):
        read_only(torch.tensor([1e300], dtype=torch.float64, device="cuda"))


def test_cast_on_cuda_sees_writes_made_through_the_data_pointer(quiet: None) -> None:
    @fp32_gate_cache(policy="cast")
    def raw_kernel(g_cache: Any) -> None:
        g_cache.data[2].fill_(7.0)  # like a Triton kernel: autograd's version counter is not bumped

    g = torch.zeros(4, dtype=torch.bfloat16, device="cuda")
    raw_kernel(g)
    assert g.cpu().tolist() == [0.0, 0.0, 7.0, 0.0]


def test_cast_on_a_side_stream_writes_back_on_that_stream(quiet: None) -> None:
    guarded = fp32_gate_cache(policy="cast")(ring_append)
    x, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
    g = torch.zeros(3, 4, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            guarded(x, g, out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert g.cpu().tolist() == [[1.0] * 4] * 3
    assert out.cpu().tolist() == [3.0] * 4


def test_protected_module_moves_to_cuda_and_keeps_float32() -> None:
    from replaylint.guards import assert_fp32_gate_caches, keep_fp32_gate_caches

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.register_buffer("g_cache", torch.rand(2, 4))

        def forward(self, x: Any) -> Any:
            return self.proj(x) * torch.exp(self.g_cache.cumsum(-1)).to(x.dtype)[0]

    layer = keep_fp32_gate_caches(Layer())
    values = layer.g_cache.clone()
    layer.to("cuda", torch.bfloat16)
    assert layer.g_cache.device.type == "cuda"
    assert layer.proj.weight.dtype is torch.bfloat16
    assert_fp32_gate_caches(layer)
    assert torch.equal(layer.g_cache.cpu(), values)
    torch._dynamo.reset()
    out = torch.compile(layer)(torch.ones(2, 4, device="cuda", dtype=torch.bfloat16))
    assert out.dtype is torch.bfloat16
    torch._dynamo.reset()


def test_cast_keeps_the_decode_kernels_ring_writes(quiet: None) -> None:
    # The bundled Triton kernel writes g_cache through its data pointer; under cast those
    # writes must reach the caller's bfloat16 tensor exactly as the float32 run's, rounded.
    kernels = pytest.importorskip("replaylint.kernels")
    from replaylint.guards import guard_policy

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, heads, value_heads, k_dim, v_dim, ring, slots = 2, 1, 2, 16, 16, 4, 3

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", generator=gen)

    inputs = (
        randn(rows, 2 * heads * k_dim + value_heads * v_dim),  # mixed_qkv
        randn(rows, value_heads, k_dim),  # a
        randn(rows, value_heads),  # b
        randn(value_heads),  # A_log
        randn(value_heads, k_dim),  # dt_bias
    )
    indices = torch.tensor([0, 2], dtype=torch.int32, device="cuda")
    write_pos = torch.tensor([0, 1], dtype=torch.int32, device="cuda")

    def run(g_cache: Any) -> Any:
        state = torch.zeros(slots, value_heads, v_dim, k_dim, device="cuda")
        d_cache = torch.zeros(slots, value_heads, ring, v_dim, device="cuda")
        k_cache = torch.zeros(slots, heads, ring, k_dim, device="cuda")
        out = torch.zeros(rows, 1, value_heads, v_dim, device="cuda")
        kernels.replayssm_decode(
            *inputs, k_dim**-0.5, state, d_cache, k_cache, g_cache, out, indices, write_pos
        )
        return out

    g32 = torch.zeros(slots, value_heads, ring, k_dim, device="cuda")
    out32 = run(g32)
    g16 = torch.zeros(slots, value_heads, ring, k_dim, device="cuda", dtype=torch.bfloat16)
    with guard_policy("cast"):
        out16 = run(g16)
    torch.cuda.synchronize()
    assert g32[0, :, 0].abs().sum().item() > 0  # the kernel wrote ring row 0 of slot 0
    assert g32[2, :, 1].abs().sum().item() > 0  # and ring row 1 of slot 2
    assert torch.equal(g16, g32.to(torch.bfloat16))
    assert torch.equal(out16, out32)  # the kernel ran on the float32 copy
