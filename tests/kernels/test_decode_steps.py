"""Many decode steps on CPU: kernel (Helion interpreter) == replay reference == plain recurrence.

Tolerances are norm-wise relative errors ||x - ref|| / ||ref|| of each step's output, derived
from the storage dtypes (unit roundoff u: fp32 2^-24 = 6e-8, fp16 2^-11 = 4.9e-4,
bf16 2^-8 = 3.9e-3):

* kernel vs the replay reference at the same storage dtypes: the same float32 arithmetic in
  another summation order, ~sqrt(K) * u32 ~ 2.5e-7 per step, and both round every stored value
  (d/k ring rows, a bf16/fp16 checkpoint) the same way except when it sits on a rounding
  boundary, where they land one ulp apart. Such flips touch a few elements, so the norm-wise
  difference stays below one ulp of the storage dtype: 2e-6 (fp32), 5e-4 (fp16), 4e-3 (bf16).
* the replay reference vs the plain recurrence, both in float64: the algebra alone, 1e-10.
* the kernel vs the float64 plain recurrence (the truth): every output reads a checkpoint
  rounded to the state dtype plus up to L ring rows rounded to the ring dtype, each with
  relative error <= u. Decays < 1 and the normalised delta rule keep this from compounding
  (states are folded at every flush, not re-rounded L times), so the error stays a small
  multiple of u of the coarsest storage or input dtype: 2e-6 (all fp32), 8 u = 4e-3 (fp16),
  8 u = 3e-2 (bf16). The same bound holds for whole states after a final forced flush.
Measured values sit 5-10x inside these (see docs/kernels.md).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")

from replayssm_cases import (  # noqa: E402
    Case,
    advance_slots,
    cursors_for,
    make_params,
    make_pool,
    make_step,
    rel_err,
    run_kernel,
    run_plain,
    run_replay_reference,
)

STEPS = 40

# (tolerance vs replay reference at the same dtypes, tolerance vs float64 plain recurrence)
TOLERANCES = {
    torch.float32: (2e-6, 2e-6),
    torch.float16: (5e-4, 4e-3),
    torch.bfloat16: (4e-3, 3e-2),
}


def _coarsest(case: Case) -> torch.dtype:
    order = [torch.float32, torch.float16, torch.bfloat16]
    dtypes = [case.state_dtype, case.ring_dtype, case.input_dtype]
    return max(dtypes, key=order.index)


CASES = {
    "L1": Case(ring_len=1, slots=6),
    "L2": Case(ring_len=2, slots=6),
    "L4": Case(ring_len=4, slots=6),
    # At L = 16 random forced flushes would rarely let a slot reach a natural one: schedule them.
    "L16": Case(ring_len=16, slots=6, forced_at=((9, 0), (30, 0)), seed=5),
    "L4-bf16": Case(
        ring_len=4,
        state_dtype=torch.bfloat16,
        input_dtype=torch.bfloat16,
        seed=1,
    ),
    "L4-fp16": Case(
        ring_len=4,
        state_dtype=torch.float16,
        input_dtype=torch.float16,
        seed=2,
    ),
    "L16-fp32-state-bf16-rings": Case(
        ring_len=16,
        cache_dtype=torch.bfloat16,
        input_dtype=torch.bfloat16,
        forced_at=((5, 1), (20, 0)),
        seed=3,
    ),
    "L4-bounded-no-l2-mha": Case(
        ring_len=4,
        num_heads=2,
        num_value_heads=2,
        lower_bound=-5.0,
        l2norm=False,
        seed=4,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_many_steps_agree(name: str) -> None:
    case = CASES[name]
    gen = torch.Generator().manual_seed(case.seed)
    params = make_params(case, gen)
    kernel_pool = make_pool(case)
    same_pool = kernel_pool.clone()  # the replay reference at the kernel's storage dtypes
    pool64 = kernel_pool.to(torch.float64, torch.float64)  # the replay reference in float64
    plain64 = kernel_pool.state.to(torch.float64)  # plain recurrence, full state per slot
    # The ring starts stale (random) with every cursor at 0: its contents must never be read.
    cursor = torch.zeros(case.slots, dtype=torch.int32)
    active = torch.randperm(case.slots, generator=gen)[: case.batch - case.padding_rows]
    idle = sorted(set(range(case.slots)) - set(active.tolist()))
    idle_before = [t[idle].clone() for t in kernel_pool.tensors()]
    tol_same, tol_truth = TOLERANCES[_coarsest(case)]
    natural = forced = 0
    worst = {"same": 0.0, "algebra": 0.0, "truth": 0.0}
    for i in range(STEPS):
        rows = torch.cat([active.to(torch.int32), torch.full((case.padding_rows,), -1)])
        rows = rows[torch.randperm(case.batch, generator=gen)].to(torch.int32)
        step = make_step(case, gen, rows, params)
        if case.forced_at:
            forced_slots = [int(active[j]) for when, j in case.forced_at if when == i]
            step.force_flush = torch.isin(rows, torch.tensor(forced_slots)).to(torch.int32)
        write_pos = cursors_for(cursor, rows)
        live = rows >= 0
        natural += int(((write_pos == case.ring_len - 1) & live).sum())
        assert step.force_flush is not None
        forced += int(((step.force_flush != 0) & (write_pos != case.ring_len - 1) & live).sum())

        out_kernel = run_kernel(step, kernel_pool, write_pos, case.input_dtype, case)
        out_same = run_replay_reference(step, same_pool, write_pos, case.input_dtype, case)
        step64 = step.cast(torch.float64)
        out64 = run_replay_reference(step64, pool64, write_pos, torch.float64, case)
        out_plain = run_plain(step64, plain64, case)

        assert torch.equal(out_kernel[~live], torch.zeros_like(out_kernel[~live]))
        worst["same"] = max(worst["same"], rel_err(out_kernel[live], out_same[live]))
        worst["algebra"] = max(worst["algebra"], rel_err(out64[live], out_plain[live]))
        worst["truth"] = max(worst["truth"], rel_err(out_kernel[live], out_plain[live]))
        advance_slots(cursor, step, write_pos, case.ring_len)

    # Fold every ring into its checkpoint (a forced flush of all active slots) and compare
    # whole states, not only outputs.
    rows = torch.cat([active.to(torch.int32), torch.full((case.padding_rows,), -1)])
    step = make_step(case, gen, rows.to(torch.int32), params)
    step.force_flush = torch.ones(case.batch, dtype=torch.int32)
    write_pos = cursors_for(cursor, rows)
    run_kernel(step, kernel_pool, write_pos, case.input_dtype, case)
    run_plain(step.cast(torch.float64), plain64, case)
    state_err = rel_err(kernel_pool.state[active], plain64[active])

    print(f"{name}: {worst} state {state_err:.2e} natural {natural} forced {forced}")
    assert natural >= 2, "the run must cross natural flushes"
    if case.ring_len > 1:
        assert forced >= 2, "the run must include forced flushes"
    assert worst["same"] <= tol_same
    assert worst["algebra"] <= 1e-10
    assert worst["truth"] <= tol_truth
    assert state_err <= tol_truth
    # Slots outside the batch are bit-identical after every step.
    for before, after in zip(idle_before, kernel_pool.tensors(), strict=True):
        assert torch.equal(before, after[idle])
