"""Safe fixes keep working programs working: each case runs before and after ``--fix`` on CPU torch.

For every case the program is linted, fixed with safe fixes only, and both versions are executed:

* every tensor that is not a gate cache keeps its dtype, and tensors that shared storage before
  still share it (a cast that copies would break a pool's views);
* the gate cache is float32 after the fix wherever a safe fix was offered, and unchanged where
  the fix was withheld;
* a second ``--fix`` changes nothing, and when the first run reported only fixable findings the
  fixed file has none left (the pre-commit hook can pass);
* modules that imported without torch still do.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from replaylint.lint import Linter  # noqa: E402
from replaylint.lint.gatecache.names import GateCacheNames  # noqa: E402
from replaylint.lint.model import Applicability  # noqa: E402

GATES = GateCacheNames()


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    fixed: bool
    """Whether a safe fix must make the gate caches float32 (False: reported, not fixed)."""
    reported: bool = True


CASES = [
    Case(
        "shadowed-alias",
        """
        import torch as t
        from torch import zeros

        MODEL_DTYPE = t.bfloat16

        def build(steps=2, model_dtype=MODEL_DTYPE):
            for t in range(steps):
                pass
            g_cache = zeros(4, dtype=model_dtype)
            return {"g_cache": g_cache, "d_cache": zeros(4, dtype=model_dtype)}
        """,
        fixed=True,
    ),
    Case(
        "kwargs-dtype-set-later",
        """
        import torch

        def build(device="cpu", dtype=torch.bfloat16):
            factory_kwargs = {"device": device}
            factory_kwargs["dtype"] = dtype
            d_cache = torch.empty(4, **factory_kwargs)
            g_cache = torch.empty(4, **factory_kwargs)
            return {"d_cache": d_cache, "g_cache": g_cache}
        """,
        fixed=True,
    ),
    Case(
        "kwargs-update",
        """
        import torch

        def build(device="cpu", dtype=torch.bfloat16):
            kw = {"device": device}
            kw.update(dtype=dtype)
            return {"g_cache": torch.zeros(4, **kw), "d_cache": torch.zeros(4, **kw)}
        """,
        fixed=True,
    ),
    Case(
        "kwargs-converge",
        """
        import torch

        def build(device="cpu", dtype=torch.bfloat16):
            factory_kwargs = {"device": device, "dtype": dtype}
            return {
                "d_cache": torch.empty(4, **factory_kwargs),
                "g_cache": torch.empty(4, **factory_kwargs),
            }
        """,
        fixed=True,
    ),
    Case(
        "torch-load-list",
        """
        import torch

        def build(path):
            torch.save([torch.zeros(2, dtype=torch.bfloat16) for _ in range(3)], path)
            g_caches = torch.load(path)
            return {"g_caches": g_caches[0], "count": torch.tensor(len(g_caches))}
        """,
        fixed=False,
    ),
    Case(
        "safetensors-dict",
        """
        from safetensors.torch import load_file

        def build(path):
            g_cache = load_file(path)
            return {"g_cache": g_cache["layer0"]}
        """,
        fixed=False,
    ),
    Case(
        "integer-and-bool-gate-names",
        """
        import torch

        def build(n=4, k=2):
            gate_cache = torch.zeros(n, k, dtype=torch.long)
            expert_gate_cache = torch.zeros(n, dtype=torch.bool)
            router_gate_cache = gate_cache.long()
            picked = torch.arange(n)[expert_gate_cache]
            return {"gate_cache": gate_cache, "expert_gate_cache": expert_gate_cache,
                    "router_gate_cache": router_gate_cache, "picked": picked}
        """,
        fixed=False,
        reported=False,
    ),
    Case(
        "chained-assignment",
        """
        import torch

        def build():
            d_cache = g_cache = torch.zeros(4, dtype=torch.bfloat16)
            return {"d_cache": d_cache, "g_cache": g_cache}
        """,
        fixed=False,
    ),
    Case(
        "walrus-shared",
        """
        import torch

        def build():
            d_cache = (g_cache := torch.zeros(4, dtype=torch.bfloat16))
            return {"d_cache": d_cache, "g_cache": g_cache}
        """,
        fixed=False,
    ),
    Case(
        "views-of-one-buffer",
        """
        import torch

        class Pool:
            def __init__(self, dtype=torch.bfloat16):
                buf = torch.empty(2, 4, dtype=dtype)
                self.d_cache = buf[0]
                self.g_cache = buf[1]

        def build():
            pool = Pool()
            return {"d_cache": pool.d_cache, "g_cache": pool.g_cache}
        """,
        fixed=False,
    ),
    Case(
        "optional-import",
        """
        try:
            import torch
        except ImportError:
            torch = None

        def build(dtype=None):
            dtype = dtype or torch.bfloat16
            return {"g_cache": torch.zeros(4, dtype=dtype)}
        """,
        fixed=True,
    ),
    Case(
        "importorskip",
        """
        import pytest

        torch = pytest.importorskip("torch")

        def build(dtype=None):
            dtype = dtype or torch.bfloat16
            return {"g_cache": torch.zeros(4, dtype=dtype)}
        """,
        fixed=True,
    ),
    Case(
        "type-checking-import",
        """
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            import torch

        def build(dtype=None):
            from torch import bfloat16, zeros

            return {"g_cache": zeros(4, dtype=dtype or bfloat16)}
        """,
        fixed=False,
    ),
    Case(
        "helper-called-twice",
        """
        import torch

        class Pool:
            def __init__(self):
                self.d_cache = self._ring()
                self.g_cache = self._ring()

            def _ring(self):
                return -torch.rand(4, dtype=torch.bfloat16) * 0.1

        def build():
            pool = Pool()
            return {"d_cache": pool.d_cache, "g_cache": pool.g_cache}
        """,
        fixed=True,
    ),
    Case(
        "helper-keeps-its-result",
        """
        import torch

        def build():
            kept = []

            def _ring():
                ring = torch.zeros(4, dtype=torch.bfloat16)
                kept.append(ring)
                return ring

            g_cache = _ring()
            return {"g_cache": g_cache, "kept": kept[0]}
        """,
        fixed=False,
    ),
    Case(
        "shared-partial",
        """
        import functools
        import torch

        alloc = functools.partial(torch.zeros, dtype=torch.bfloat16)

        def build():
            return {"d_cache": alloc(4), "g_cache": alloc(4), "k_cache": alloc(2)}
        """,
        fixed=True,
    ),
    Case(
        "public-lambda",
        """
        import torch

        ring = lambda n, dtype=torch.float16: torch.zeros(n, dtype=dtype)

        def build():
            return {"d_cache": ring(4), "g_cache": ring(4)}
        """,
        fixed=True,
    ),
    Case(
        "public-generator",
        """
        import torch

        def rings(n):
            for _ in range(2):
                yield torch.ones(n, dtype=torch.bfloat16)

        def build():
            d_caches = list(rings(3))
            return {"g_caches": list(rings(3))[0], "d_caches": d_caches[1]}
        """,
        fixed=False,
    ),
    Case(
        "promoted-join",
        """
        import torch

        def build():
            padding = torch.zeros(2, dtype=torch.bfloat16)
            g_cache = torch.cat([torch.zeros(4, dtype=torch.float32), padding])
            return {"g_cache": g_cache, "padding": padding}
        """,
        fixed=False,
        reported=False,
    ),
    Case(
        "reinterpreted-view",
        """
        import torch

        def build():
            wire = torch.zeros(4, dtype=torch.float32)
            g_cache = wire.view(torch.bfloat16)
            return {"g_cache": g_cache, "wire": wire}
        """,
        fixed=False,
    ),
]


def _module(text: str, tag: str) -> types.ModuleType:
    module = types.ModuleType(f"replaylint_fix_safety_{tag}")
    sys.modules[module.__name__] = module
    try:
        exec(compile(text, f"<{tag}>", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def _run(text: str, tag: str, tmp_path: Path) -> dict[str, Any]:
    build = _module(text, tag).build
    takes_path = "path" in inspect.signature(build).parameters
    return dict(build(str(tmp_path / f"{tag}.bin")) if takes_path else build())


@pytest.fixture(autouse=True)
def _fake_safetensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """safetensors' load_file always returns a dict of tensors; stand in for it."""
    package = types.ModuleType("safetensors")
    module = types.ModuleType("safetensors.torch")
    module.load_file = lambda path: {"layer0": torch.zeros(2, dtype=torch.bfloat16)}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "safetensors", package)
    monkeypatch.setitem(sys.modules, "safetensors.torch", module)


def _storages(tensors: dict[str, Any]) -> dict[tuple[str, str], bool]:
    names = sorted(tensors)
    return {
        (a, b): tensors[a].untyped_storage().data_ptr() == tensors[b].untyped_storage().data_ptr()
        for a in names
        for b in names
        if a < b
    }


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_safe_fix_keeps_the_program_working(case: Case, tmp_path: Path) -> None:
    source = textwrap.dedent(case.source).lstrip("\n")
    linter = Linter()
    findings = linter.check(source, "case.py")
    assert bool(findings) == case.reported, findings
    result = linter.fix(source, "case.py")
    assert result.dropped == ()

    before = _run(source, f"{case.name}_before", tmp_path)
    after = _run(result.source, f"{case.name}_after", tmp_path)
    assert set(before) == set(after)
    gates = {name for name in before if GATES.matches(name)}
    others = set(before) - gates
    assert {n: after[n].dtype for n in others} == {n: before[n].dtype for n in others}
    assert _storages(after) == _storages(before), "the fix changed which tensors share storage"
    if case.fixed:
        assert any(before[name].dtype != torch.float32 for name in gates), before
        assert all(after[name].dtype == torch.float32 for name in gates), after
    else:
        assert {n: after[n].dtype for n in gates} == {n: before[n].dtype for n in gates}

    # The fixer converges: a second run changes nothing, and leaves nothing fixable behind.
    again = linter.fix(result.source, "case.py")
    assert again.source == result.source
    safe = [f for f in findings if f.fix is not None and f.fix.applicability is Applicability.SAFE]
    if findings and len(safe) == len(findings):
        assert again.remaining == ()


@pytest.mark.parametrize("case", [c for c in CASES if "import" in c.name], ids=lambda c: c.name)
def test_modules_that_imported_without_torch_still_do(case: Case) -> None:
    source = textwrap.dedent(case.source).lstrip("\n")
    fixed = Linter().fix(source, "case.py").source
    blocked = {"torch": None}
    if "importorskip" in source:
        return  # importorskip skips the importing test module without torch, fixed or not
    original = sys.modules.copy()
    try:
        sys.modules.update(blocked)  # `import torch` now raises ImportError
        _module(source, f"{case.name}_no_torch_before")
        _module(fixed, f"{case.name}_no_torch_after")
    finally:
        sys.modules.clear()
        sys.modules.update(original)


def test_withheld_fixes_say_what_to_change() -> None:
    texts = {case.name: textwrap.dedent(case.source).lstrip("\n") for case in CASES}
    linter = Linter()
    messages = {
        name: " ".join(f.message for f in linter.check(texts[name], "case.py"))
        for name in (
            "chained-assignment",
            "walrus-shared",
            "views-of-one-buffer",
            "safetensors-dict",
        )
    }
    assert "bound to `d_cache`" in messages["chained-assignment"]
    assert "bound to `d_cache`" in messages["walrus-shared"]
    assert "a view of `buf`" in messages["views-of-one-buffer"]
    assert "cast each one" in messages["safetensors-dict"]


def test_the_type_checking_case_offers_only_an_unsafe_fix() -> None:
    source = textwrap.dedent(next(c for c in CASES if c.name == "type-checking-import").source)
    findings = Linter().check(source.lstrip("\n"), "case.py")
    assert [f.fix.applicability for f in findings if f.fix] == [Applicability.UNSAFE]


# ------------------------------------------------------------- generated, executable builders
_DTYPES = ["torch.bfloat16", "torch.float16", "torch.float32", "torch.float64", "dtype"]


@st.composite
def _allocation(draw: st.DrawFn, dtype: str) -> str:
    form = draw(st.sampled_from(["dtype", "kwargs", "local", "like", "new", "cast", "plain"]))
    if form == "dtype":
        return f"torch.zeros(2, 3, dtype={dtype})"
    if form == "kwargs":
        return f"torch.zeros(2, 3, **{{'device': 'cpu', 'dtype': {dtype}}})"
    if form == "local":
        return f"(lambda ring_dtype: torch.ones(2, 3, dtype=ring_dtype))({dtype})"
    if form == "like":
        return f"torch.zeros_like(torch.empty(2, 3, dtype={dtype}))"
    if form == "new":
        return f"torch.empty(1, dtype={dtype}).new_zeros(2, 3)"
    if form == "cast":
        return f"torch.zeros(2, 3).to({dtype})"
    return "torch.zeros(2, 3)"


@st.composite
def executable_builders(draw: st.DrawFn) -> str:
    """A module with ``build(dtype)`` that allocates caches in assorted ways and returns them."""
    lines = ["import torch", "", "def build(dtype=torch.bfloat16):"]
    names = draw(
        st.lists(
            st.sampled_from(["d_cache", "k_cache", "g_cache", "conv_state", "gate_cache"]),
            min_size=2,
            max_size=5,
            unique=True,
        )
    )
    for name in names:
        dtype = draw(st.sampled_from(_DTYPES))
        shape = draw(st.sampled_from(["single", "shared-local", "view", "kwargs-later"]))
        allocation = draw(_allocation(dtype))
        if shape == "shared-local":
            lines += [f"    buf_{name} = {allocation}", f"    {name} = buf_{name}"]
            lines += [f"    keep_{name} = buf_{name}"]
        elif shape == "view":
            lines += [f"    pair_{name} = torch.zeros(2, 2, 3, dtype={dtype})"]
            lines += [f"    {name} = pair_{name}[1]", f"    other_{name} = pair_{name}[0]"]
        elif shape == "kwargs-later":
            lines += [f"    kw_{name} = {{'device': 'cpu'}}", f"    kw_{name}['dtype'] = {dtype}"]
            lines += [f"    {name} = torch.empty(2, 3, **kw_{name})"]
        else:
            lines += [f"    {name} = {allocation}"]
    lines.append(
        "    return {name: value for name, value in locals().items() if torch.is_tensor(value)}"
    )
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(executable_builders())
def test_safe_fixes_of_generated_builders_change_only_gate_dtypes(source: str) -> None:
    fixed = Linter().fix(source, "builder.py").source
    before = _module(source, "generated_before").build()
    after = _module(fixed, "generated_after").build()
    assert set(before) == set(after)
    gates = {name for name in before if GATES.matches(name)}
    for name in set(before) - gates:
        assert after[name].dtype == before[name].dtype, (name, fixed)
    assert _storages(after) == _storages(before), fixed
    for name in gates:
        assert after[name].dtype in {before[name].dtype, torch.float32}, (name, fixed)
