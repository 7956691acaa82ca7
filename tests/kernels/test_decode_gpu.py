"""The compiled kernel on CUDA: model shapes over many steps, strided pools, the int64 index
path, and a CUDA graph of 20 decode steps (with cursor movement) replayed against eager.

Tolerances as in test_decode_steps.py (the kernel computes in float32 whatever the storage).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")

from replaylint.kernels import ReplaySSMCache, _decode, next_write_pos, replayssm_decode  # noqa: E402
from replaylint.kernels._configs import CONFIGS  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEV = "cuda"
# kernel vs the float64 plain recurrence (the truth); see test_decode_steps.py for the bounds.
TRUTH_TOL = {torch.float32: 2e-6, torch.bfloat16: 3e-2}


def _inputs(
    B: int, H: int, HV: int, K: int, V: int, dtype: torch.dtype, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    mixed = torch.randn(B, 2 * H * K + HV * V, generator=gen, device=DEV)
    return {
        "mixed_qkv": mixed.to(dtype),
        "a": torch.randn(B, HV, K, generator=gen, device=DEV).to(dtype),
        "b": torch.randn(B, HV, generator=gen, device=DEV).to(dtype),
    }


def _params(HV: int, K: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    A_log = torch.linspace(-4.0, 0.5, HV, device=DEV)
    dt_bias = 0.5 * torch.randn(HV, K, generator=gen, device=DEV)
    return A_log, dt_bias


def _plain_step(
    inp: dict[str, torch.Tensor],
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    state64: torch.Tensor,
    idx: torch.Tensor,
    H: int,
    lower_bound: float | None,
) -> torch.Tensor:
    """The plain KDA recurrence in float64, batched over rows (rows with idx < 0 skipped)."""
    B = idx.numel()
    HV, V, K = state64.shape[1:]
    x = inp["mixed_qkv"].double()
    q = x[:, : H * K].reshape(B, H, K)
    k = x[:, H * K : 2 * H * K].reshape(B, H, K)
    v = x[:, 2 * H * K :].reshape(B, HV, V)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)  # use_qk_l2norm_in_kernel=True
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    group = HV // H
    q = (q * scale).repeat_interleave(group, 1)
    k = k.repeat_interleave(group, 1)
    gx = inp["a"].double().reshape(B, HV, K) + dt_bias.double()
    A = torch.exp(A_log.double())[None, :, None]
    if lower_bound is None:
        g = -A * torch.nn.functional.softplus(gx)
    else:
        g = lower_bound * torch.sigmoid(A * gx)
    b = inp["b"]
    beta = torch.sigmoid(b.double()).to(b.dtype).double()
    live = idx >= 0
    slots = idx[live].long()
    S = state64[slots] * torch.exp(g[live])[:, :, None, :]
    delta = beta[live][..., None] * (v[live] - torch.einsum("bhvk,bhk->bhv", S, k[live]))
    S = S + delta[..., None] * k[live][:, :, None, :]
    state64[slots] = S
    out = torch.zeros(B, 1, HV, V, dtype=torch.float64, device=DEV)
    out[live, 0] = torch.einsum("bhvk,bhk->bhv", S, q[live])
    return out


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return math.inf
    return float((x - ref).norm() / ref.norm())


SHAPES = {
    # name: (B, H, HV, K, V, L, lower_bound)
    "kimi-b1": (1, 32, 32, 128, 128, 16, None),
    "kimi-b64": (64, 32, 32, 128, 128, 16, None),
    "kimi-b256": (256, 32, 32, 128, 128, 16, None),
    "k3-tp8-b33": (33, 12, 12, 128, 128, 16, -5.0),
    "gqa-b16": (16, 4, 16, 128, 64, 8, None),
}


def _fill_ring(cache: ReplaySSMCache, gen: torch.Generator) -> None:
    """Realistic ring contents: past deltas, unit keys, negative log-decays."""
    cache.d_cache.copy_(0.1 * torch.randn(cache.d_cache.shape, generator=gen, device=DEV))
    k = torch.randn(cache.k_cache.shape, generator=gen, device=DEV)
    cache.k_cache.copy_(k / k.norm(dim=-1, keepdim=True))
    cache.g_cache.copy_(-0.5 * torch.rand(cache.g_cache.shape, generator=gen, device=DEV))


def _rebuild64(cache: ReplaySSMCache) -> torch.Tensor:
    """The full state per slot, in float64: checkpoint plus the live ring rows (j < cursor)."""
    group = cache.state.size(1) // cache.k_cache.size(1)
    live = torch.arange(cache.ring_len, device=DEV)[None, :] < cache.write_pos.long()[:, None]
    mask = live[:, None, :, None].double()
    g = cache.g_cache.double() * mask
    G, G_T = torch.cumsum(g, 2), g.sum(2)
    k = cache.k_cache.double().repeat_interleave(group, 1)
    W = torch.exp(G_T[:, :, None, :] - G) * k * mask
    d = cache.d_cache.double() * mask
    S0 = cache.state.double() * torch.exp(G_T)[:, :, None, :]
    return S0 + torch.einsum("shjv,shjk->shvk", d, W)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_many_steps_match_the_plain_recurrence(shape: str, state_dtype: torch.dtype) -> None:
    B, H, HV, K, V, L, lb = SHAPES[shape]
    gen = torch.Generator(device=DEV).manual_seed(0)
    act_dtype = torch.bfloat16 if state_dtype == torch.bfloat16 else torch.float32
    slots = B + 3  # three slots stay outside the batch
    cache = ReplaySSMCache(slots, H, HV, K, V, L, state_dtype=state_dtype, device=DEV)
    cache.state.copy_(0.1 * torch.randn(cache.state.shape, generator=gen, device=DEV))
    _fill_ring(cache, gen)
    # Staggered cursors: every launch mixes appends and flushes, as in serving; the rows
    # before each cursor are live history the plain recurrence must start from.
    cache.write_pos.copy_(torch.randint(0, L, (slots,), generator=gen, device=DEV))
    plain = _rebuild64(cache)
    A_log, dt_bias = _params(HV, K, gen)
    scale = K**-0.5
    idle = torch.tensor([0, slots // 2, slots - 1], device=DEV)
    pool = (cache.state, cache.d_cache, cache.k_cache, cache.g_cache)
    idle_before = [t[idle].clone() for t in pool]
    busy = torch.tensor([s for s in range(slots) if s not in idle.tolist()], device=DEV)
    worst = 0.0
    for step in range(L + 8):
        idx = busy[torch.randperm(B, generator=gen, device=DEV)].to(torch.int32)
        if B > 1:
            idx[step % B] = -1  # one padding row per step
        ff = (torch.rand(B, generator=gen, device=DEV) < 0.05).to(torch.int32)
        inp = _inputs(B, H, HV, K, V, act_dtype, gen)
        out = torch.full((B, 1, HV, V), float("nan"), dtype=act_dtype, device=DEV)
        cache.decode(
            **inp,
            A_log=A_log,
            dt_bias=dt_bias,
            scale=scale,
            out=out,
            ssm_state_indices=idx,
            force_flush=ff,
            use_qk_l2norm_in_kernel=True,
            lower_bound=lb,
        )
        ref = _plain_step(inp, A_log, dt_bias, scale, plain, idx, H, lb)
        live = idx >= 0
        assert torch.equal(out[~live].float(), torch.zeros_like(out[~live].float()))
        worst = max(worst, _rel(out[live], ref[live]))
    state_err = _rel(_rebuild64(cache)[busy], plain[busy])
    print(f"{shape} {state_dtype}: output error {worst:.2e}, state error {state_err:.2e}")
    assert worst <= TRUTH_TOL[state_dtype]
    assert state_err <= TRUTH_TOL[state_dtype]
    for before, t in zip(idle_before, pool, strict=True):
        assert torch.equal(before, t[idle])


def _pool_views(
    shape: list[tuple[int, ...]], dtypes: list[torch.dtype], pad: int, gen: torch.Generator
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Pool tensors as views into larger buffers (slot stride > slot size, storage offset)."""
    views, bases = [], []
    for dims, dtype in zip(shape, dtypes, strict=True):
        S, rest = dims[0], math.prod(dims[1:])
        base = torch.randn(pad + S * (rest + pad), generator=gen, device=DEV).to(dtype)
        inner = torch.empty(dims[1:]).stride()
        views.append(base[pad:].as_strided(dims, (rest + pad, *inner)))
        bases.append(base)
    return views, bases


def _outside(base: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The elements of ``base`` that ``view`` does not cover."""
    positions = torch.arange(base.numel(), device=DEV).as_strided(
        view.shape, view.stride(), view.storage_offset()
    )
    inside = torch.zeros(base.numel(), dtype=torch.bool, device=DEV)
    inside[positions.reshape(-1)] = True
    return base[~inside].clone()


# Other strides change Triton's vectorisation and so the order of float32 sums: results agree
# to rounding (bf16 outputs: a rare one-ulp flip), not bit for bit.
SAME_MATH_TOL = 1e-3


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_strided_pool_views_match_contiguous(state_dtype: torch.dtype) -> None:
    B, H, HV, K, V, L, S = 64, 32, 32, 128, 128, 16, 70
    gen = torch.Generator(device=DEV).manual_seed(1)
    dims = [(S, HV, V, K), (S, HV, L, V), (S, H, L, K), (S, HV, L, K)]
    dtypes = [state_dtype, state_dtype, state_dtype, torch.float32]
    views, bases = _pool_views(dims, dtypes, 77, gen)
    views[0].mul_(0.1)
    views[1].mul_(0.1)
    views[2].div_(views[2].float().norm(dim=-1, keepdim=True).to(views[2].dtype))
    views[3].copy_(-0.5 * views[3].abs())
    dense = [v.contiguous() for v in views]
    assert views[0].storage_offset() == 77
    assert not views[0].is_contiguous()
    gaps = [_outside(base, view) for base, view in zip(bases, views, strict=True)]
    idx = torch.randperm(S, generator=gen, device=DEV)[:B].to(torch.int32)
    idx[5] = -1
    write_pos = torch.randint(0, L, (B,), generator=gen, device=DEV).to(torch.int32)
    ff = (torch.rand(B, generator=gen, device=DEV) < 0.2).to(torch.int32)
    inp = _inputs(B, H, HV, K, V, torch.bfloat16, gen)
    A_log, dt_bias = _params(HV, K, gen)
    outs = []
    for pool in (views, dense):
        out = torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=DEV)
        replayssm_decode(
            **inp,
            A_log=A_log,
            dt_bias=dt_bias,
            scale=K**-0.5,
            initial_state=pool[0],
            d_cache=pool[1],
            k_cache=pool[2],
            g_cache=pool[3],
            out=out,
            ssm_state_indices=idx,
            write_pos=write_pos,
            force_flush=ff,
            use_qk_l2norm_in_kernel=True,
        )
        outs.append(out)
    assert _rel(outs[0], outs[1]) <= SAME_MATH_TOL
    for v, d in zip(views, dense, strict=True):
        assert _rel(v, d) <= SAME_MATH_TOL
    for gap, base, view in zip(gaps, bases, views, strict=True):
        assert torch.equal(gap, _outside(base, view))  # nothing between the slots was written


def test_pool_past_int32_offsets_uses_int64_indexing() -> None:
    """A view whose span passes 2**31 elements must not wrap its offsets."""
    B, H, HV, K, V, L = 2, 4, 4, 128, 128, 4
    slot_size = HV * V * K
    stride = 2**31 // 2 + slot_size  # slot 2 starts past element 2**31
    base = torch.zeros(2 * stride + slot_size, dtype=torch.bfloat16, device=DEV)
    state = base.as_strided((3, HV, V, K), (stride, V * K, K, 1))
    gen = torch.Generator(device=DEV).manual_seed(2)
    state.copy_(0.1 * torch.randn(state.shape, generator=gen, device=DEV))
    rings = [
        torch.zeros(3, HV, L, V, dtype=torch.bfloat16, device=DEV),
        torch.zeros(3, H, L, K, dtype=torch.bfloat16, device=DEV),
        torch.zeros(3, HV, L, K, device=DEV),
    ]
    dense = state.contiguous()
    dense_rings = [r.clone() for r in rings]
    slot2_before = state[2].clone()
    idx = torch.tensor([2, 0], dtype=torch.int32, device=DEV)
    wp = torch.tensor([L - 1, 0], dtype=torch.int32, device=DEV)  # row 0 flushes into slot 2
    inp = _inputs(B, H, HV, K, V, torch.bfloat16, gen)
    A_log, dt_bias = _params(HV, K, gen)
    outs = []
    for s, r in ((state, rings), (dense, dense_rings)):
        out = torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=DEV)
        replayssm_decode(
            **inp,
            A_log=A_log,
            dt_bias=dt_bias,
            scale=K**-0.5,
            initial_state=s,
            d_cache=r[0],
            k_cache=r[1],
            g_cache=r[2],
            out=out,
            ssm_state_indices=idx,
            write_pos=wp,
            use_qk_l2norm_in_kernel=True,
        )
        outs.append(out)
    torch.cuda.synchronize()
    assert _rel(outs[0], outs[1]) <= SAME_MATH_TOL
    assert _rel(state, dense) <= SAME_MATH_TOL
    assert not torch.equal(state[2], slot2_before)  # the flush landed in slot 2, past 2**31
    del base


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_graph_of_20_steps_replays_like_eager(state_dtype: torch.dtype) -> None:
    B, H, HV, K, V, L, steps = 48, 32, 32, 128, 128, 16, 20
    gen = torch.Generator(device=DEV).manual_seed(3)
    cache = ReplaySSMCache(B + 2, H, HV, K, V, L, state_dtype=state_dtype, device=DEV)
    cache.state.copy_(0.1 * torch.randn(cache.state.shape, generator=gen, device=DEV))
    cache.write_pos.copy_(torch.randint(0, L, (B + 2,), generator=gen, device=DEV))
    start = cache.state_dict()
    A_log, dt_bias = _params(HV, K, gen)
    idx = torch.randperm(B + 2, generator=gen, device=DEV)[:B].to(torch.int32)
    idx[3] = -1
    inputs = [_inputs(B, H, HV, K, V, torch.bfloat16, gen) for _ in range(steps)]
    flushes = [
        (torch.rand(B, generator=gen, device=DEV) < 0.1).to(torch.int32) for _ in range(steps)
    ]
    outs = [torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=DEV) for _ in range(steps)]

    def run() -> None:
        for inp, ff, out in zip(inputs, flushes, outs, strict=True):
            cache.decode(
                **inp,
                A_log=A_log,
                dt_bias=dt_bias,
                scale=K**-0.5,
                out=out,
                ssm_state_indices=idx,
                force_flush=ff,
                use_qk_l2norm_in_kernel=True,
            )

    run()  # eager: compiles, and gives the expected results
    torch.cuda.synchronize()
    eager_outs = [o.clone() for o in outs]
    eager_pool = cache.state_dict()
    # The cursors moved and crossed at least one natural flush during the 20 steps.
    assert not torch.equal(eager_pool["write_pos"], start["write_pos"])

    cache.load_state_dict(start)
    for o in outs:
        o.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm-up on a side stream, as capture requires
    torch.cuda.current_stream().wait_stream(side)
    cache.load_state_dict(start)
    with torch.cuda.graph(graph):
        run()
    cache.load_state_dict(start)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, eager_outs, strict=True):
        assert torch.equal(got, want)
    for key, value in cache.state_dict().items():
        assert torch.equal(value, eager_pool[key]), key
    # And the cursors are what next_write_pos says, step after step.
    cursor = start["write_pos"].clone()
    live = idx >= 0
    for ff in flushes:
        nxt = next_write_pos(cursor[idx[live].long()], L, ff[live])
        cursor[idx[live].long()] = nxt
    assert torch.equal(cursor, cache.write_pos)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_out_of_range_slots_and_cursors_touch_nothing(state_dtype: torch.dtype) -> None:
    """Slots past the pool and negative slots give zero rows and write nothing; cursors outside
    [0, L) are clamped (so they can never address memory outside the ring)."""
    B, H, HV, K, V, L, S = 6, 4, 8, 128, 128, 16, 4
    gen = torch.Generator(device=DEV).manual_seed(4)
    cache = ReplaySSMCache(S, H, HV, K, V, L, state_dtype=state_dtype, device=DEV)
    cache.state.copy_(0.1 * torch.randn(cache.state.shape, generator=gen, device=DEV))
    _fill_ring(cache, gen)
    pool = (cache.state, cache.d_cache, cache.k_cache, cache.g_cache)
    before = [t.clone() for t in pool]
    # Rows: past the pool (S, S + 1000, 2**31 - 1), padding (-1, -2**31), one real slot.
    idx = torch.tensor([S, S + 1000, 2**31 - 1, -1, -(2**31), 1], dtype=torch.int32, device=DEV)
    write_pos = torch.tensor([3, 0, 15, 2, 1, 2**30], dtype=torch.int32, device=DEV)
    inp = _inputs(B, H, HV, K, V, torch.bfloat16, gen)
    A_log, dt_bias = _params(HV, K, gen)
    out = torch.full((B, 1, HV, V), float("nan"), dtype=torch.bfloat16, device=DEV)
    replayssm_decode(
        **inp,
        A_log=A_log,
        dt_bias=dt_bias,
        scale=K**-0.5,
        initial_state=cache.state,
        d_cache=cache.d_cache,
        k_cache=cache.k_cache,
        g_cache=cache.g_cache,
        out=out,
        ssm_state_indices=idx,
        write_pos=write_pos,
        use_qk_l2norm_in_kernel=True,
    )
    torch.cuda.synchronize()
    assert torch.equal(out[:5].float(), torch.zeros_like(out[:5].float()))
    assert bool(torch.isfinite(out[5].float()).all())
    # Only slot 1 changed: its cursor 2**30 clamps to L - 1, a flush into the state.
    others = [0, 2, 3]
    for b, t in zip(before, pool, strict=True):
        assert torch.equal(b[others], t[others])
    assert not torch.equal(before[0][1], cache.state[1])
    for b, t in zip(before[1:], pool[1:], strict=True):
        assert torch.equal(b[1], t[1])  # a flush leaves the ring alone


def test_launch_respecialises_on_alignment_and_batch() -> None:
    """Repeat launches replay a recorded launch (``replaylint.kernels._launch``): its
    cache key must still tell a 16-byte-aligned view from an unaligned one, and one batch size
    from another. Misusing an aligned build on unaligned data would fault or read wrong data."""
    H, HV, K, V, L, S = 4, 8, 128, 128, 16, 40
    gen = torch.Generator(device=DEV).manual_seed(5)
    cache = ReplaySSMCache(S, H, HV, K, V, L, state_dtype=torch.float32, device=DEV)
    cache.state.copy_(0.1 * torch.randn(cache.state.shape, generator=gen, device=DEV))
    _fill_ring(cache, gen)
    start = [t.clone() for t in (cache.state, cache.d_cache, cache.k_cache, cache.g_cache)]
    A_log, dt_bias = _params(HV, K, gen)
    for B in (32, 17, 32, 3, 17):
        idx = torch.randperm(S, generator=gen, device=DEV)[:B].to(torch.int32)
        write_pos = torch.randint(0, L, (B,), generator=gen, device=DEV).to(torch.int32)
        inp = _inputs(B, H, HV, K, V, torch.bfloat16, gen)
        width = inp["mixed_qkv"].size(1)
        # The same activations at an odd element offset: not 16-byte aligned.
        shifted = torch.empty(B, width + 1, dtype=torch.bfloat16, device=DEV)[:, 1:]
        shifted.copy_(inp["mixed_qkv"])
        outs = []
        for mixed in (inp["mixed_qkv"], shifted, inp["mixed_qkv"]):
            for t, s in zip(
                (cache.state, cache.d_cache, cache.k_cache, cache.g_cache), start, strict=True
            ):
                t.copy_(s)
            out = torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=DEV)
            replayssm_decode(
                mixed,
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
            outs.append(out)
        torch.cuda.synchronize()
        assert torch.equal(outs[0], outs[2])
        assert _rel(outs[1], outs[0]) <= SAME_MATH_TOL


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_two_pass_steps_match_one_pass_steps(state_dtype: torch.dtype) -> None:
    """A step in two launches (appending rows, then flushing rows) writes what one launch
    writes: staggered cursors, forced flushes and a padding row, several steps, also replayed
    from a CUDA graph."""
    B, H, HV, K, V, L, S = 40, 8, 16, 128, 128, 16, 44
    gen = torch.Generator(device=DEV).manual_seed(6)
    cache = ReplaySSMCache(S, H, HV, K, V, L, state_dtype=state_dtype, device=DEV)
    cache.state.copy_(0.1 * torch.randn(cache.state.shape, generator=gen, device=DEV))
    _fill_ring(cache, gen)
    start = [t.clone() for t in (cache.state, cache.d_cache, cache.k_cache, cache.g_cache)]
    A_log, dt_bias = _params(HV, K, gen)
    idx = torch.randperm(S, generator=gen, device=DEV)[:B].to(torch.int32)
    idx[5] = -1
    steps = [
        (
            _inputs(B, H, HV, K, V, torch.bfloat16, gen),
            torch.randint(0, L, (B,), generator=gen, device=DEV).to(torch.int32),
            (torch.rand(B, generator=gen, device=DEV) < 0.2).to(torch.int32),
        )
        for _ in range(4)
    ]
    results = []
    for passes in (1, 2):
        config = {
            "split": 1,
            "flush": "dot",
            "dot_precision": "ieee",
            "passes": passes,
            "block_sizes": [16],
            "num_warps": 1,
            "num_stages": 1,
        }
        _decode.CONFIG_OVERRIDE = dict.fromkeys(CONFIGS, config)
        try:
            pool = [s.clone() for s in start]
            outs = [torch.full((B, 1, HV, V), float("nan"), dtype=torch.bfloat16, device=DEV)]
            outs += [torch.empty_like(outs[0]) for _ in steps[1:]]

            def run(pool: list[torch.Tensor] = pool, outs: list[torch.Tensor] = outs) -> None:
                for (inp, write_pos, ff), out in zip(steps, outs, strict=True):
                    replayssm_decode(
                        **inp,
                        A_log=A_log,
                        dt_bias=dt_bias,
                        scale=K**-0.5,
                        initial_state=pool[0],
                        d_cache=pool[1],
                        k_cache=pool[2],
                        g_cache=pool[3],
                        out=out,
                        ssm_state_indices=idx,
                        write_pos=write_pos,
                        force_flush=ff,
                        use_qk_l2norm_in_kernel=True,
                    )

            run()  # eager (compiles), then the same steps again from a graph
            torch.cuda.synchronize()
            eager = [t.clone() for t in (*outs, *pool)]
            for t, s in zip(pool, start, strict=True):
                t.copy_(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            for t, s in zip(pool, start, strict=True):
                t.copy_(s)
            graph.replay()
            torch.cuda.synchronize()
            for got, want in zip((*outs, *pool), eager, strict=True):
                assert torch.equal(got, want)
            results.append(eager)
        finally:
            _decode.CONFIG_OVERRIDE = None
    for out in results[0][: len(steps)]:
        assert bool(torch.isfinite(out.float()).all())
        assert torch.equal(out[5].float(), torch.zeros_like(out[5].float()))  # padding row
    # The same arithmetic in both: float32 values agree to rounding of the summation order;
    # bf16 ones (outputs, bf16 pools) to a few flipped roundings.
    for got, want in zip(results[1], results[0], strict=True):
        assert _rel(got, want) <= (1e-5 if got.dtype == torch.float32 else SAME_MATH_TOL)
    assert _rel(results[0][len(steps)], start[0]) > 1e-3  # the steps flushed into the state
