"""Expression forms that hide an allocation or a cast: arithmetic and promotion, elementwise
functions, joins, calls of the module's own helpers, lambdas and partials, and the binding forms
that make a gate cache (append, ``+=``, ``setdefault``, properties, ``.data``)."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.engine import Linter
from replaylint.lint.model import Applicability


def _findings(source: str) -> list[tuple[int, str]]:
    text = textwrap.dedent(source).lstrip("\n")
    return sorted((f.location.row, f.code) for f in Linter().check(text, "m.py"))


def _fixed(source: str) -> str:
    text = textwrap.dedent(source).lstrip("\n")
    return Linter().fix(text, "m.py", unsafe=True).source


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # two bf16 operands: bf16; each allocation is reported
        (
            """
            import torch
            g_cache = torch.ones(4, dtype=torch.bfloat16) * torch.rand(4, dtype=torch.bfloat16)
            """,
            [(2, "RL001"), (2, "RL001")],
        ),
        # a float32 operand promotes a bf16 one
        (
            """
            import torch
            g_cache = torch.ones(4, dtype=torch.float32) * torch.rand(4, dtype=torch.bfloat16)
            """,
            [],
        ),
        # float64 wins over float32
        (
            """
            import torch
            g_cache = torch.ones(4, dtype=torch.float32) + torch.rand(4, dtype=torch.float64)
            """,
            [(2, "RL001")],
        ),
        # an operand of unknown dtype may promote the result: not reported
        (
            """
            import torch
            def f(scale):
                g_cache = torch.zeros(4, dtype=torch.bfloat16) * scale
            """,
            [],
        ),
        # a module constant that is a number does not promote
        (
            """
            import torch
            DECAY = -0.5
            g_cache = DECAY * torch.ones(4, dtype=torch.half)
            """,
            [(3, "RL001")],
        ),
        # a comparison is a mask, not a ring
        (
            """
            import torch
            g_cache = torch.zeros(4, dtype=torch.bfloat16) > 0
            """,
            [],
        ),
        # a function's own dtype= decides, as a cast does
        (
            """
            import torch
            def f(raw):
                g_cache = torch.cumsum(raw.half(), -1, dtype=torch.float32)
                replayssm_g = torch.cumsum(raw, -1, dtype=torch.bfloat16)
            """,
            [(4, "RL004")],
        ),
        # a list of parts made for the join is read; one used elsewhere too is not
        (
            """
            import torch
            def f():
                parts = [torch.zeros(4, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.bfloat16)]
                g_cache = torch.cat(parts)
                shared = [torch.zeros(4, dtype=torch.bfloat16)]
                replayssm_g = torch.cat(shared)
                return shared
            """,
            [(3, "RL001"), (3, "RL001")],
        ),
        # an argument named like the parameter it is passed to
        (
            """
            import torch
            def _ring(shape):
                return torch.zeros(shape, dtype=torch.bfloat16)
            def build(shape):
                g_cache = _ring(shape)
            """,
            [(3, "RL001")],
        ),
        # a helper's dtype parameter is RL006's question alone
        (
            """
            import torch
            def _ring(shape, dtype):
                return torch.zeros(shape, dtype=dtype)
            def build(shape):
                g_cache = _ring(shape, torch.bfloat16)
            """,
            [(5, "RL006")],
        ),
        # a helper following its tensor argument: a gate cache is float32, a delta ring is not
        # (the helper serves two calls, so the finding is at the call)
        (
            """
            import torch
            def _like(t):
                return torch.zeros_like(t)
            def build(pool):
                g_cache = _like(pool.g_cache)
                replayssm_g = _like(pool.d_cache)
            """,
            [(6, "RL003")],
        ),
        # `.to(**kw)` with a mapping that cannot be read, `+=` on a tensor: nothing to say
        (
            """
            import torch
            def f(g_cache, kw, delta):
                g_cache = g_cache.to(**kw)
                g_cache += delta.half()
            """,
            [],
        ),
        # a lambda sees the default it was given; a call that passes float32 is fine
        (
            """
            import torch
            ring = lambda n, dtype=torch.bfloat16: torch.zeros(n, dtype=dtype)
            g_cache = ring(4, dtype=torch.float32)
            replayssm_g = ring(4)
            """,
            [(4, "RL001")],
        ),
        # `yield from` another iterable is not followed
        (
            """
            import torch
            def _rings(other):
                yield torch.zeros(4, dtype=torch.float32)
                yield from other
            g_caches = list(_rings([]))
            """,
            [],
        ),
        # `.extend` and `.insert` add gate caches as `.append` does
        (
            """
            import torch
            def f(self):
                self.g_caches.extend([torch.zeros(4, dtype=torch.float16)])
                self.g_caches.insert(0, torch.zeros(4, dtype=torch.float16))
                self.d_caches.extend([torch.zeros(4, dtype=torch.float16)])
            """,
            [(3, "RL001"), (4, "RL001")],
        ),
        # an element of a list of rings is replaced; an element of a tensor is copied (cast)
        (
            """
            import torch
            def f(self, i, x):
                self.g_caches[i] = x.half()
                self.g_cache[i] = x.half()
            """,
            [(3, "RL004")],
        ),
        # a parameter default, and an f-string buffer name outside a loop over names
        (
            """
            import torch
            class Pool(torch.nn.Module):
                def __init__(self, layer, g_cache=torch.zeros(4, dtype=torch.half)):
                    super().__init__()
                    self.register_buffer(f"layer{layer}_g_cache", torch.zeros(4, dtype=torch.half))
                    self.register_buffer(f"layer{layer}_d_cache", torch.zeros(4, dtype=torch.half))
                    for kind in ("d", "g"):
                        self.register_buffer(f"{kind}_ring", torch.zeros(4, dtype=torch.half))
            """,
            [(3, "RL001"), (5, "RL001")],
        ),
        # super().__setattr__ binds as object.__setattr__ does
        (
            """
            import torch
            class Pool:
                def __init__(self):
                    super().__setattr__("g_cache", torch.zeros(4, dtype=torch.float16))
            """,
            [(4, "RL001")],
        ),
    ],
)
def test_findings(source: str, expected: list[tuple[int, str]]) -> None:
    assert _findings(source) == expected


def test_a_helper_called_once_is_fixed_inside_and_a_shared_one_at_the_call() -> None:
    once = """
    import torch
    class Pool:
        def __init__(self):
            self.g_cache = self._ring()
        def _ring(self):
            return torch.zeros(4, dtype=torch.bfloat16)
    """
    assert "return torch.zeros(4, dtype=torch.float32)" in _fixed(once)
    shared = once.replace(
        "self.g_cache = self._ring()", "self.g_cache = self._ring()\n        self.d = self._ring()"
    )
    fixed = _fixed(shared)
    assert "self.g_cache = self._ring().to(torch.float32)" in fixed
    assert "dtype=torch.bfloat16" in fixed


def test_a_reinterpreting_view_has_no_fix_even_through_a_shared_local() -> None:
    source = textwrap.dedent(
        """
        import torch
        def f(wire):
            bits = wire.view(torch.bfloat16)
            g_cache = bits
            return bits
        """
    ).lstrip("\n")
    findings = Linter().check(source, "m.py")
    assert [(f.code, f.fix) for f in findings] == [("RL004", None)]
    assert "reinterprets" in findings[0].message


def test_a_shared_partial_is_overridden_at_the_gate_cache_call_safely() -> None:
    source = textwrap.dedent(
        """
        import functools
        import torch
        alloc = functools.partial(torch.zeros, dtype=torch.bfloat16)
        d_cache = alloc(4)
        g_cache = alloc(4)
        """
    ).lstrip("\n")
    findings = Linter().check(source, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(5, "RL001")]
    assert findings[0].fix is not None
    assert findings[0].fix.applicability is Applicability.SAFE
    assert "g_cache = alloc(4, dtype=torch.float32)" in _fixed(source)


_UNPACKED_LISTS = """
import numpy as np
import torch


class StatePool:
    def __init__(self, layers):
        self._d_cache, self._gate_cache = self._init_caches(layers)
        self.g_cache = torch.zeros(layers, 4, dtype=torch.float32)

    def _init_caches(self, layers):
        d_cache, gate_cache = [], []
        for _ in range(layers):
            d_cache.append(torch.zeros(4, dtype=torch.bfloat16))
            gate_cache.append(torch.zeros(4, dtype=torch.float32))
        return d_cache, gate_cache

    def load(self, path):
        with np.load(path) as ckpt:
            for i in range(len(self._gate_cache)):
                self._gate_cache[i] = torch.from_numpy(ckpt[f"gate.{i}"])
                self.g_cache[i] = torch.from_numpy(ckpt[f"gate.{i}"])
"""


def test_an_element_of_a_list_a_method_builds_and_returns_is_replaced_not_copied_into() -> None:
    # `_gate_cache` is the list `_init_caches` returns: its element is replaced by the load;
    # `g_cache` is one tensor, and the item assignment copies into it (and casts)
    assert _findings(_UNPACKED_LISTS) == [(20, "RL005")]


def test_a_loop_over_a_class_constant_of_ring_names_shares_one_dtype() -> None:
    source = """
    import torch


    class Cache:
        ring_names = ("d_cache", "k_cache", "g_cache")
        fp32_names = ("d_cache", "k_cache")

        def resize(self, n):
            dtype = self.d_cache.dtype
            return {name: torch.zeros(n, dtype=dtype) for name in self.ring_names}

        def other(self, n):
            dtype = self.d_cache.dtype
            return {name: torch.zeros(n, dtype=dtype) for name in self.fp32_names}
    """
    # only the loop whose names include the gate cache gives it the shared dtype
    assert _findings(source) == [(10, "RL006")]


@pytest.mark.parametrize(
    ("cast", "expected"),
    [
        # a tensor passed for its dtype and device, named or made so
        ("self.g_cache.to(ref)", [(4, "RL004")]),
        ("self.g_cache.to(other)", [(4, "RL004")]),
        ("self.g_cache.to(next(model.parameters()))", [(4, "RL004")]),
        ("self.g_cache.to(next(iter(model.buffers())))", [(4, "RL004")]),
        # a device keeps the dtype
        ("self.g_cache.to(ref_device)", []),
        ("self.g_cache.to(device)", []),
    ],
)
def test_to_a_reference_tensor_takes_its_dtype(cast: str, expected: list[tuple[int, str]]) -> None:
    source = f"""
        import torch

        def move(self, ref, other, model, ref_device, device):
            self.g_cache = {cast}
        """
    assert _findings(source) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # a key built by an f-string numbered by a counter names a ring of each layer
        (
            "def start(rings, n):\n    inputs = {}\n    for layer in range(n):\n"
            "        inputs[f'state_g_cache_{layer}'] = rings['g'].half()\n    return inputs\n",
            [(6, "RL004")],
        ),
        # a tensor handed over through DLPack keeps its producer's dtype
        (
            "from torch.utils.dlpack import from_dlpack\n\n"
            "def adopt(capsule):\n    g_cache = from_dlpack(capsule)\n    return g_cache\n",
            [(6, "RL005")],
        ),
        (
            "def adopt(capsule):\n    g_cache = torch.from_dlpack(capsule).float()\n"
            "    return g_cache\n",
            [],
        ),
        # an array read from a file and cast on the numpy side to a dtype not known
        (
            "import numpy as np\n\ndef restore(path, np_type):\n    with np.load(path) as archive:\n"
            "        g_cache = torch.from_numpy(archive['g'].astype(np_type))\n    return g_cache\n",
            [(7, "RL005")],
        ),
        (
            "import numpy as np\n\ndef restore(path):\n    with np.load(path) as archive:\n"
            "        g_cache = torch.from_numpy(archive['g'].astype(np.float32))\n    return g_cache\n",
            [],
        ),
    ],
)
def test_handover_forms(body: str, expected: list[tuple[int, str]]) -> None:
    source = f"import torch\n\n{body}"
    assert [(f.location.row, f.code) for f in Linter().check(source, "m.py")] == expected


def test_a_ring_unpacked_from_a_comprehension_and_passed_on_has_the_comprehensions_dtype() -> None:
    source = (
        "import torch\n\n"
        "def warm(shapes, act):\n"
        "    d, k, g = (torch.zeros(s, dtype=act) for s in shapes)\n"
        "    return launch(d_cache=d, k_cache=k, g_cache=g)\n\n"
        "def warm_fp32_gate(shapes, act):\n"
        "    d, k, g = (torch.zeros(s, dtype=t) for s, t in zip(shapes, (act, act, torch.float32)))\n"
        "    return launch(d_cache=d, k_cache=k, g_cache=g)\n"
    )
    findings = Linter().check(source, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(4, "RL002")]
    # the one expression makes all three rings: changing its dtype is no fix of the gate's
    assert findings[0].fix is None


def test_a_loop_over_the_items_of_a_dict_comprehension_over_ring_names() -> None:
    source = (
        "import torch\n\n"
        "class Pool:\n"
        "    def swap_space(self, n):\n"
        "        shapes = {name: getattr(self, name).shape for name in ('d_cache', 'g_cache')}\n"
        "        return {name: torch.zeros(n, *s[1:], dtype=self.d_cache.dtype)"
        " for name, s in shapes.items()}\n"
    )
    findings = Linter().check(source, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(6, "RL006")]
    fixed = Linter().fix(source, "m.py").source
    assert 'dtype=torch.float32 if name == "g_cache" else self.d_cache.dtype' in fixed


def test_a_comprehension_over_names_zipped_with_tensors_casts_each_by_name() -> None:
    # `zip(RING_NAMES, tensors)`: the names are known, the tensors are the sequence's elements
    source = """
        import torch

        RING_NAMES = ("d", "k", "g")

        def step(cache_tensors, dtype):
            kwargs = {f"{n}_cache": t.to(dtype) for n, t in zip(RING_NAMES, cache_tensors)}
            return kwargs
        """
    assert _findings(source) == [(6, "RL006")]
    assert 't.to(torch.float32 if n == "g" else dtype)' in _fixed(source)
    kept = source.replace("t.to(dtype)", 't.float() if n == "g" else t.to(dtype)')
    assert _findings(kept) == []


def test_a_cast_of_the_gate_cache_a_function_returns_is_reported_and_fixed() -> None:
    source = """
        import torch

        def convert(cache):
            state, d_cache, k_cache, g_cache = cache
            return state, d_cache.half(), k_cache.half(), g_cache.half()

        def moved(g_cache, device):
            return g_cache.to(device), g_cache.float()

        def to_wire(g_cache):
            return g_cache.to(torch.bfloat16)
        """
    assert _findings(source) == [(5, "RL004"), (11, "RL004")]
    fixed = _fixed(source)
    # the local still names the tuple's tensor: the fixed cast stays a copy of it
    assert "d_cache.half(), k_cache.half(), g_cache.to(torch.float32, copy=True)" in fixed
    assert "return g_cache.to(torch.float32, copy=True)" in fixed


@pytest.mark.parametrize(
    ("cast", "fixed"),
    [
        ("live.g_cache.half()", "live.g_cache.to(torch.float32, copy=True)"),
        ("live.g_cache.to(torch.float16)", "live.g_cache.to(torch.float32, copy=True)"),
        (
            "live.g_cache.to(torch.float16, copy=False)",
            "live.g_cache.to(torch.float32, copy=False)",
        ),
        ("torch.zeros(4).half()", "torch.zeros(4).float()"),  # a fresh tensor: nobody else holds it
    ],
)
def test_a_fixed_cast_of_a_held_tensor_stays_a_copy(cast: str, fixed: str) -> None:
    source = f"import torch\n\ndef park(live, parked):\n    parked.g_cache = {cast}\n"
    assert f"parked.g_cache = {fixed}\n" in _fixed(source)


def test_the_fixed_cast_leaves_the_original_unaliased() -> None:
    torch = pytest.importorskip("torch")
    source = "import torch\n\ndef park(g_cache):\n    return g_cache.half()\n"
    namespace: dict[str, object] = {}
    exec(compile(_fixed(source), "<fixed>", "exec"), namespace)
    live = torch.zeros(3)
    parked = namespace["park"](live)  # type: ignore[operator]
    parked.add_(1.0)
    assert parked.dtype == torch.float32
    assert float(live.sum()) == 0.0


@pytest.mark.parametrize("dtype", ["plan.atype", "torch.bfloat16"])
def test_the_place_after_a_device_is_the_dtype_of_a_cast(dtype: str) -> None:
    source = f"import torch\n\ndef park(plan, pool):\n    pool.g_cache = pool.g_cache.to(plan.device, {dtype})\n"
    assert [f.code for f in Linter().check(source, "m.py")] == ["RL004"]


@pytest.mark.parametrize(
    ("read", "row"),
    [('rings["gate"]', 6), ('rings.pop("gate")', 6), ('rings.get("d")', 5), ('rings["f"]', None)],
)
def test_an_entry_of_a_dict_literal_read_into_the_gate_cache_is_its_value(
    read: str, row: int | None
) -> None:
    source = (
        "import torch\n\n"
        "def make(shape):\n"
        "    rings = {\n"
        '        "d": torch.zeros(shape, dtype=torch.bfloat16),\n'
        '        "gate": torch.zeros(shape, dtype=torch.bfloat16),\n'
        '        "f": torch.zeros(shape, dtype=torch.float32),\n'
        "    }\n"
        f"    g_cache = {read}\n"
        "    return g_cache\n"
    )
    found = [(f.code, f.location.row) for f in Linter().check(source, "m.py")]
    assert found == ([] if row is None else [("RL001", row)])
    if row == 6:
        assert '"gate": torch.zeros(shape, dtype=torch.float32),' in _fixed(source)


def test_a_dict_written_after_it_is_built_is_not_read_by_its_literal() -> None:
    source = (
        "import torch\n\n"
        "def make(shape, other):\n"
        '    rings = {"gate": torch.zeros(shape, dtype=torch.bfloat16)}\n'
        '    rings["gate"] = other\n'
        '    g_cache = rings["gate"]\n'
        "    return g_cache\n"
    )
    assert Linter().check(source, "m.py") == []


def test_a_cast_to_a_variable_dtype_is_fixed_without_a_copy() -> None:
    # the dtype may be float32 at run time, where the cast handed the ring back as it is
    source = "import torch\n\ndef bind(pool, kwargs):\n    kwargs['g_cache'] = pool.g_cache.to(pool.dtype)\n"
    assert "kwargs['g_cache'] = pool.g_cache.to(torch.float32)\n" in _fixed(source)


def test_a_comprehension_over_spread_items_is_judged_for_the_literal_entries_after_them() -> None:
    source = textwrap.dedent(
        """
        import torch

        class Pool:
            def resize(self, slots):
                grown = {
                    name: torch.zeros(slots, *t.shape[1:], dtype=self.dtype)
                    for name, t in (*self.rings.items(), ("gate", self.g_cache))
                }
                self.g_cache = grown.pop("gate")
                self.rings.update(grown)
        """
    )
    findings = Linter().check(source, "m.py")
    assert [f.code for f in findings] == ["RL006"]
    assert 'dtype=torch.float32 if name == "gate" else self.dtype' in _fixed(source)
    # spread after the literal entry: its items may overwrite "gate", so nothing is judged
    later = source.replace(
        '(*self.rings.items(), ("gate", self.g_cache))',
        '(("gate", self.g_cache), *self.rings.items())',
    )
    assert Linter().check(later, "m.py") == []


def test_a_fixed_cast_in_a_module_without_torch_still_copies() -> None:
    source = "def park(live, parked):\n    parked.g_cache = live.g_cache.half()\n"
    assert "parked.g_cache = live.g_cache.float().clone()\n" in _fixed(source)
