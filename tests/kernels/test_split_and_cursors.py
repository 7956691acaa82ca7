"""The V split and the fused cursor step, on CPU through Helion's interpreter.

On CUDA the kernel splits V over ``split`` programs per (row, value head), each walking its
slice in V tiles (both chosen per regime); on CPU it runs with split 1 and one tile unless told
otherwise. Here every split that divides V must write
the same values to the same places as the replay reference, and ``ReplaySSMCache.decode``'s
one-launch cursor step must move cursors exactly as ``next_write_pos`` says.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")

from replayssm_cases import (  # noqa: E402
    Case,
    cursors_for,
    make_params,
    make_pool,
    make_step,
    rel_err,
    run_kernel,
    run_replay_reference,
)

from replaylint.kernels import ReplaySSMCache, _decode, next_write_pos  # noqa: E402
from replaylint.kernels._configs import fit_split  # noqa: E402

# MHA and GQA; V = 12 makes split 8 fall back to 6 (the largest divisor of V not above 8).
CASES = {
    "mha": Case(batch=4, slots=6, ring_len=4, force_flush_prob=0.3),
    "gqa-v12": Case(
        batch=3, num_heads=1, num_value_heads=2, head_v_dim=12, slots=5, force_flush_prob=0.3
    ),
}


# The flush's ring term as one matrix product per V tile needs every dimension >= 16
# (ring length, V tile, K): a ring of 16 rows with tiles of 16, forced flushes at many cursors.
DOT_CASE = Case(
    batch=3,
    num_heads=2,
    num_value_heads=4,
    head_k_dim=16,
    head_v_dim=32,
    ring_len=16,
    slots=5,
    force_flush_prob=0.4,
)


@pytest.mark.parametrize(("split", "passes"), [(1, 1), (2, 1), (1, 2)])
def test_flush_as_matrix_product_matches_the_replay_reference(
    split: int, passes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_decode, "INTERPRETER_SPLIT", split)
    monkeypatch.setattr(_decode, "INTERPRETER_PASSES", passes)
    monkeypatch.setattr(_decode, "INTERPRETER_BLOCK_V", 16)
    monkeypatch.setattr(_decode, "INTERPRETER_FLUSH", "dot")
    case = DOT_CASE
    gen = torch.Generator().manual_seed(11)
    params = make_params(case, gen)
    pool = make_pool(case)
    ref_pool = pool.clone()
    before = pool.clone()
    cursor_by_slot = torch.randint(0, case.ring_len, (case.slots,), generator=gen)
    flushed = 0
    for step_no in range(20):
        rows = torch.randperm(case.slots, generator=gen)[: case.batch].to(torch.int32)
        step = make_step(case, gen, rows, params)
        write_pos = cursors_for(cursor_by_slot, rows)
        ff = step.force_flush
        flushed += int(
            ((write_pos == case.ring_len - 1) | ((ff != 0) if ff is not None else False)).sum()
        )
        out = run_kernel(step, pool, write_pos, torch.float32, case)
        ref = run_replay_reference(step, ref_pool, write_pos, torch.float32, case)
        assert rel_err(out, ref) < 2e-6, (step_no, rel_err(out, ref))
        for got, want in zip(pool.tensors(), ref_pool.tensors(), strict=True):
            assert rel_err(got, want) < 2e-6, step_no
        nxt = next_write_pos(write_pos, case.ring_len, step.force_flush)
        for row, slot in enumerate(rows.tolist()):
            cursor_by_slot[slot] = nxt[row]
    assert flushed > 5  # the flush path ran, at several cursors
    assert rel_err(pool.state, before.state) > 1e-3


# (split, V tile, passes): whole slices, slices walked in several tiles (a partial last one for
# V=12), and steps in two passes (appending rows, then flushing rows: padding and forced
# flushes mixed in).
LAYOUTS = [(2, None, 1), (4, None, 1), (8, None, 1), (1, 4, 1), (2, 4, 1), (1, None, 2), (2, 4, 2)]


@pytest.mark.parametrize(("split", "block_v", "passes"), LAYOUTS)
@pytest.mark.parametrize("name", list(CASES))
def test_every_split_matches_the_replay_reference(
    name: str, split: int, block_v: int | None, passes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    monkeypatch.setattr(_decode, "INTERPRETER_SPLIT", split)
    monkeypatch.setattr(_decode, "INTERPRETER_BLOCK_V", block_v)
    monkeypatch.setattr(_decode, "INTERPRETER_PASSES", passes)
    gen = torch.Generator().manual_seed(7)
    params = make_params(case, gen)
    pool = make_pool(case)
    ref_pool = pool.clone()
    untouched = pool.clone()
    cursor_by_slot = torch.randint(0, case.ring_len, (case.slots,), generator=gen)
    for step_no in range(6):
        rows = torch.randperm(case.slots, generator=gen)[: case.batch].to(torch.int32)
        rows[step_no % case.batch] = -1  # a padding row
        step = make_step(case, gen, rows, params)
        write_pos = cursors_for(cursor_by_slot, rows)
        out = run_kernel(step, pool, write_pos, torch.float32, case)
        ref = run_replay_reference(step, ref_pool, write_pos, torch.float32, case)
        assert rel_err(out, ref) < 2e-6, (step_no, rel_err(out, ref))
        assert (out[step_no % case.batch] == 0).all()  # padding: zero output
        for got, want in zip(pool.tensors(), ref_pool.tensors(), strict=True):
            assert rel_err(got, want) < 2e-6
        nxt = next_write_pos(write_pos, case.ring_len, step.force_flush)
        for row, slot in enumerate(rows.tolist()):
            if slot >= 0:
                cursor_by_slot[slot] = nxt[row]
    # The test must have moved the pool (else it could not fail).
    assert rel_err(pool.state, untouched.state) > 1e-3
    assert rel_err(pool.d_cache, untouched.d_cache) > 1e-3


def test_fit_split_divides_v() -> None:
    assert [fit_split(s, 128) for s in (1, 2, 4, 8, 16, 300)] == [1, 2, 4, 8, 16, 128]
    assert fit_split(8, 12) == 6
    assert fit_split(8, 7) == 7
    assert fit_split(4, 5) == 1


def test_cache_decode_moves_cursors_like_next_write_pos() -> None:
    """The fused cursor step: rows' cursors gathered and advanced, padding moves nothing."""
    H, HV, K, V, L, slots = 1, 2, 8, 8, 4, 6
    cache = ReplaySSMCache(slots, H, HV, K, V, L)
    start = torch.tensor([0, 3, 1, 2, 3, 1], dtype=torch.int32)
    cache.write_pos.copy_(start)
    rows = torch.tensor([1, -1, 4, 2, 9], dtype=torch.int32)  # 9: past the pool (padding)
    force = torch.tensor([0, 1, 0, 1, 1], dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    out = torch.full((5, 1, HV, V), float("nan"))
    cache.decode(
        torch.randn(5, 2 * H * K + HV * V, generator=gen),
        torch.randn(5, HV, K, generator=gen),
        torch.randn(5, HV, generator=gen),
        torch.zeros(HV),
        torch.zeros(HV, K),
        K**-0.5,
        out,
        rows,
        force,
    )
    # slot 1 at c = 3 = L-1 flushes -> 0; slot 4 at 3 -> 0; slot 2 at 1 with a forced flush -> 0;
    # slots 0, 3, 5 are not in the batch.
    assert cache.write_pos.tolist() == [0, 0, 0, 2, 0, 1]
    rows2 = torch.tensor([0, 5], dtype=torch.int32)
    out2 = torch.full((2, 1, HV, V), float("nan"))
    cache.decode(
        torch.randn(2, 2 * H * K + HV * V, generator=gen),
        torch.randn(2, HV, K, generator=gen),
        torch.randn(2, HV, generator=gen),
        torch.zeros(HV),
        torch.zeros(HV, K),
        K**-0.5,
        out2,
        rows2,
    )
    assert cache.write_pos.tolist() == [1, 0, 0, 2, 0, 2]
    assert torch.isfinite(out).all()
    assert torch.isfinite(out2).all()


def test_cache_decode_moves_nothing_when_an_argument_is_wrong() -> None:
    H, HV, K, V, L = 1, 2, 8, 8, 4
    cache = ReplaySSMCache(3, H, HV, K, V, L)
    cache.write_pos.copy_(torch.tensor([1, 2, 3], dtype=torch.int32))
    before = cache.state_dict()
    with pytest.raises(ValueError, match=r"^b: expected shape \(2, 2\)"):
        cache.decode(
            torch.randn(2, 2 * H * K + HV * V),
            torch.randn(2, HV, K),
            torch.randn(2, HV + 1),  # wrong
            torch.zeros(HV),
            torch.zeros(HV, K),
            K**-0.5,
            torch.empty(2, 1, HV, V),
            torch.tensor([0, 2], dtype=torch.int32),
        )
    after = cache.state_dict()
    for name, tensor in before.items():
        assert torch.equal(tensor, after[name]), name
