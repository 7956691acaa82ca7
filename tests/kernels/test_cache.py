"""ReplaySSMCache: the dtype rule, cursor movement, reset and snapshots (CPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from replayssm_cases import (  # noqa: E402
    Case,
    Pool,
    advance_slots,
    cursors_for,
    make_params,
    make_step,
    rel_err,
    run_kernel,
    run_plain,
)

from replaylint.kernels import ReplaySSMCache, next_write_pos  # noqa: E402

CASE = Case(ring_len=4, batch=3, slots=5, force_flush_prob=0.2)


def _cache(case: Case = CASE, **kwargs: object) -> ReplaySSMCache:
    return ReplaySSMCache(
        case.slots,
        case.num_heads,
        case.num_value_heads,
        case.head_k_dim,
        case.head_v_dim,
        case.ring_len,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_allocates_by_the_dtype_rule(state_dtype: torch.dtype) -> None:
    cache = _cache(state_dtype=state_dtype)
    S, H, HV, K, V, L = 5, 2, 4, 16, 16, 4
    assert cache.state.shape == (S, HV, V, K)
    assert cache.d_cache.shape == (S, HV, L, V)
    assert cache.k_cache.shape == (S, H, L, K)
    assert cache.g_cache.shape == (S, HV, L, K)
    assert cache.state.dtype == state_dtype
    assert cache.d_cache.dtype == state_dtype
    assert cache.k_cache.dtype == state_dtype
    assert cache.g_cache.dtype == torch.float32
    assert cache.write_pos.dtype == torch.int32
    assert cache.write_pos.shape == (S,)
    mixed = _cache(state_dtype=torch.float32, cache_dtype=torch.bfloat16)
    assert mixed.d_cache.dtype == torch.bfloat16
    assert mixed.g_cache.dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"state_dtype": torch.float64}, "state_dtype"),
        ({"state_dtype": torch.int32}, "state_dtype"),
        ({"cache_dtype": torch.int8}, "cache_dtype"),
    ],
)
def test_rejects_bad_dtypes(kwargs: dict[str, object], argument: str) -> None:
    with pytest.raises(ValueError, match=f"^{argument}: expected"):
        _cache(**kwargs)


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match=r"^num_value_heads: expected a multiple of num_heads"):
        ReplaySSMCache(2, 3, 4, 16, 16)
    with pytest.raises(ValueError, match=r"^ring_len: expected an int >= 1"):
        ReplaySSMCache(2, 2, 4, 16, 16, 0)


def test_next_write_pos() -> None:
    L = 4
    c = torch.tensor([0, 1, 2, 3, -2, 9, 1], dtype=torch.int32)
    ff = torch.tensor([0, 0, 0, 0, 0, 0, 1], dtype=torch.int32)
    assert next_write_pos(c, L).tolist() == [1, 2, 3, 0, 1, 0, 2]
    assert next_write_pos(c, L, ff).tolist() == [1, 2, 3, 0, 1, 0, 0]
    assert next_write_pos(c, 1).tolist() == [0] * 7
    assert next_write_pos(c, L).dtype == torch.int32


def test_decode_matches_the_kernel_with_cursors_moved_by_hand() -> None:
    pytest.importorskip("helion")
    case = CASE
    gen = torch.Generator().manual_seed(3)
    params = make_params(case, gen)
    cache = _cache()
    manual = Pool(*(t.clone() for t in (cache.state, cache.d_cache, cache.k_cache, cache.g_cache)))
    cursor = torch.zeros(case.slots, dtype=torch.int32)
    plain = torch.zeros(case.slots, case.num_value_heads, case.head_v_dim, case.head_k_dim)
    plain = plain.double()
    worst = 0.0
    for _ in range(16):
        rows = torch.randperm(case.slots, generator=gen)[: case.batch].to(torch.int32)
        rows[int(torch.randint(case.batch, (1,), generator=gen))] = -1
        step = make_step(case, gen, rows, params)
        out = torch.empty(case.batch, 1, case.num_value_heads, case.head_v_dim)
        cache.decode(
            step.mixed_qkv,
            step.a,
            step.b,
            step.A_log,
            step.dt_bias,
            step.scale,
            out,
            step.ssm_state_indices,
            step.force_flush,
            case.l2norm,
            case.lower_bound,
        )
        write_pos = cursors_for(cursor, rows)
        expected = run_kernel(step, manual, write_pos, torch.float32, case)
        advance_slots(cursor, step, write_pos, case.ring_len)
        assert torch.equal(out, expected)
        assert torch.equal(cache.write_pos, cursor)
        plain_out = run_plain(step.cast(torch.float64), plain, case)
        live = rows >= 0
        worst = max(worst, rel_err(out[live], plain_out[live]))
    for a, b in zip(
        (cache.state, cache.d_cache, cache.k_cache, cache.g_cache), manual.tensors(), strict=True
    ):
        assert torch.equal(a, b)
    assert worst < 2e-6


def test_advance_leaves_padding_and_other_slots_alone() -> None:
    cache = _cache()
    cache.write_pos.copy_(torch.tensor([1, 2, 3, 0, 2], dtype=torch.int32))
    rows = torch.tensor([3, -1, 2, 99], dtype=torch.int32)
    write_pos = cache.write_pos_for(rows)
    assert write_pos.tolist() == [0, 0, 3, 0]
    cache.advance(rows, write_pos, torch.tensor([0, 1, 0, 1], dtype=torch.int32))
    assert cache.write_pos.tolist() == [1, 2, 0, 1, 2]


def test_reset_clears_the_named_slots_only() -> None:
    cache = _cache()
    for t in (cache.state, cache.d_cache, cache.k_cache, cache.g_cache):
        t.copy_(torch.randn_like(t, dtype=torch.float32))
    cache.write_pos.copy_(torch.tensor([1, 2, 3, 0, 2], dtype=torch.int32))
    before = cache.state_dict()
    cache.reset([1, 3])
    after = cache.state_dict()
    for key in ("state", "d_cache", "k_cache", "g_cache", "write_pos"):
        assert not after[key][[1, 3]].any(), key
        assert torch.equal(after[key][[0, 2, 4]], before[key][[0, 2, 4]]), key
    with pytest.raises(ValueError, match=r"^slots: expected indices in \[0, 5\), got \[5\]"):
        cache.reset(torch.tensor([0, 5]))


def test_reset_takes_a_bool_tensor_as_a_mask() -> None:
    cache = _cache()
    for t in (cache.state, cache.d_cache, cache.k_cache, cache.g_cache):
        t.copy_(torch.randn_like(t, dtype=torch.float32))
    cache.write_pos.copy_(torch.tensor([1, 2, 3, 0, 2], dtype=torch.int32))
    before = cache.state_dict()
    cache.reset(torch.tensor([True, False, True, False, False]))
    after = cache.state_dict()
    for key in ("state", "d_cache", "k_cache", "g_cache", "write_pos"):
        assert not after[key][[0, 2]].any(), key
        assert torch.equal(after[key][[1, 3, 4]], before[key][[1, 3, 4]]), key


def test_reset_of_no_slots_changes_nothing() -> None:
    cache = _cache()
    cache.write_pos.copy_(torch.tensor([1, 2, 3, 0, 2], dtype=torch.int32))
    cache.reset([])
    cache.reset(torch.zeros(0, dtype=torch.long))
    assert cache.write_pos.tolist() == [1, 2, 3, 0, 2]


def test_reset_refuses_a_mask_of_the_wrong_length() -> None:
    cache = _cache()
    before = cache.state_dict()
    with pytest.raises(ValueError, match=r"^slots: expected a bool mask of length 5, got 3"):
        cache.reset(torch.tensor([True, False, True]))
    after = cache.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "slots",
    [torch.tensor([1.0, 2.7]), [1.0, 2.0], [1, 2.5], torch.tensor([1 + 0j])],
    ids=["float-tensor", "float-list", "mixed-list", "complex-tensor"],
)
def test_reset_refuses_non_integer_indices(slots: object) -> None:
    cache = _cache()
    cache.write_pos.copy_(torch.tensor([1, 2, 3, 0, 2], dtype=torch.int32))
    before = cache.state_dict()
    with pytest.raises(ValueError, match=r"^slots: expected integer slot indices or a bool mask"):
        cache.reset(slots)  # type: ignore[arg-type]
    after = cache.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_snapshot_round_trip_continues_identically() -> None:
    pytest.importorskip("helion")
    case = CASE
    gen = torch.Generator().manual_seed(4)
    params = make_params(case, gen)
    cache = _cache()
    for t in (cache.state, cache.d_cache, cache.k_cache, cache.g_cache):
        t.copy_(-torch.rand_like(t, dtype=torch.float32))
    cache.write_pos.copy_(torch.tensor([1, 2, 3, 0, 2], dtype=torch.int32))
    restored = _cache()
    restored.load_state_dict(cache.state_dict())
    rows = torch.tensor([0, 2, 4], dtype=torch.int32)
    step = make_step(case, gen, rows, params)
    outs = []
    for c in (cache, restored):
        out = torch.empty(case.batch, 1, case.num_value_heads, case.head_v_dim)
        c.decode(step.mixed_qkv, step.a, step.b, step.A_log, step.dt_bias, step.scale, out, rows)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    for key, value in cache.state_dict().items():
        assert torch.equal(value, restored.state_dict()[key]), key


def test_loading_a_low_precision_gate_snapshot_casts_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The guards warn once per process and dtype; start from a clean slate.
    import replaylint.guards._warn_once as warn_once

    monkeypatch.setattr(warn_once, "_emitted", set())
    cache = _cache()
    snapshot = cache.state_dict()
    snapshot["g_cache"] = -torch.rand_like(snapshot["g_cache"]).to(torch.bfloat16)
    with pytest.warns(UserWarning, match="float32"):
        cache.load_state_dict(snapshot)
    assert cache.g_cache.dtype == torch.float32
    assert torch.equal(cache.g_cache, snapshot["g_cache"].float())


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (
            "state",
            torch.zeros(5, 4, 16, 16, dtype=torch.bfloat16),
            r"^snapshot\['state'\]: expected dtype",
        ),
        ("d_cache", torch.zeros(5, 4, 3, 16), r"^snapshot\['d_cache'\]: expected shape"),
        (
            "write_pos",
            torch.zeros(5, dtype=torch.int64),
            r"^snapshot\['write_pos'\]: expected dtype",
        ),
    ],
)
def test_loading_a_mismatched_snapshot_fails(key: str, value: torch.Tensor, match: str) -> None:
    cache = _cache()
    snapshot = cache.state_dict()
    snapshot[key] = value
    with pytest.raises(ValueError, match=match):
        cache.load_state_dict(snapshot)


def test_loading_a_snapshot_with_missing_keys_fails() -> None:
    cache = _cache()
    snapshot = cache.state_dict()
    del snapshot["g_cache"]
    with pytest.raises(ValueError, match=r"missing \['g_cache'\]"):
        cache.load_state_dict(snapshot)
