"""The project index: module summaries, name resolution across modules, and what the rules make of
names imported from other modules of the project."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from project_support import index_of, lint_in_project, write_tree

from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding
from replaylint.lint.project.index import (
    MAX_CHAIN,
    External,
    Found,
    ModuleRef,
    ProjectIndex,
    module_names,
)
from replaylint.lint.project.summaries import summarise

_tree, _index, _lint = write_tree, index_of, lint_in_project


def _codes(findings: list[Finding]) -> list[tuple[int, str]]:
    return [(f.location.row, f.code) for f in findings]


# --------------------------------------------------------------------------- summaries
def test_constants_tables_and_aliases_are_summarised() -> None:
    summary = summarise(
        textwrap.dedent(
            """
            import torch
            from .wire import WIRE_DTYPE as W
            GATE_RING_DTYPE = torch.float32
            CACHE_DTYPE = W
            STR_DTYPE_TO_TORCH_DTYPE = {"bfloat16": torch.bfloat16, "float32": torch.float32}
            RING_SPECS = {"g_cache": ((4, 16), torch.bfloat16)}
            """
        ).lstrip("\n")
    )
    assert summary is not None
    names = summary["names"]
    assert names["torch"] == ["value", 1, ["module", "torch"]]
    assert names["W"] == ["value", 2, ["ref", ".wire", "WIRE_DTYPE"]]
    assert names["GATE_RING_DTYPE"] == ["value", 3, ["attr", ["name", "torch"], "float32"]]
    assert names["CACHE_DTYPE"] == ["value", 4, ["name", "W"]]
    table = names["STR_DTYPE_TO_TORCH_DTYPE"][2]
    assert table[0] == "table"
    assert [key for key, _ in table[1]] == ["bfloat16", "float32"]
    spec = names["RING_SPECS"][2][1][0][1]
    assert spec[0] == "tuple"
    assert spec[1][1] == ["attr", ["name", "torch"], "bfloat16"]


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("X = torch.float32\nX = torch.bfloat16\n", "X"),  # bound twice
        ("if FLAG:\n    X = torch.float32\n", "X"),  # bound under a condition
        ("try:\n    from .a import X\nexcept ImportError:\n    X = None\n", "X"),
        ("X = torch.float32\ndef f():\n    global X\n    X = torch.half\n", "X"),
        ('T = {"a": torch.float32}\nT["a"] = torch.half\n', "T"),  # mutated in place
        ('T = {"a": torch.float32}\nT.update(a=torch.half)\n', "T"),
        ("X = torch.float32\ndel X\n", "X"),
        ("X = torch.float32\nfrom .other import *\n", "X"),  # a star import may rebind it
        ("X = torch.float32\nglobals()['X'] = torch.half\n", "X"),
        ("X = torch.float32\nif (X := torch.half):\n    pass\n", "X"),
    ],
)
def test_names_that_are_not_certain_are_unknown(source: str, name: str) -> None:
    summary = summarise("import torch\n" + source)
    assert summary is not None
    assert summary["names"][name][0] == "unknown"


def test_function_summaries_substitute_locals_and_parameters() -> None:
    summary = summarise(
        textwrap.dedent(
            """
            import torch
            def gate_ring_dtype():
                \"\"\"The gate ring's dtype.\"\"\"
                return torch.float32
            def alloc_ring(shape, dtype, device=None):
                ring = torch.zeros(shape, dtype=dtype, device=device)
                return ring
            def branchy(flag):
                if flag:
                    return torch.float32
                return torch.bfloat16

            def branchy_locals(flag):
                dtype = torch.float32
                if flag:
                    dtype = torch.bfloat16
                    return dtype
                return dtype

            def generator(flag):
                if flag:
                    yield torch.float32
                return torch.bfloat16
            """
        )
    )
    assert summary is not None
    names = summary["names"]
    assert names["gate_ring_dtype"][3] == ["attr", ["name", "torch"], "float32"]
    params, result = names["alloc_ring"][2], names["alloc_ring"][3]
    assert [p[0] for p in params] == ["shape", "dtype", "device"]
    assert result[0] == "call"
    assert result[3][0] == ["dtype", ["param", "dtype"]]
    # several returns: each is one value the function may give
    assert names["branchy"][3] == [
        "either",
        [["attr", ["name", "torch"], "float32"], ["attr", ["name", "torch"], "bfloat16"]],
        False,
    ]
    # a local bound in such a body is not followed (which binding reaches a return is unknown)
    assert names["branchy_locals"][3] == ["unknown"]
    assert names["generator"][3] == ["unknown"]


def test_class_summaries_keep_constants_fields_and_properties() -> None:
    summary = summarise(
        textwrap.dedent(
            """
            import torch
            from dataclasses import dataclass, field
            @dataclass(frozen=True)
            class CacheConfig:
                ring_dtype: torch.dtype = torch.bfloat16
                gate_dtype: torch.dtype = field(default=torch.float32)
                layers: list = field(default_factory=list)
                @property
                def state_dtype(self):
                    return self.ring_dtype
            """
        ).lstrip("\n")
    )
    assert summary is not None
    kind, _, members, flags = summary["names"]["CacheConfig"]
    assert kind == "class"
    assert flags["record"]
    assert flags["frozen"]
    assert not flags["init"]
    assert members["ring_dtype"][0] == "field"
    assert members["gate_dtype"][2] == ["attr", ["name", "torch"], "float32"]
    assert members["layers"][2] == ["required"]
    assert members["state_dtype"] == ["property", 9, ["self", "ring_dtype"]]


def test_a_file_that_does_not_parse_has_no_summary() -> None:
    assert summarise("def broken(:\n") is None


# --------------------------------------------------------------------------- module names
def test_module_names_follow_packages_and_roots(tmp_path: Path) -> None:
    paths = _tree(
        tmp_path,
        {
            "src/pkg/__init__.py": "",
            "src/pkg/sub/__init__.py": "",
            "src/pkg/sub/policy.py": "",
            "tools/run.py": "",
            "a/util.py": "",
            "b/util.py": "",
        },
    )
    names = module_names(str(p) for p in paths)
    assert names["pkg"].endswith("src/pkg/__init__.py")
    assert names["pkg.sub.policy"].endswith("policy.py")
    assert names["run"].endswith("tools/run.py")
    assert "util" not in names  # two files named util: ambiguous, resolves to nothing


def test_relative_imports_resolve_against_the_importer(tmp_path: Path) -> None:
    paths = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/cfg.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/sub/pool.py": "",
        },
    )
    index = _index(paths)
    assert index.absolute("pkg.sub.pool", ".policy") == "pkg.sub.policy"
    assert index.absolute("pkg.sub.pool", "..cfg") == "pkg.cfg"
    assert index.absolute("pkg.sub", ".pool") == "pkg.sub.pool"  # a package's own __init__
    assert index.absolute("pkg.sub.pool", "....too_far") is None


def test_resolution_follows_aliases_re_exports_and_module_imports(tmp_path: Path) -> None:
    paths = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from .layers.policy import WIRE_DTYPE as WIRE_DTYPE\n",
            "pkg/layers/__init__.py": "",
            "pkg/layers/policy.py": "import torch\nWIRE_DTYPE = torch.bfloat16\n",
            "pkg/cfg.py": "from . import WIRE_DTYPE\nCACHE_DTYPE = WIRE_DTYPE\n",
        },
    )
    index = _index(paths)
    found = index.resolve("pkg.cfg", "pkg.cfg.CACHE_DTYPE")
    assert isinstance(found, External)
    assert found.name == "torch.bfloat16"
    # the alias, the import of `pkg`, the re-export in `pkg/__init__.py`, the definition
    assert [o.name for o in found.origins] == ["CACHE_DTYPE", *["WIRE_DTYPE"] * 3]
    assert found.origins[-1].path.endswith("policy.py")
    assert isinstance(index.resolve("pkg.cfg", "pkg.layers.policy"), ModuleRef)
    assert isinstance(index.resolve("pkg.cfg", "numpy.float16"), External)
    assert index.resolve("pkg.cfg", ".missing.X") is None


def test_cycles_and_long_chains_resolve_to_nothing(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .b import X\n",
        "pkg/b.py": "from .a import X\n",
    }
    chain = {f"pkg/c{i}.py": f"from .c{i + 1} import X\n" for i in range(MAX_CHAIN + 2)}
    chain[f"pkg/c{MAX_CHAIN + 2}.py"] = "import torch\nX = torch.bfloat16\n"
    index = _index(_tree(tmp_path, {**files, **chain}))
    assert index.resolve("pkg.a", "pkg.a.X") is None
    assert index.resolve("pkg.c0", "pkg.c0.X") is None
    short = index.resolve("pkg.c5", f"pkg.c{MAX_CHAIN}.X")
    assert isinstance(short, External)
    assert short.name == "torch.bfloat16"


def test_summaries_read_are_recorded(tmp_path: Path) -> None:
    paths = _tree(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/policy.py": "import torch\nX = torch.float32\n"},
    )
    index = _index(paths)
    assert isinstance(index.resolve("pkg", "pkg.policy.X"), External)
    used = index.take_used()
    # the package too: a name it bound would shadow the submodule
    assert [Path(path).name for path, _ in used] == ["__init__.py", "policy.py"]
    assert index.take_used() == ()


def test_a_definition_is_found_with_its_origin(tmp_path: Path) -> None:
    paths = _tree(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/policy.py": "def gate_ring_dtype():\n    return 1\n"},
    )
    found = _index(paths).resolve("pkg", "pkg.policy.gate_ring_dtype")
    assert isinstance(found, Found)
    assert found.definition[0] == "function"
    assert found.origins[-1].line == 1


# --------------------------------------------------------------------------- the rules
POLICY = """
import functools
import torch

GATE_RING_DTYPE = torch.float32
WIRE_DTYPE = torch.bfloat16
CACHE_DTYPE = WIRE_DTYPE
STR_DTYPE_TO_TORCH_DTYPE = {"bfloat16": torch.bfloat16, "float32": torch.float32}
GATE_DTYPE_NAME = "float32"
WIRE_DTYPE_NAME = "bfloat16"

def gate_ring_dtype():
    return GATE_RING_DTYPE

def wire_dtype():
    return CACHE_DTYPE

def model_dtype():
    return torch.get_default_dtype()

def to_dtype(name):
    return STR_DTYPE_TO_TORCH_DTYPE[name]

def alloc_ring(shape, dtype, device=None):
    return torch.zeros(shape, dtype=dtype, device=device)

def alloc_wire_ring(shape):
    return torch.empty(shape, dtype=torch.bfloat16)

zeros_wire = functools.partial(torch.zeros, dtype=torch.bfloat16)
make_ring = lambda shape, dtype=torch.float16: torch.zeros(shape, dtype=dtype)
"""


def _pool(body: str) -> dict[str, str]:
    header = "import torch\n"
    return {
        "pkg/__init__.py": "",
        "pkg/policy.py": POLICY,
        "pkg/pool.py": header + textwrap.dedent(body).lstrip("\n"),
    }


@pytest.mark.parametrize(
    "expression",
    [
        "GATE_RING_DTYPE",
        "gate_ring_dtype()",
        "STR_DTYPE_TO_TORCH_DTYPE[GATE_DTYPE_NAME]",
        'to_dtype("float32")',
        "policy.GATE_RING_DTYPE",
        "pkg.policy.gate_ring_dtype()",
    ],
)
def test_an_imported_float32_policy_is_no_finding(tmp_path: Path, expression: str) -> None:
    body = f"""
    import pkg.policy
    from . import policy
    from .policy import GATE_RING_DTYPE, STR_DTYPE_TO_TORCH_DTYPE, GATE_DTYPE_NAME
    from .policy import gate_ring_dtype, to_dtype
    g_cache = torch.zeros(4, 16, dtype={expression})
    """
    assert _lint(tmp_path, _pool(body), "pkg/pool.py") == []


@pytest.mark.parametrize(
    ("expression", "origin"),
    [
        ("WIRE_DTYPE", "from `WIRE_DTYPE` at "),
        ("CACHE", "from `CACHE_DTYPE` at "),  # `from .policy import CACHE_DTYPE as CACHE`
        ("wire_dtype()", "from `wire_dtype` at "),
        ("STR_DTYPE_TO_TORCH_DTYPE[WIRE_DTYPE_NAME]", "from `STR_DTYPE_TO_TORCH_DTYPE` at "),
        ('to_dtype("bfloat16")', "from `to_dtype` at "),
        ("m.WIRE_DTYPE", "from `WIRE_DTYPE` at "),
    ],
)
def test_an_imported_bf16_policy_is_reported_with_its_origin(
    tmp_path: Path, expression: str, origin: str
) -> None:
    body = f"""
    import pkg.policy as m
    from .policy import WIRE_DTYPE, CACHE_DTYPE as CACHE, STR_DTYPE_TO_TORCH_DTYPE
    from .policy import WIRE_DTYPE_NAME, wire_dtype, to_dtype
    g_cache = torch.zeros(4, 16, dtype={expression})
    """
    findings = _lint(tmp_path, _pool(body), "pkg/pool.py")
    assert _codes(findings) == [(5, "RL001")]
    assert origin in findings[0].message
    assert "policy.py:" in findings[0].message
    assert findings[0].fix is not None
    assert [edit.content for edit in findings[0].fix.edits] == ["torch.float32"]


def test_a_chain_names_the_import_and_the_definition(tmp_path: Path) -> None:
    body = """
    from .policy import CACHE_DTYPE
    g_cache = torch.zeros(4, dtype=CACHE_DTYPE)
    """
    (finding,) = _lint(tmp_path, _pool(body), "pkg/pool.py")
    assert "from `CACHE_DTYPE` at " in finding.message
    assert ", defined as `WIRE_DTYPE` at " in finding.message


def test_allocation_helpers_of_the_project(tmp_path: Path) -> None:
    body = """
    from .policy import GATE_RING_DTYPE, alloc_ring, alloc_wire_ring, zeros_wire, make_ring
    d_cache = alloc_ring((4, 16), torch.bfloat16)
    g_cache = alloc_ring((4, 16), GATE_RING_DTYPE)
    gate_cache = alloc_ring((4, 16), torch.bfloat16)
    replayssm_g = alloc_wire_ring((4, 16))
    layer0_g_cache = zeros_wire((4, 16))
    layer1_g_cache = make_ring((4, 16))
    layer2_g_cache = zeros_wire((4, 16), dtype=torch.float32)
    """
    findings = _lint(tmp_path, _pool(body), "pkg/pool.py")
    assert _codes(findings) == [(5, "RL001"), (6, "RL001"), (7, "RL001"), (8, "RL001")]
    edits = [[e.content for e in f.fix.edits] if f.fix else None for f in findings]
    assert edits == [
        ["torch.float32"],  # the call's own argument
        [".to(torch.float32)"],  # a fresh allocation with a fixed dtype inside: cast here
        [", dtype=torch.float32"],  # the partial's dtype, overridden by this call
        [", dtype=torch.float32"],  # the lambda's default, overridden by this call
    ]
    assert "from `alloc_wire_ring` at " in findings[1].message
    assert "float16" in findings[3].message


def test_a_helper_that_reads_its_dtype_twice_is_reported_without_a_fix(tmp_path: Path) -> None:
    files = _pool(
        """
        from .helpers import ring
        g_cache = ring(4, torch.bfloat16)
        """
    )
    files["pkg/helpers.py"] = (
        "import torch\n"
        "def ring(n, dtype):\n"
        "    return torch.zeros(n, dtype=dtype, device=str(dtype))\n"
    )
    (finding,) = _lint(tmp_path, files, "pkg/pool.py")
    assert finding.code == "RL001"
    assert finding.fix is None


def test_default_dtype_through_a_function_of_the_project(tmp_path: Path) -> None:
    body = """
    from .policy import model_dtype
    torch.set_default_dtype(torch.bfloat16)
    g_cache = torch.zeros(4, dtype=model_dtype())
    """
    findings = _lint(tmp_path, _pool(body), "pkg/pool.py")
    assert _codes(findings) == [(4, "RL001")]


CONFIG = """
import torch
from dataclasses import dataclass

@dataclass(frozen=True)
class CacheConfig:
    ring_dtype: torch.dtype = torch.bfloat16
    gate_dtype: torch.dtype = torch.float32

    @property
    def state_dtype(self):
        return torch.bfloat16

    @property
    def gate_ring_dtype(self):
        return self.gate_dtype

class Policy:
    GATE = torch.float32
    WIRE = torch.bfloat16
"""


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("CacheConfig().gate_dtype", []),
        ("CacheConfig().ring_dtype", [(7, "RL001")]),  # the default holds: built right here
        ("CacheConfig(ring_dtype=x).ring_dtype", [(7, "RL001")]),  # the argument decides
        ("cfg.gate_dtype", []),  # a float32 default vouches
        ("cfg.ring_dtype", [(7, "RL002")]),  # built elsewhere: may hold anything
        ("cfg.state_dtype", [(7, "RL001")]),  # a property that returns a constant
        ("cfg.gate_ring_dtype", []),
        ("Policy.GATE", []),
        ("Policy.WIRE", [(7, "RL001")]),
    ],
)
def test_config_classes_of_the_project(
    tmp_path: Path, expression: str, expected: list[tuple[int, str]]
) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/config.py": CONFIG,
        "pkg/pool.py": textwrap.dedent(
            f"""
            import torch
            from .config import CacheConfig, Policy

            x = torch.float16

            def build(cfg: CacheConfig):
                g_cache = torch.zeros(4, dtype={expression})
                return g_cache
            """
        ).lstrip("\n"),
    }
    assert _codes(_lint(tmp_path, files, "pkg/pool.py")) == expected


@pytest.mark.parametrize(
    "policy",
    [
        "X = torch.bfloat16\nif FLAG:\n    X = torch.float32\n",  # rebound conditionally
        "X = torch.float32\ndef flip():\n    global X\n    X = torch.bfloat16\n",
        'T = {"g": torch.float32}\nT["g"] = torch.bfloat16\nX = T["g"]\n',
    ],
)
def test_uncertain_policies_are_not_vouched_for(tmp_path: Path, policy: str) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/policy.py": "import torch\n" + policy,
        "pkg/pool.py": "import torch\nfrom .policy import X\ng_cache = torch.zeros(4, dtype=X)\n",
    }
    # not known either way: what the module alone would say (a dtype not provably float32)
    assert _codes(_lint(tmp_path, files, "pkg/pool.py")) == [(3, "RL002")]


def test_a_local_that_shadows_an_import_is_not_resolved(tmp_path: Path) -> None:
    body = """
    from .policy import GATE_RING_DTYPE

    def build(GATE_RING_DTYPE=torch.half):
        g_cache = torch.zeros(4, dtype=GATE_RING_DTYPE)
        return g_cache
    """
    findings = _lint(tmp_path, _pool(body), "pkg/pool.py")
    assert _codes(findings) == [(5, "RL002")]


def test_without_a_project_index_nothing_is_resolved(tmp_path: Path) -> None:
    files = _pool("from .policy import WIRE_DTYPE\ng_cache = torch.zeros(4, dtype=WIRE_DTYPE)\n")
    _tree(tmp_path, files)
    text = (tmp_path / "pkg/pool.py").read_text(encoding="utf-8")
    findings = Linter().check(text, str(tmp_path / "pkg/pool.py"))
    assert _codes(findings) == [(3, "RL002")]  # today's single-module answer


def test_a_helper_of_the_project_that_allocates_without_a_dtype(tmp_path: Path) -> None:
    files = _pool("from .rings import plain_ring\ng_cache = plain_ring(4)\n")
    files["pkg/rings.py"] = "import torch\ndef plain_ring(n):\n    return torch.empty(n, 16)\n"
    (finding,) = _lint(tmp_path, files, "pkg/pool.py")
    assert finding.code == "RL003"
    assert "made by `plain_ring` at " in finding.message
    assert "rings.py:2" in finding.message
    assert finding.fix is not None
    assert [e.content for e in finding.fix.edits] == [".to(torch.float32)"]


def test_an_ambiguous_module_resolves_to_nothing(tmp_path: Path) -> None:
    files = {
        "a/policy.py": "import torch\nWIRE = torch.float32\n",
        "b/policy.py": "import torch\nWIRE = torch.bfloat16\n",
        "a/pool.py": "import torch\nfrom policy import WIRE\ng_cache = torch.zeros(4, dtype=WIRE)\n",
    }
    # two top-level modules named `policy`: which one `import policy` finds is not known
    assert _codes(_lint(tmp_path, files, "a/pool.py")) == [(3, "RL002")]


def test_a_name_a_package_binds_and_a_submodule_of_it_is_ambiguous(tmp_path: Path) -> None:
    paths = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "import torch\npolicy = torch.float32\n",
            "pkg/policy.py": "import torch\nX = torch.bfloat16\n",
        },
    )
    assert _index(paths).resolve("pkg", "pkg.policy") is None


def test_a_module_constant_the_importer_assigns_is_not_vouched_for(tmp_path: Path) -> None:
    body = """
    from . import policy
    policy.GATE_RING_DTYPE = torch.bfloat16
    g_cache = torch.zeros(4, dtype=policy.GATE_RING_DTYPE)
    """
    assert _codes(_lint(tmp_path, _pool(body), "pkg/pool.py")) == [(4, "RL002")]


@pytest.mark.parametrize(("frozen", "expected"), [(True, [(5, "RL001")]), (False, [(5, "RL002")])])
def test_an_instance_kept_in_a_local_holds_its_defaults_only_when_frozen(
    tmp_path: Path, frozen: bool, expected: list[tuple[int, str]]
) -> None:
    config = CONFIG.replace(
        "@dataclass(frozen=True)", "@dataclass" if not frozen else "@dataclass(frozen=True)"
    )
    files = {
        "pkg/__init__.py": "",
        "pkg/config.py": config,
        "pkg/pool.py": (
            "import torch\n"
            "from .config import CacheConfig\n"
            "cfg = CacheConfig()\n"
            "configure(cfg)\n"
            "g_cache = torch.zeros(4, dtype=cfg.ring_dtype)\n"
        ),
    }
    assert _codes(_lint(tmp_path, files, "pkg/pool.py")) == expected


def test_a_helper_that_takes_its_dtype_from_a_tensor_argument(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/util.py": (
            "import torch\n"
            "def alloc_like(shape, ref):\n"
            "    return torch.zeros(shape, dtype=ref.dtype, device=ref.device)\n"
        ),
        "pkg/fork.py": (
            "import torch\n"
            "from .util import alloc_like\n"
            "def fork(d_cache, g_cache):\n"
            "    forked_g_cache = alloc_like(tuple(g_cache.shape), ref=d_cache).copy_(g_cache)\n"
            "    kept_g_cache = alloc_like(tuple(g_cache.shape), ref=g_cache).copy_(g_cache)\n"
            "    return forked_g_cache, kept_g_cache\n"
        ),
    }
    findings = _lint(tmp_path, files, "pkg/fork.py")
    assert _codes(findings) == [(4, "RL003")]
    assert "allocated by `alloc_like` in the dtype of `d_cache`" in findings[0].message
    assert findings[0].fix is not None
    assert [e.content for e in findings[0].fix.edits] == [".to(torch.float32)"]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            "class Rings(NamedTuple):\n    d: torch.Tensor\n    k: torch.Tensor\n    g: torch.Tensor\n",
            [(4, "RL003")],
        ),
        # an own __init__ may store its arguments anywhere
        (
            "class Rings(NamedTuple):\n    d: torch.Tensor\n    k: torch.Tensor\n    g: torch.Tensor\n"
            "    def __init__(self, g, k, d): ...\n",
            [],
        ),
        (
            "@dataclass(kw_only=True)\nclass Rings:\n    d: torch.Tensor\n    k: torch.Tensor\n    g: torch.Tensor\n",
            [],
        ),
    ],
)
def test_fields_of_a_record_class_of_another_module(
    tmp_path: Path, record: str, expected: list[tuple[int, str]]
) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/rings.py": "from dataclasses import dataclass\nfrom typing import NamedTuple\nimport torch\n"
        + record,
        "pkg/step.py": (
            "import torch\n"
            "from .rings import Rings\n"
            "def step(rings, x):\n"
            "    scratch = Rings(rings.d.clone(), rings.k.clone(), torch.empty_like(rings.d).copy_(rings.g))\n"
            "    # the d ring's dtype reaches the gate ring through the record's third field\n"
            "    replayssm_decode(x, g_cache=scratch.g)\n"
        ),
    }
    assert _codes(_lint(tmp_path, files, "pkg/step.py")) == expected


@pytest.mark.parametrize(
    ("rings", "expected"),
    [
        ("        self.g_cache: list[torch.Tensor] = []\n", [(5, "RL005")]),
        ("        self.g_cache = [torch.zeros(4, dtype=torch.float32)]\n", [(5, "RL005")]),
        # a tensor: an element written into it is cast by the copy
        ("        self.g_cache = torch.zeros(2, 4, dtype=torch.float32)\n", []),
    ],
)
def test_an_element_of_a_list_of_rings_another_module_makes(
    tmp_path: Path, rings: str, expected: list[tuple[int, str]]
) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/cache.py": "import torch\nclass Cache:\n    def __init__(self):\n" + rings,
        "pkg/loading.py": (
            "import torch\n"
            "from .cache import Cache\n"
            "def restore(cache: Cache, path):\n"
            "    state = torch.load(path)\n"
            '    cache.g_cache[0] = state["g_cache.0"]\n'
        ),
    }
    assert _codes(_lint(tmp_path, files, "pkg/loading.py")) == expected


def test_a_list_question_reads_only_modules_that_spell_the_name(tmp_path: Path) -> None:
    paths = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/rings.py": """
                class Rings:
                    def __init__(self):
                        self.g_caches = []
                """,
            "pkg/other.py": "WIDTH = 4\n",
            "pkg/pool.py": "from .rings import Rings\nfrom .other import WIDTH\n",
        },
    )
    summarised: list[str] = []

    def load(path: str) -> tuple[dict[str, object] | None, str]:
        summarised.append(Path(path).name)
        return summarise(Path(path).read_text(encoding="utf-8")), f"summary of {Path(path).name}"

    def read(path: str) -> tuple[bytes, str]:
        return Path(path).read_bytes(), f"bytes of {Path(path).name}"

    index = ProjectIndex(module_names(str(p) for p in paths), load, reader=read)
    assert index.imported_list("pkg.pool", "g_caches")
    assert not index.imported_list("pkg.pool", "gate_rings")
    assert sorted(summarised) == ["pool.py", "rings.py"]  # other.py never names either
    used = dict(index.take_used())
    # the results still depend on the module read without a summary, by its digest
    assert used[str(tmp_path / "pkg" / "other.py")] == "bytes of other.py"
    assert used[str(tmp_path / "pkg" / "rings.py")] == "summary of rings.py"


def test_a_loop_over_a_tuple_of_names_another_module_defines(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/layout.py": 'RINGS = ("state", "d_cache", "k_cache", "g_cache")\n',
        "pkg/pool.py": """
            import torch
            from .layout import RINGS

            def rings(shapes, dtype):  # the g_cache ring is one of RINGS
                out = {}
                for name in RINGS:
                    out[name] = torch.zeros(shapes[name], dtype=dtype)
                for name in RINGS[:1]:
                    out[name] = torch.zeros(shapes[name], dtype=dtype)
                return out
            """,
    }
    found = _codes(_lint(tmp_path, files, "pkg/pool.py"))
    assert found == [(7, "RL006")]  # the second loop is over the state alone


def test_a_loop_over_a_class_constant_another_module_defines(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/cache.py": """
            import torch
            from torch import nn

            class ReplayCache(nn.Module):
                float_buffers = ("state", "d_cache", "k_cache", "g_cache")
                index_buffers = ("write_pos",)

                def __init__(self, n):
                    super().__init__()
                    self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

            def debug(pool):
                return vars(pool)  # an object's attributes: the module's names stay certain
            """,
        "pkg/sync.py": """
            from .cache import ReplayCache

            def sync(dst, src):
                for name in ReplayCache.float_buffers:
                    setattr(dst, name, getattr(src, name).to(dst.dtype, copy=True))
                for name in ReplayCache.index_buffers:
                    setattr(dst, name, getattr(src, name).to(dst.dtype, copy=True))
            """,
    }
    assert _codes(_lint(tmp_path, files, "pkg/sync.py")) == [(5, "RL006")]
    paths = write_tree(tmp_path, files)
    found = index_of(paths).resolve("pkg.sync", "pkg.cache.ReplayCache.float_buffers")
    assert isinstance(found, Found)
    assert found.definition[0] == "value"
    assert [o.name for o in found.origins] == ["ReplayCache", "float_buffers"]


def test_the_module_namespace_made_dynamic_by_vars_without_arguments() -> None:
    summary = summarise("import torch\nX = torch.float32\nvars()['X'] = torch.half\n")
    assert summary is not None
    assert summary["names"]["X"][0] == "unknown"


@pytest.mark.parametrize(
    ("statement", "writes"),
    [
        ("setattr(rings, name, tensor)", False),  # a local object
        ("setattr(self, name, tensor)", False),
        ("setattr(self.rings, name, tensor)", False),
        ("setattr(policy, name, tensor)", True),  # an imported module
        ("setattr(sys.modules[__name__], name, tensor)", True),
        ("setattr(importlib.import_module('pkg.policy'), name, tensor)", True),
        ("setattr(loaded, name, tensor)", True),  # bound to `import_module(...)` below
    ],
)
def test_a_module_writes_names_only_through_what_may_be_a_module(
    statement: str, writes: bool
) -> None:
    source = f"""
import importlib
import sys

from pkg import policy

loaded = importlib.import_module("pkg.other")


def grow(self, rings, name, tensor):
    {statement}
"""
    summary = summarise(source)
    assert summary is not None
    assert summary["writes_names"] is writes


def test_a_class_of_a_module_that_sets_attributes_of_its_own_objects_resolves(
    tmp_path: Path,
) -> None:
    # `setattr(rings, name, t)` on a loop variable: the pool class is still found by importers
    pool = """
import torch
from torch import nn


class Rings(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))


class Pool(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList(Rings(n) for _ in range(2))

    def grow(self, n):
        for rings in self.layers:
            for name in list(rings._buffers):
                setattr(rings, name, torch.zeros(n, dtype=getattr(rings, name).dtype))
"""
    user = """
import torch

from pkg.pool import Pool


def serve(n):
    pool = Pool(n)
    return pool.half()
"""
    files = {"pkg/__init__.py": "", "pkg/pool.py": pool, "pkg/user.py": user}
    found = lint_in_project(tmp_path, files, "pkg/user.py")
    assert [(f.code, f.location.row) for f in found] == [("RL004", 8)]
