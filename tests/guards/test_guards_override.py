"""Process-wide overrides: guard_policy() (per thread/task) and REPLAYLINT_GUARD (read once)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import (  # noqa: E402
    GateCacheDtypeError,
    _policy,
    fp32_gate_cache,
    guard_policy,
)

REPO = Path(__file__).resolve().parents[2]
BF16 = torch.bfloat16


def write_row(g_cache: Any) -> Any:
    g_cache[0] = 1.0
    return g_cache.dtype


@pytest.fixture(autouse=True)
def quiet_guard_warnings() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_guard_policy_overrides_the_decorator_inside_the_block_only() -> None:
    step = fp32_gate_cache(write_row)
    g = torch.zeros(2, dtype=BF16)
    with guard_policy("cast") as chosen:
        assert chosen == "cast"
        assert step(g) is torch.float32
    assert g.tolist() == [1.0, 0.0]
    with pytest.raises(GateCacheDtypeError):
        step(g)


def test_blocks_nest_and_restore_also_after_an_exception() -> None:
    step = fp32_gate_cache(policy="cast")(write_row)
    g = torch.zeros(2, dtype=BF16)
    with guard_policy("warn"):
        with guard_policy("reject"), pytest.raises(GateCacheDtypeError):
            step(g)
        assert step(g) is BF16  # warn: passed through unchanged
        with pytest.raises(KeyError), guard_policy("off"):
            raise KeyError("leave the block by an exception")
        assert step(g) is BF16
    assert step(g) is torch.float32  # the decorator's own policy again
    assert _policy._open_overrides == 0


def test_bad_policy_names_fail_when_guard_policy_is_called() -> None:
    with pytest.raises(ValueError, match=r"guard_policy\(policy\) must be one of .* got 'lenient'"):
        guard_policy("lenient")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got NoneType None"):
        guard_policy(None)  # type: ignore[arg-type]


def test_the_override_does_not_leak_into_other_threads() -> None:
    step = fp32_gate_cache(write_row)
    in_block, checked = threading.Event(), threading.Event()
    outcome: list[str] = []

    def other_thread() -> None:
        in_block.wait(timeout=10)
        try:
            step(torch.zeros(2, dtype=BF16))
            outcome.append("cast")
        except GateCacheDtypeError:
            outcome.append("rejected")
        checked.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with guard_policy("cast"):
        in_block.set()
        assert checked.wait(timeout=10)
        assert step(torch.zeros(2, dtype=BF16)) is torch.float32  # still cast in this thread
    worker.join()
    assert outcome == ["rejected"]


def test_a_block_in_another_thread_does_not_change_this_one() -> None:
    step = fp32_gate_cache(write_row)
    entered, release = threading.Event(), threading.Event()

    def other_thread() -> None:
        with guard_policy("off"):
            entered.set()
            release.wait(timeout=10)

    worker = threading.Thread(target=other_thread)
    worker.start()
    try:
        assert entered.wait(timeout=10)
        with pytest.raises(GateCacheDtypeError):
            step(torch.zeros(2, dtype=BF16))
    finally:
        release.set()
        worker.join()


def test_asyncio_tasks_each_keep_their_own_override() -> None:
    step = fp32_gate_cache(write_row)

    async def task(policy: Any) -> str:
        with guard_policy(policy):
            await asyncio.sleep(0)  # let the other task enter its block
            try:
                return str(step(torch.zeros(1, dtype=BF16)))
            except GateCacheDtypeError:
                return "rejected"

    async def both() -> list[str]:
        return list(await asyncio.gather(task("cast"), task("reject"), task("warn")))

    assert asyncio.run(both()) == ["torch.float32", "rejected", "torch.bfloat16"]


def test_environment_values_are_parsed_strictly(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, expected in [("cast", "cast"), ("  WARN\n", "warn"), ("", None), ("   ", None)]:
        monkeypatch.setenv("REPLAYLINT_GUARD", raw)
        assert _policy._policy_from_environment() == expected
    monkeypatch.delenv("REPLAYLINT_GUARD")
    assert _policy._policy_from_environment() is None
    monkeypatch.setenv("REPLAYLINT_GUARD", "casting")
    with pytest.raises(ValueError, match=r"REPLAYLINT_GUARD must be one of .*; got 'casting'"):
        _policy._policy_from_environment()


def run_python(code: str, guard: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, REPLAYLINT_GUARD=guard, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_environment_override_end_to_end() -> None:
    code = """
        import os, warnings
        import torch
        from replaylint.guards import fp32_gate_cache, guard_policy, GateCacheDtypeWarning

        @fp32_gate_cache(policy="reject")
        def step(g_cache):
            g_cache[0] = 1.0

        g = torch.zeros(2, dtype=torch.bfloat16)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step(g)
        assert g.tolist() == [1.0, 0.0], g
        assert [w.category for w in caught] == [GateCacheDtypeWarning], caught
        os.environ["REPLAYLINT_GUARD"] = "reject"  # read once: changing it later does nothing
        step(torch.zeros(2, dtype=torch.bfloat16))
        with guard_policy("reject"):  # a block beats the environment
            try:
                step(torch.zeros(2, dtype=torch.bfloat16))
            except TypeError:
                print("block rejected")
        print("ok")
    """
    result = run_python(code, guard="cast")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["block", "rejected", "ok"]


def test_invalid_environment_value_fails_at_import_with_the_fix() -> None:
    result = run_python("import replaylint.guards", guard="strict")
    assert result.returncode != 0
    assert (
        "ValueError: The environment variable REPLAYLINT_GUARD must be one of 'reject', 'cast', "
        "'warn' or 'off'; got 'strict'." in result.stderr
    )
