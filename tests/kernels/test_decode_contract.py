"""What one kernel step writes, and where (CPU, Helion interpreter).

The contract: ``out`` always; ``initial_state[slot]`` at a flush only; otherwise ring row ``c``
of d (per value head), g (float32, per value head) and k (per key head); nothing for padding
rows or slots outside the batch. Out-of-range indices and cursors never reach memory outside
the pool: slots past the pool are treated as padding and cursors are clamped into [0, L).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")

from replayssm_cases import (  # noqa: E402
    Case,
    Pool,
    Step,
    make_params,
    make_pool,
    make_step,
    run_kernel,
    run_replay_reference,
)

CASE = Case(ring_len=4, batch=4, slots=6, force_flush_prob=0.0)


def _step(case: Case, rows: list[int], force: list[int] | None = None, seed: int = 0) -> Step:
    gen = torch.Generator().manual_seed(seed)
    step = make_step(case, gen, torch.tensor(rows, dtype=torch.int32), make_params(case, gen))
    step.force_flush = None if force is None else torch.tensor(force, dtype=torch.int32)
    return step


def test_writes_exactly_where_the_contract_says() -> None:
    case = CASE
    # Row 0: append at c=1; row 1: natural flush (c = L-1); row 2: padding; row 3: forced
    # flush at c=2. Slots 1 and 3 are not in the batch.
    rows, cursors, force = [4, 0, -1, 5], [1, 3, 2, 2], [0, 0, 0, 1]
    step = _step(case, rows, force)
    pool = make_pool(case)
    before = pool.clone()
    write_pos = torch.tensor(cursors, dtype=torch.int32)
    out = run_kernel(step, pool, write_pos, torch.float32, case)
    ref_pool = before.clone()
    ref_out = run_replay_reference(step, ref_pool, write_pos, torch.float32, case)

    assert torch.equal(out[2], torch.zeros_like(out[2]))  # padding row: zero output
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)

    changed = {name: ~torch.eq(a, b) for name, a, b in _named(pool, before)}
    # Append (slot 4, c=1): ring row 1 of d, g and k change; the checkpoint does not.
    assert changed["state"][4].sum() == 0
    for name in ("d_cache", "g_cache", "k_cache"):
        assert changed[name][4, :, 1].all(), name
        rest = changed[name][4].clone()
        rest[:, 1] = False
        assert not rest.any(), name
    # Flushes (slot 0 natural, slot 5 forced): the checkpoint changes, the ring does not.
    for slot in (0, 5):
        assert changed["state"][slot].all()
        for name in ("d_cache", "g_cache", "k_cache"):
            assert not changed[name][slot].any(), (name, slot)
    # Slots outside the batch: untouched.
    for slot in (1, 2, 3):
        for name, mask in changed.items():
            assert not mask[slot].any(), (name, slot)

    # g lands as float32 with the reference's values; d and k likewise.
    assert pool.g_cache.dtype == torch.float32
    for name, a, b in _named(pool, ref_pool):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_gqa_writes_k_once_per_key_head() -> None:
    case = CASE.with_(num_heads=1, num_value_heads=4)
    pool = make_pool(case)
    rows = [2, 3, -1, 0]
    step = _step(case, rows)
    write_pos = torch.tensor([0, 1, 0, 2], dtype=torch.int32)
    run_kernel(step, pool, write_pos, torch.float32, case)
    ref_pool = make_pool(case)
    run_replay_reference(step, ref_pool, write_pos, torch.float32, case)
    for name, a, b in _named(pool, ref_pool):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    # The key written is the L2-normalised, unscaled k.
    K = case.head_k_dim
    k = step.mixed_qkv[0, K : 2 * K]
    torch.testing.assert_close(pool.k_cache[2, 0, 0], k / torch.sqrt((k * k).sum() + 1e-6))


def _strided(pool: Pool, pad: int, spare_slots: int = 0) -> tuple[Pool, list[torch.Tensor]]:
    """The same pool as views into larger buffers: a slot stride past the slot's size (the
    pool interleaves other data) and a non-zero storage offset. ``spare_slots`` whole slots of
    buffer lie before and after the pool, where slots -1, -2, ... and S, S+1, ... would be."""
    views, bases = [], []
    for t in pool.tensors():
        S, rest = t.size(0), t[0].numel()
        lead = pad + spare_slots * (rest + pad)
        base = torch.full((lead + (S + spare_slots) * (rest + pad),), 7.0, dtype=t.dtype)
        view = base[lead:].as_strided(t.shape, (rest + pad, *t[0].stride()))
        view.copy_(t)
        views.append(view)
        bases.append(base)
    return Pool(*views), bases


def test_strided_pool_views_match_contiguous() -> None:
    case = CASE
    rows, cursors, force = [4, 0, -1, 5], [1, 3, 2, 2], [0, 0, 0, 1]
    step = _step(case, rows, force)
    write_pos = torch.tensor(cursors, dtype=torch.int32)
    dense = make_pool(case)
    strided, bases = _strided(dense, pad=5)
    assert strided.state.storage_offset() == 5
    guard_before = [
        _outside(base, view) for base, view in zip(bases, strided.tensors(), strict=True)
    ]
    out_dense = run_kernel(step, dense, write_pos, torch.float32, case)
    out_strided = run_kernel(step, strided, write_pos, torch.float32, case)
    assert torch.equal(out_dense, out_strided)
    for name, a, b in _named(strided, dense):
        assert torch.equal(a, b), name
    # Nothing between or before the slots was written.
    for before, base, view in zip(guard_before, bases, strided.tensors(), strict=True):
        assert torch.equal(before, _outside(base, view))


def _outside(base: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The elements of ``base`` that ``view`` does not cover."""
    positions = torch.arange(base.numel()).as_strided(
        view.shape, view.stride(), view.storage_offset()
    )
    inside = torch.zeros(base.numel(), dtype=torch.bool)
    inside[positions.reshape(-1)] = True
    return base[~inside].clone()


def test_out_of_range_slots_are_padding_and_cursors_are_clamped() -> None:
    case = CASE
    L = case.ring_len
    # Row 0: slot past the pool; row 1: cursor -3 (-> 0); row 2: cursor L + 5 (-> L-1, flush);
    # row 3: an ordinary append.
    rows, cursors = [case.slots, 1, 2, 3], [0, -3, L + 5, 1]
    step = _step(case, rows)
    write_pos = torch.tensor(cursors, dtype=torch.int32)
    pool = make_pool(case)
    before = pool.clone()
    out = run_kernel(step, pool, write_pos, torch.float32, case)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    ref_pool = before.clone()
    ref_out = run_replay_reference(step, ref_pool, write_pos, torch.float32, case)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    for name, a, b in _named(pool, ref_pool):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    # The same step with the cursors clamped by hand gives bit-identical results.
    clamped_pool = before.clone()
    clamped_out = run_kernel(step, clamped_pool, write_pos.clamp(0, L - 1), torch.float32, case)
    assert torch.equal(out, clamped_out)
    for name, a, b in _named(pool, clamped_pool):
        assert torch.equal(a, b), name
    # Row 1 (cursor -3 -> 0) appended at ring row 0; row 2 (cursor past the end) flushed.
    assert not torch.equal(pool.d_cache[1, :, 0], before.d_cache[1, :, 0])
    assert not torch.equal(pool.state[2], before.state[2])
    assert torch.equal(pool.d_cache[2], before.d_cache[2])


INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)


def test_hostile_slots_and_cursors_never_touch_memory_around_the_pool() -> None:
    """Slots far past the pool or far negative, cursors far out of range: every pool tensor is a
    view into a larger buffer, and the guard bands before, between and after the slots keep
    their bytes. In-range rows still get the reference's result."""
    case = CASE.with_(batch=8, slots=4)
    L = case.ring_len
    rows = [case.slots, INT32_MAX, -5, INT32_MIN, 0, 1, 2, 3]
    cursors = [0, L - 1, 1, 0, INT32_MAX, INT32_MIN, L + 5, -3]
    force = [1, 1, 1, 1, 0, 0, 0, 1]
    step = _step(case, rows, force)
    write_pos = torch.tensor(cursors, dtype=torch.int32)
    dense = make_pool(case)
    strided, bases = _strided(dense.clone(), pad=9, spare_slots=2)
    guard_before = [
        _outside(base, view) for base, view in zip(bases, strided.tensors(), strict=True)
    ]
    out = run_kernel(step, strided, write_pos, torch.float32, case)
    for before, base, view in zip(guard_before, bases, strided.tensors(), strict=True):
        assert torch.equal(before, _outside(base, view))
    # Rows whose slot is outside [0, slots) are padding: zero output, nothing written.
    assert torch.equal(out[:4], torch.zeros_like(out[:4]))
    # The in-range rows behave as with their cursors clamped into [0, L), as the reference does.
    ref_pool = dense.clone()
    ref_out = run_replay_reference(step, ref_pool, write_pos, torch.float32, case)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    for name, a, b in _named(strided, ref_pool):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_empty_pool_makes_every_row_padding() -> None:
    case = CASE.with_(slots=0)
    pool = make_pool(case)
    step = _step(case, [0, -1, 1, 5])
    out = run_kernel(step, pool, torch.tensor([0, 1, 2, 3], dtype=torch.int32), torch.float32, case)
    assert torch.equal(out, torch.zeros_like(out))


def test_cpu_path_needs_no_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HELION_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "HELION_INTERPRET" not in os.environ
    case = CASE
    step = _step(case, [0, 1, -1, 2])
    pool = make_pool(case)
    write_pos = torch.tensor([0, 1, 0, 3], dtype=torch.int32)
    out = run_kernel(step, pool, write_pos, torch.float32, case)
    ref = run_replay_reference(step, make_pool(case), write_pos, torch.float32, case)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_empty_batch_is_a_no_op() -> None:
    case = CASE.with_(batch=0, padding_rows=0)
    pool = make_pool(case)
    before = pool.clone()
    step = _step(case, [])
    out = run_kernel(step, pool, torch.zeros(0, dtype=torch.int32), torch.float32, case)
    assert out.shape == (0, 1, case.num_value_heads, case.head_v_dim)
    for name, a, b in _named(pool, before):
        assert torch.equal(a, b), name


def _named(a: Pool, b: Pool) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    names = ("state", "d_cache", "k_cache", "g_cache")
    return list(zip(names, a.tensors(), b.tensors(), strict=True))
