"""The intra-function dataflow behind RL001-RL007: which bindings reach a use, how a dtype or a
tensor is resolved through them, and how fixes behave when a finding is reached through a local.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaylint.lint.config.settings import Settings
from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.model import Applicability


def _check(source: str, *codes: str) -> list[tuple[int, str]]:
    linter = Linter(Settings(select=codes or ("RL",)))
    return [
        (f.location.row, f.code) for f in linter.check(textwrap.dedent(source).lstrip("\n"), "m.py")
    ]


def _fix(source: str) -> str:
    return Linter().fix(textwrap.dedent(source).lstrip("\n"), "m.py", unsafe=True).source


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # the last unconditional binding wins
        (
            """
            import torch
            def f(shape):
                dtype = torch.bfloat16
                dtype = torch.float32
                g_cache = torch.zeros(shape, dtype=dtype)
            """,
            [],
        ),
        # either branch may reach the use: one of them is bf16
        (
            """
            import torch
            def f(shape, exact):
                if exact:
                    dtype = torch.float32
                else:
                    dtype = torch.bfloat16
                g_cache = torch.zeros(shape, dtype=dtype)
            """,
            [(7, "RL001")],
        ),
        # a conditional rebinding does not hide the parameter
        (
            """
            import torch
            def f(shape, dtype=None):
                if dtype is None:
                    dtype = torch.float32
                g_cache = torch.zeros(shape, dtype=dtype)
            """,
            [(5, "RL002")],
        ),
        # a binding inside the branch that holds the use dominates it
        (
            """
            import torch
            def f(shape, dtype, replay):
                if replay:
                    dtype = torch.float32
                    g_cache = torch.zeros(shape, dtype=dtype)
            """,
            [],
        ),
        # module constants are visible in functions; class attributes are not
        (
            """
            import torch
            RING_DTYPE = torch.bfloat16
            def f(shape):
                return {"g_cache": torch.zeros(shape, dtype=RING_DTYPE)}
            """,
            [(4, "RL001")],
        ),
        (
            """
            import torch
            GATE_DTYPE = torch.float32
            class Pool:
                GATE_DTYPE = torch.bfloat16
                def make(self, shape):
                    self.g_cache = torch.zeros(shape, dtype=GATE_DTYPE)
            """,
            [],
        ),
        # a closure reads its enclosing function's local
        (
            """
            import torch
            def outer(shape):
                dtype = torch.half
                def inner():
                    return {"g_cache": torch.empty(shape, dtype=dtype)}
                return inner
            """,
            [(5, "RL001")],
        ),
        # dtype=None is torch's default dtype
        (
            """
            import torch
            g_cache = torch.zeros(4, dtype=None)
            """,
            [(2, "RL002")],
        ),
        # tuple unpacking of literals resolves element-wise
        (
            """
            import torch
            d_dtype, g_dtype = torch.bfloat16, torch.float32
            g_cache = torch.zeros(4, dtype=g_dtype)
            d_cache = torch.zeros(4, dtype=d_dtype)
            """,
            [],
        ),
        # `x.to(arg)` with an argument of unknown kind is not guessed at
        (
            """
            def f(g_cache, target):
                g_cache = g_cache.to(target)
            """,
            [],
        ),
        # a parameter annotated as a tensor is a tensor; as a device, a device
        (
            """
            import torch
            def f(self, ref: torch.Tensor, where: torch.device):
                self.g_cache = self.g_cache.to(where)
                self.replayssm_g = self.replayssm_g.to(ref)
            """,
            [(4, "RL004")],
        ),
        # one allocation reached from two gate-cache bindings is reported once
        (
            """
            import torch
            def f(self, shape):
                g_cache = torch.zeros(shape, dtype=torch.bfloat16)
                self.g_cache = g_cache
            """,
            [(3, "RL001")],
        ),
    ],
)
def test_reaching_bindings(source: str, expected: list[tuple[int, str]]) -> None:
    assert _check(source) == expected


def test_unresolved_kwargs_get_a_dtype_that_overrides_the_mapping() -> None:
    source = """
    import torch
    def f(shape, **factory_kwargs):
        g_cache = torch.zeros(shape, **factory_kwargs)
    """
    text = textwrap.dedent(source).lstrip("\n")
    findings = Linter().check(text, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(3, "RL002")]
    fix = findings[0].fix
    assert fix is not None
    assert [edit.content for edit in fix.edits] == ['{**factory_kwargs, "dtype": torch.float32}']
    fixed = Linter().fix(text, "m.py")
    assert fixed.remaining == ()
    assert Linter().check(fixed.source, "m.py") == []


def test_a_view_of_a_shared_local_is_reported_without_a_fix() -> None:
    source = """
    import torch
    def f(shape):
        ring = torch.zeros(2, *shape, dtype=torch.bfloat16)
        d_cache = ring[0]
        g_cache = ring[1]
        return d_cache, g_cache
    """
    findings = Linter().check(textwrap.dedent(source).lstrip("\n"), "m.py")
    assert [(f.code, f.fix) for f in findings] == [("RL001", None)]
    assert "a view of `ring`, which other tensors share" in findings[0].message
    # a cast would copy the gate cache out of the shared storage: nothing is changed
    assert _fix(source) == textwrap.dedent(source).lstrip("\n")


def test_a_local_used_elsewhere_is_cast_where_it_becomes_the_gate_cache_unsafely() -> None:
    source = """
    import torch
    def f(shape, pool):
        ring = torch.zeros(*shape, dtype=torch.bfloat16)
        pool.register(ring)
        g_cache = ring
        return g_cache
    """
    findings = Linter().check(textwrap.dedent(source).lstrip("\n"), "m.py")
    assert [f.code for f in findings] == ["RL001"]
    fix = findings[0].fix
    assert fix is not None
    assert fix.applicability is Applicability.UNSAFE
    text = textwrap.dedent(source).lstrip("\n")
    fixed = Linter().fix(text, "m.py", unsafe=True).source
    # the shared allocation keeps feeding its other use in bf16; only the gate cache is cast
    assert "ring = torch.zeros(*shape, dtype=torch.bfloat16)" in fixed
    assert "g_cache = ring.to(torch.float32)" in fixed


def test_a_local_used_once_is_fixed_where_it_is_made() -> None:
    source = """
    import torch
    def f(shape):
        ring = torch.zeros(shape, dtype=torch.bfloat16)
        return {"g_cache": ring}
    """
    fixed = _fix(source)
    assert "ring = torch.zeros(shape, dtype=torch.float32)" in fixed
    assert _check(fixed) == []


def test_two_findings_on_one_binding_do_not_stack_casts() -> None:
    source = """
    import torch
    def f(snapshot=None):
        if snapshot is None:
            snapshot = torch.randn(4).to(torch.bfloat16)
        return {"g_cache": snapshot.clone()}
    """
    assert _check(source) == [(4, "RL004"), (5, "RL003")]
    fixed = _fix(source)
    assert fixed.count(".to(torch.float32)") == 1
    assert 'return {"g_cache": snapshot.clone().to(torch.float32)}' in fixed
    assert _check(fixed) == []


# A small grammar of dtype expressions for the RL001/RL002 boundary ------------------------------
_LITERALS = {
    "torch.float32": True,
    "torch.float": True,
    "torch.bfloat16": False,
    "torch.half": False,
}
_UNKNOWN = ("self.dtype", "config.torch_dtype", "dtype", "ref.dtype")


@st.composite
def _dtype_expression(draw: st.DrawFn, depth: int = 0) -> tuple[str, set[str]]:
    """(expression, kinds of its leaves: "fp32", "other" or "unknown")."""
    choice = draw(st.integers(0, 2 if depth < 2 else 1))
    if choice == 0:
        literal = draw(st.sampled_from(sorted(_LITERALS)))
        return literal, {"fp32" if _LITERALS[literal] else "other"}
    if choice == 1:
        return draw(st.sampled_from(_UNKNOWN)), {"unknown"}
    body, body_kinds = draw(_dtype_expression(depth + 1))
    orelse, orelse_kinds = draw(_dtype_expression(depth + 1))
    return f"({body} if flag else {orelse})", body_kinds | orelse_kinds


@given(_dtype_expression(), _dtype_expression(), st.booleans())
@settings(max_examples=50, deadline=None)
def test_each_allocation_gets_exactly_the_right_code(
    first: tuple[str, set[str]], second: tuple[str, set[str]], through_local: bool
) -> None:
    if through_local:  # the dtype comes from a local bound differently in two branches
        prelude = (
            f"    if flag:\n        ring_dtype = {first[0]}\n"
            f"    else:\n        ring_dtype = {second[0]}\n"
        )
        expression, kinds = "ring_dtype", first[1] | second[1]
    else:
        prelude, (expression, kinds) = "", first
    source = (
        "import torch\n"
        "def build(self, config, ref, dtype, flag, shape):\n"
        f"{prelude}"
        f"    self.g_cache = torch.zeros(shape, dtype={expression})\n"
    )
    codes = [code for _, code in _check(source, "RL001", "RL002")]
    if "other" in kinds:
        assert codes == ["RL001"], source
    elif "unknown" in kinds:
        assert codes == ["RL002"], source
    else:
        assert codes == [], source
    fixed = Linter().fix(source, "m.py", unsafe=True).source
    assert _check(fixed, "RL001", "RL002") == []


def test_a_condition_on_the_name_it_guards_terminates() -> None:
    # Found on sglang: evaluating `key == "g_cache"` looked `key` up, whose binding is guarded by
    # that same test. The analysis must give up, not recurse forever.
    source = """
    import torch
    def f(shape, dtype):
        caches = {}
        for kind in ("d", "g"):
            key = f"{kind}_cache"
            if key == "g_cache":
                key = key.strip()
            caches[key] = torch.zeros(shape, dtype=dtype)
        return caches
    """
    assert _check(source) == []


def test_a_class_constant_does_not_vouch_for_an_attribute_another_class_assigns() -> None:
    source = """
    import torch
    class Defaults:
        dtype = torch.float32
    class Pool:
        def __init__(self, shape, dtype):
            self.dtype = dtype
            self.g_cache = torch.zeros(shape, dtype=self.dtype)
    """
    assert _check(source) == [(7, "RL002")]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # one element of a tuple a helper returns: the bf16 d ring beside it is not the gate ring
        (
            """
            import torch
            def _rings(shape):
                return torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape)
            def step(shape, inputs):
                d, g = _rings(shape)
                return replayssm_decode(*inputs, d_cache=d, g_cache=g.float())
            """,
            [],
        ),
        (
            """
            import torch
            def _rings(shape):
                return torch.zeros(shape), torch.zeros(shape, dtype=torch.bfloat16)
            def step(shape, inputs):
                d, g = _rings(shape)
                return replayssm_decode(*inputs, d_cache=d, g_cache=g)
            """,
            [(3, "RL001"), (6, "RL007")],
        ),
        # `rings[1]` of a tuple literal is that element alone
        (
            """
            import torch
            def step(shape, inputs):
                rings = (torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape))
                return replayssm_decode(*inputs, g_cache=rings[1])
            """,
            [],
        ),
        # a dataclass field assigned anywhere in the module is not read from the construction
        (
            """
            from dataclasses import dataclass
            import torch
            @dataclass
            class Rings:
                d: torch.Tensor
                g: torch.Tensor
            def step(shape, inputs, other):
                rings = Rings(torch.zeros(shape), torch.zeros(shape, dtype=torch.bfloat16))
                rings.g = other
                return replayssm_decode(*inputs, g_cache=rings.g)
            """,
            [],
        ),
        # a later `g_cache` entry of the mapping wins over the literal's
        (
            """
            import torch
            def step(shape, inputs):
                ring_args = {"g_cache": torch.zeros(shape, dtype=torch.bfloat16)}
                ring_args["g_cache"] = torch.zeros(shape, dtype=torch.float32)
                return replayssm_decode(*inputs, **ring_args)
            """,
            [(3, "RL001")],
        ),
        # a dataclass whose fields do not all take a position: the arguments are not mapped
        (
            """
            from dataclasses import dataclass, field
            import torch
            @dataclass
            class Rings:
                d: torch.Tensor
                g_cache: torch.Tensor = field(init=False)
                k: torch.Tensor = None
            def make(shape):
                return Rings(torch.zeros(shape), torch.zeros(shape, dtype=torch.bfloat16))
            """,
            [],
        ),
        # a `*` of a comprehension over a literal passes that many values: the places after it
        # are known (`g16` is the tenth argument), though the elements themselves are not
        (
            """
            import torch
            def step(shape, make, d, k, state, out, rows, pos):
                sizes = [(2, 8), (2, 4), (2, 2), (2,), (4,)]
                inputs = [make(size) for size in sizes]
                g16 = torch.zeros(shape, dtype=torch.bfloat16)
                return fused_replayssm_decode(*inputs, 0.5, state, d, k, g16, out, rows, pos)
            """,
            [(6, "RL007")],
        ),
        # a `*` whose length is not known hides every later position
        (
            """
            import torch
            def step(shape, inputs, rings):
                g = torch.zeros(shape, dtype=torch.bfloat16)
                return fused_replayssm_decode(*rings, g, g, g, g, g, g, g, g, g, g)
            """,
            [],
        ),
    ],
)
def test_entry_point_arguments_through_containers(
    source: str, expected: list[tuple[int, str]]
) -> None:
    assert _check(source, "RL001", "RL007") == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # every call passes bf16: the prefix sums keep it, a Python number does not promote
        (
            """
            import torch
            def prefix(draft, scale: float, ring):
                offset = float(ring.sum())
                steps = draft[:, :2] * scale
                g_cache = steps.cumsum(-1) + offset + ring.sum().item()
                return g_cache
            def run(ring):
                return prefix(torch.rand(2, 4).bfloat16(), 0.5, ring)
            """,
            [(5, "RL003")],
        ),
        # a float32 operand promotes the result
        (
            """
            import torch
            def prefix(draft, ring):
                g_cache = draft.cumsum(-1) + ring.sum(-1, keepdim=True).float()
                return g_cache
            def run(ring):
                return prefix(torch.rand(2, 4).bfloat16(), ring)
            """,
            [],
        ),
        # spread from a helper's tuple, or unpacked from it first
        (
            """
            import torch
            def verified(accepted, bonus):
                verified_g_cache = torch.cat([accepted, bonus], dim=2)
                return verified_g_cache
            def scaled(draft, t: float):
                accepted_g_cache = draft.cumsum(dim=2) / t
                return accepted_g_cache
            def _inputs():
                return torch.rand(2, 2, 2, 4).half(), torch.rand(2, 2, 1, 4).half()
            def run():
                _, draft = _inputs()
                return verified(*_inputs()), scaled(draft, 2.0)
            """,
            [(3, "RL003"), (6, "RL003")],
        ),
        # a constructor's callers, a scale every call passes as a number, a list of tensors
        (
            """
            import torch
            class Spec:
                def __init__(self, draft):
                    self.spec_g_cache = draft.cumsum(-1)
            def scaled(g, scale, rows):
                g_cache = g.cumsum(-1) * scale
                stacked_g_cache = torch.stack(rows)
                return g_cache, stacked_g_cache
            def run(x):
                return Spec(x.bfloat16()), scaled(x.half(), 0.5, [x.half(), x.half()])
            """,
            [(4, "RL003"), (6, "RL003"), (7, "RL003")],
        ),
        # not called in the module, called with float32, or through `**`: not decided
        (
            """
            import torch
            def a(g):
                g_cache = g.cumsum(-1)
                return g_cache
            def b(g):
                g_cache = g.cumsum(-1)
                return g_cache
            def c(g):
                g_cache = g.cumsum(-1)
                return g_cache
            def run(kw):
                return b(torch.rand(4)), b(torch.rand(4).half()), c(**kw)
            """,
            [],
        ),
    ],
)
def test_a_parameter_that_the_module_calls_with_one_dtype(
    source: str, expected: list[tuple[int, str]]
) -> None:
    assert _check(source) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # a range with a dtype is an allocation of that dtype
        ("torch.arange(0, 16, dtype=torch.bfloat16).log1p()", [(4, "RL001")]),
        ("torch.log(torch.arange(1, 17, dtype=torch.float32))", []),
        # without one, its dtype follows the arguments (integers: int64): not judged
        ("torch.arange(16)", []),
        # linspace and eye take torch's default dtype, which a module's code may not own
        ("torch.linspace(-4.0, 0.0, 16)", [(4, "RL003")]),
    ],
)
def test_ranges_and_spaced_values(value: str, expected: list[tuple[int, str]]) -> None:
    source = f"""
        class Pool:
            def __init__(self):
                self.g_cache = {value}
        """
    assert _check("import torch\n" + textwrap.dedent(source).lstrip("\n")) == expected


@pytest.mark.parametrize(
    ("source", "assigned"),
    [
        ("self.ring_names = names\n", True),
        ("pool.ring_names += extra\n", True),
        ("self.ring_names: tuple[str, ...] = ()\n", True),
        ("(self.ring_names) = names\n", True),
        ("self . ring_names \\\n    = names\n", True),
        ("setattr(pool, key, value)\n", True),  # any attribute, by name
        ("if self.ring_names == names:\n    pass\n", False),
        ("ring_names = self.ring_names\n", False),
        ("self.ring_names_all = names\n", False),
        ("x = {self.ring_names: 1}\n", False),  # the text alone cannot tell: the walk does
    ],
)
def test_attribute_assignments_read_from_the_text_agree_with_the_walk(
    source: str, assigned: bool
) -> None:
    module = cst.parse_module(source)
    with_text = ModuleIndex(module, GateCacheNames(), source)
    walked = ModuleIndex(module, GateCacheNames())
    assert with_text.assigns_attribute("ring_names") is assigned
    assert walked.assigns_attribute("ring_names") is assigned


@pytest.mark.parametrize(
    ("source", "assigned"),
    [
        ("policy.RINGS = names\n", True),
        ("import policy\nsetattr(policy, key, value)\n", True),
        ("from pkg import policy\nsetattr(policy.sub, key, value)\n", True),
        ("setattr(make(), key, value)\n", True),  # an object of unknown origin
        ("import policy\nsetattr(cache, key, value)\n", False),  # a local object's attribute
        ("setattr(self.cache, key, value)\n", False),
    ],
)
def test_a_module_attribute_is_rebound_only_through_a_module(source: str, assigned: bool) -> None:
    index = ModuleIndex(cst.parse_module(source), GateCacheNames(), source)
    assert index.assigns_module_attribute("RINGS") is assigned
    # an instance's attribute may be set by any setattr that is not on self
    assert index.assigns_attribute("RINGS") is (assigned or "cache" in source)


@pytest.mark.parametrize(
    ("cast", "expected"),
    [
        ("TORCH_DTYPE_MAP[cfg.dtype]", [(10, "RL004"), (14, "RL004")]),
        ("TORCH_DTYPE_MAP[name]", [(10, "RL004"), (14, "RL004")]),
        ('TORCH_DTYPE_MAP["float32"]', []),
        ("devices[cfg.device]", []),  # a table of something else: a device move, perhaps
    ],
)
def test_a_cast_to_an_entry_of_a_dtype_table(cast: str, expected: list[tuple[int, str]]) -> None:
    source = f"""
        import torch
        from torch import nn
        TORCH_DTYPE_MAP = {{"float32": torch.float32, "bfloat16": torch.bfloat16}}
        class Attention(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))
        def export(model: nn.Module, cfg, name, devices) -> nn.Module:
            model.g_cache.zero_()
            return model.to({cast})
        def squeeze(g_cache, cfg, name, devices):
            if g_cache.numel() == 0:
                return g_cache
            g_cache = g_cache.to({cast})
            return g_cache
        """
    assert _check(source, "RL004") == expected


@pytest.mark.parametrize(
    ("cast", "expected"),
    [
        # a ring is a tensor: the cast takes its dtype, and the d ring follows the model's
        ("g_cache.to(cache.d_cache)", [(4, "RL004")]),
        ("g_cache.to(d_ring)", [(4, "RL004")]),
        ("g_cache.to(fp32_ring)", []),  # provably float32
        ("g_cache.to(target)", []),  # a device or a dtype, perhaps: not known
    ],
)
def test_a_cast_to_another_ring(cast: str, expected: list[tuple[int, str]]) -> None:
    source = f"""
        import torch
        def restore(cache, g_cache, d_ring, target, shape):
            fp32_ring = torch.zeros(shape, dtype=torch.float32)
            g_cache = {cast}
            return g_cache
        """
    assert _check(source, "RL004") == expected


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        ("torch.from_file(path, size=n, dtype=torch.bfloat16)", [(3, "RL005")]),
        ("torch.from_file(path, size=n)", [(3, "RL005")]),  # torch's default dtype
        ("torch.from_file(path, size=n, dtype=torch.float32)", []),
    ],
)
def test_a_file_read_as_raw_bytes(read: str, expected: list[tuple[int, str]]) -> None:
    source = f"""
        import torch
        def read(path, n):
            g_cache = {read}
            return g_cache
        """
    assert _check(source) == expected
    if expected:
        # the same bytes read as float32 are other numbers: the fix casts the result
        assert f"g_cache = {read}.to(torch.float32)" in _fix(source)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ("RINGS[:3]", [(6, "RL006")]),
        ("RINGS[-2:-1]", [(6, "RL006")]),
        ("RINGS[3:]", []),  # the state alone
        ("RINGS[::2]", [(6, "RL006")]),  # d_cache and g_cache
        ("RINGS[1::2]", []),  # k_cache and the state
    ],
)
def test_a_slice_of_a_tuple_of_names_loops_over_the_names_it_keeps(
    names: str, expected: list[tuple[int, str]]
) -> None:
    source = f"""
        import torch
        RINGS = ("d_cache", "k_cache", "g_cache", "s_cache")
        class Cache:
            def half_(self):
                for name in {names}:
                    setattr(self, name, getattr(self, name).half())
        """
    assert _check(source, "RL006") == expected


def test_a_loop_that_loads_each_ring_through_a_helper_is_reported_at_its_call() -> None:
    source = """
        import numpy as np
        import torch
        RINGS = ("d_cache", "k_cache", "g_cache")
        def read(path, name):
            array = np.load(f"{path}/{name}.npy")
            return torch.from_numpy(array)
        def swap_in(cache, path):
            for name in RINGS:
                setattr(cache, name, read(path, name))
        """
    linter = Linter(Settings(select=("RL006",)))
    findings = linter.check(textwrap.dedent(source).lstrip("\n"), "m.py")
    # the helper reads every ring: the loop that stores them is where the gate ring goes wrong;
    # a cast for the gate ring only cannot be spelled inside the helper, so there is no fix
    assert [(f.location.row, f.fix) for f in findings] == [(9, None)]
    assert "keeps it in the dtype it was saved with" in findings[0].message


@pytest.mark.parametrize(
    ("body", "reported"),
    [
        (
            "rings = {n: getattr(cache, n).to(dtype) for n in RINGS}\n    torch.save(rings, path)",
            False,
        ),
        (
            "rings = {n: getattr(cache, n).cpu() for n in RINGS}\n"
            "    rings.update({n: rings[n].half() for n in RINGS})\n"
            '    torch.save({"rings": rings, "pos": cache.pos}, path)',
            False,
        ),
        (
            "rings = {}\n    for n in RINGS:\n        rings[n] = getattr(cache, n).half()\n"
            "    np.savez(path, **rings)",
            False,
        ),
        # the mapping is used after the save: it may be a live cache
        (
            "rings = {n: getattr(cache, n).to(dtype) for n in RINGS}\n    torch.save(rings, path)\n"
            "    return rings",
            True,
        ),
        ("rings = {n: getattr(cache, n).to(dtype) for n in RINGS}\n    cache.rings = rings", True),
        # the mapping names the file, it is not what is saved
        (
            "rings = {n: getattr(cache, n).to(dtype) for n in RINGS}\n    torch.save(cache, rings)",
            True,
        ),
    ],
)
def test_a_mapping_only_written_to_a_file_is_a_snapshot_format(body: str, reported: bool) -> None:
    source = (
        'import numpy as np\nimport torch\n\nRINGS = ("d_cache", "g_cache")\n\n\n'
        f"def save(cache, path, dtype):\n    {body}\n"
    )
    assert bool(_check(source, "RL006")) is reported


@pytest.mark.parametrize(("base", "reported"), [("Manager", True), ("object", False)])
def test_a_method_self_calls_may_be_inherited_from_a_class_of_the_module(
    base: str, reported: bool
) -> None:
    source = f"""
        import torch

        class Manager:
            def _buffer_shapes(self, slots):
                return {{"state_buffer": (slots, 4), "delta_buffer": (slots, 4), "g_cache": (slots, 4)}}

        class Layerwise({base}):
            def _init_buffers(self, slots, dtype, layers):
                for name, shape in self._buffer_shapes(slots).items():
                    setattr(self, name, [torch.zeros(shape, dtype=dtype) for _ in range(layers)])
        """
    assert bool(_check(source, "RL006")) is reported


_FLAGGED_HELPER = """
import torch


class Weights:
    def __init__(self, tensors, dtype):
        self._tensors = tensors
        self.dtype = dtype

    def get_tensor(self, name: str, to_dtype=True, keep=None):
        tensor = self._tensors[name]
        if tensor.is_floating_point() and to_dtype and keep is None:
            tensor = tensor.to(dtype=self.dtype)
        return tensor


def read_rings(weights: Weights, prefix: str):
    return {{"d_cache": weights.get_tensor(prefix + ".d"), "g_cache": {gate}}}
"""


@pytest.mark.parametrize(
    ("gate", "expected"),
    [
        # the call switches the helper's cast off: the tensor is read as stored
        ('weights.get_tensor(prefix + ".g", to_dtype=False)', []),
        ('weights.get_tensor(prefix + ".g", False)', []),
        # the default casts it
        ('weights.get_tensor(prefix + ".g")', [(12, "RL004")]),
        ('weights.get_tensor(prefix + ".g", to_dtype=True)', [(12, "RL004")]),
        ('weights.get_tensor(prefix + ".g", keep=None)', [(12, "RL004")]),
        # `keep is None` is false for a string
        ('weights.get_tensor(prefix + ".g", keep="stored")', []),
        # what the call passes is not known: either branch may run
        ('weights.get_tensor(prefix + ".g", to_dtype=bool(prefix))', [(12, "RL004")]),
        ('weights.get_tensor(prefix + ".g", keep=prefix)', [(12, "RL004")]),
    ],
)
def test_a_helper_branch_a_call_switches_off_with_a_literal_does_not_run(
    gate: str, expected: list[tuple[int, str]]
) -> None:
    assert _check(_FLAGGED_HELPER.format(gate=gate), "RL004") == expected


@pytest.mark.parametrize("spelling", ["kv_data_type", "self.cache_data_type", "to_data_type(cfg)"])
def test_a_cast_to_a_value_named_a_data_type_is_a_cast(spelling: str) -> None:
    # FlashInfer spells a dtype `kv_data_type`: `.to(kv_data_type)` is no move to a device
    source = f"""
    import torch
    def replay_args(self, cfg, kv_data_type):
        g_cache = self.g_cache.to({spelling})
        return g_cache
    """
    findings = Linter().check(textwrap.dedent(source).lstrip("\n"), "m.py")
    assert [f.code for f in findings] == ["RL004"]
