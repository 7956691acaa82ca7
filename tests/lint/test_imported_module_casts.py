"""Module casts of model classes that another module of the project defines (RL004 with the
project index): the receiver is resolved to its class there, and the class's summary says which
gate buffer the cast converts, through base classes and parts at any depth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from project_support import fix_in_project, lint_in_project, write_tree

_MODELING = """
import torch
from torch import nn


class KimiDeltaAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.register_buffer("replay_g_cache", torch.zeros(4, dtype=torch.float32))
        self.register_buffer("replay_d_cache", torch.zeros(4))


class KimiModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(
            [KimiDeltaAttention(config, i) for i in range(config.num_layers)]
        )

    @classmethod
    def from_pretrained(cls, config):
        return cls(config)


class KimiForCausalLM(KimiModel):
    pass


class KeptKimiModel(KimiModel):
    def _apply(self, fn, recurse=True):
        kept = [layer.replay_g_cache for layer in self.layers]
        super()._apply(fn, recurse)
        for layer, ring in zip(self.layers, kept):
            layer.replay_g_cache = ring.to(layer.replay_d_cache.device, torch.float32)
        return self


class PassThroughKimiModel(KimiModel):
    def _apply(self, fn, recurse=True):
        return super()._apply(fn, recurse)


class Projection(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(4))


def build_model(config):
    return KimiModel(config)


def load_model(config):
    return KimiModel(config), {"layers": config.num_layers}


def load_projection():
    return Projection(), {}
"""


def _findings(tmp_path: Path, loader: str) -> list[tuple[int, str, str]]:
    files = {"pkg/__init__.py": "", "pkg/modeling.py": _MODELING, "pkg/loader.py": loader}
    found = lint_in_project(tmp_path, files, "pkg/loader.py")
    return [(f.location.row, f.code, f.message) for f in found]


@pytest.mark.parametrize(
    "body",
    [
        "model = KimiModel(config)\nmodel.half()",
        "model = KimiModel.from_pretrained(config).to(torch.bfloat16)",
        "model = build_model(config).eval()\nmodel = model.to(dtype=torch.float16)",
        "KimiForCausalLM(config).bfloat16()",
        "model = modeling.KimiModel(config)\nmodel.half()",
    ],
)
def test_a_cast_of_an_imported_model_class_is_reported(tmp_path: Path, body: str) -> None:
    lines = "\n".join(f"    {line}" for line in body.splitlines())
    loader = (
        "import torch\nfrom . import modeling\nfrom .modeling import KimiForCausalLM, KimiModel, "
        f"build_model\n\n\ndef load(config):\n{lines}\n"
    )
    found = [f for f in _findings(tmp_path, loader) if f[1] == "RL004"]
    assert len(found) == 1, found
    message = found[0][2]
    assert "gate buffer `replay_g_cache` of `KimiDeltaAttention`" in message
    assert "(registered at " in message
    assert "modeling.py:8), held by `KimiModel.layers`," in message


def test_an_annotated_parameter_is_an_instance_of_its_class(tmp_path: Path) -> None:
    loader = (
        "from typing import Optional\nfrom .modeling import KimiModel\n\n\n"
        'def prepare(model: Optional["KimiModel"]):\n    model.half()\n    return model\n'
    )
    assert [f[:2] for f in _findings(tmp_path, loader)] == [(6, "RL004")]


@pytest.mark.parametrize(
    "body",
    [
        "KimiModel(config).to('cuda')",  # a device move
        "KimiModel(config).to(torch.float32)",  # a float32 cast
        "KeptKimiModel(config).half()",  # the class decides what casts do
        "Projection().half()",  # no gate buffer anywhere
        "keep_fp32_gate_caches(KimiModel(config)).half()",  # guarded instance
    ],
)
def test_casts_that_keep_the_gate_buffer_are_not_reported(tmp_path: Path, body: str) -> None:
    loader = (
        "import torch\nfrom replaylint.guards import keep_fp32_gate_caches\n"
        "from .modeling import KeptKimiModel, KimiModel, Projection\n\n\n"
        f"def load(config):\n    {body}\n"
    )
    assert _findings(tmp_path, loader) == []


def test_an_override_that_does_not_restore_float32_keeps_nothing(tmp_path: Path) -> None:
    loader = (
        "from .modeling import PassThroughKimiModel\n\n\n"
        "def load(config):\n    return PassThroughKimiModel(config).half()\n"
    )
    assert [f[:2] for f in _findings(tmp_path, loader)] == [(5, "RL004")]


def test_a_model_made_in_more_than_one_way_is_not_guessed(tmp_path: Path) -> None:
    loader = (
        "from .modeling import KimiModel\n\n\n"
        "def load(config, model=None):\n    model = model or KimiModel(config)\n    model.half()\n"
    )
    assert _findings(tmp_path, loader) == []


def test_the_fix_protects_the_gate_buffers_before_the_cast(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/modeling.py": _MODELING,
        "pkg/loader.py": "from .modeling import KimiModel\n\n\ndef load(c):\n    return KimiModel(c).half()\n",
    }
    fixed = fix_in_project(tmp_path, files, "pkg/loader.py")
    assert fixed == (
        "import replaylint.guards\nfrom .modeling import KimiModel\n\n\ndef load(c):\n"
        "    return replaylint.guards.keep_fp32_gate_caches(KimiModel(c)).half()\n"
    )


# ------------------------------------------------------------------ runs over a tree
_TREE = {
    "pyproject.toml": "[project]\nname = 'pkg'\n\n[tool.replaylint]\n",
    "pkg/__init__.py": "",
    "pkg/models/__init__.py": "",
    # names a gate cache: the pre-filter's first stage keeps it
    "pkg/models/attention.py": (
        "import torch\nfrom torch import nn\n\n\nclass KimiDeltaAttention(nn.Module):\n"
        "    def __init__(self, n):\n        super().__init__()\n"
        '        self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))\n'
    ),
    # names none: found by the name of the class it holds
    "pkg/models/kimi.py": (
        "from torch import nn\n\nfrom .attention import KimiDeltaAttention\n\n\n"
        "class KimiModel(nn.Module):\n    def __init__(self, layers):\n        super().__init__()\n"
        "        self.layers = nn.ModuleList([KimiDeltaAttention(4) for _ in range(layers)])\n"
    ),
    # names none either, and casts the model two modules away from the buffer
    "pkg/loader.py": (
        "import torch\n\nfrom .models.kimi import KimiModel\n\n\n"
        "def load(layers):\n    return KimiModel(layers).to(torch.bfloat16)\n"
    ),
    # mentions the class but casts nothing
    "pkg/report.py": "from .models.kimi import KimiModel\n\nMODEL = KimiModel\n",
}


def _run(cwd: Path, *args: str) -> list[tuple[str, int, str]]:
    done = subprocess.run(
        [sys.executable, "-m", "replaylint", "check", "--output-format", "json", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in {0, 1}, done.stderr
    return [
        (Path(f["filename"]).relative_to(cwd).as_posix(), f["location"]["row"], f["code"])
        for f in json.loads(done.stdout)
    ]


@pytest.mark.parametrize(
    "args",
    [("--no-cache", "."), ("--no-cache", "pkg/loader.py"), ("--no-cache", "--jobs", "2", ".")],
)
def test_a_run_finds_the_cast_in_a_file_that_names_no_gate_cache(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    write_tree(tmp_path, _TREE)
    assert _run(tmp_path, *args) == [("pkg/loader.py", 7, "RL004")]


def test_a_cached_run_gives_the_same_finding(tmp_path: Path) -> None:
    write_tree(tmp_path, _TREE)
    first = _run(tmp_path, ".")
    assert first == _run(tmp_path, ".") == [("pkg/loader.py", 7, "RL004")]


@pytest.mark.parametrize(
    ("body", "reported"),
    [
        ("model, meta = load_model(config)\n    model.half()", True),
        ("projection, meta = load_projection()\n    projection.half()", False),
        ("meta, model = load_model(config)\n    model.half()", False),  # the dict is no model
        ("model, meta = made_here(config)\n    model.to(torch.bfloat16)", True),
    ],
)
def test_an_element_of_a_returned_tuple_is_an_instance_of_its_class(
    tmp_path: Path, body: str, reported: bool
) -> None:
    loader = (
        "import torch\nfrom .modeling import KimiModel, load_model, load_projection\n\n\n"
        "def made_here(config):\n    return KimiModel(config), None\n\n\n"
        f"def load(config):\n    {body}\n"
    )
    assert [f[1] for f in _findings(tmp_path, loader)] == (["RL004"] if reported else [])


def test_an_attribute_of_self_holding_an_imported_model_is_an_instance_of_its_class(
    tmp_path: Path,
) -> None:
    loader = (
        "from .modeling import KimiModel\n\n\n"
        "class Backend:\n"
        "    def initialize(self, config, dtype):\n"
        "        self.model = KimiModel(config)\n"
        "        self.model = self.model.to(dtype)\n"
    )
    assert [f[:2] for f in _findings(tmp_path, loader)] == [(7, "RL004")]


_CACHES = """
import torch
from torch import nn

from replaylint.guards import keep_fp32_gate_caches


class StaticCache(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("d_cache", torch.zeros(n))
        self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))


@keep_fp32_gate_caches
class GuardedCache(StaticCache):
    pass
"""


@pytest.mark.parametrize(
    "held",
    [
        "StaticCache(4)",
        "nn.ModuleList([StaticCache(4) for _ in range(layers)])",
        "nn.ModuleList(StaticCache(4) for _ in range(layers))",
    ],
)
def test_a_class_of_the_module_that_holds_an_imported_holder_is_followed(
    tmp_path: Path, held: str
) -> None:
    serving = (
        "from torch import nn\nfrom .caches import GuardedCache, StaticCache\n\n\n"
        "class Wrapper(nn.Module):\n    def __init__(self, model, layers):\n"
        f"        super().__init__()\n        self.model = model\n        self.caches = {held}\n\n\n"
        "def serve(model):\n    wrapper = Wrapper(model, 2)\n    wrapper.half()\n    return wrapper\n"
    )
    files = {"pkg/__init__.py": "", "pkg/caches.py": _CACHES, "pkg/serving.py": serving}
    found = [
        (f.location.row, f.code, f.message)
        for f in lint_in_project(tmp_path, files, "pkg/serving.py")
    ]
    assert [row[:2] for row in found] == [(14, "RL004")]
    assert "held by `Wrapper.caches`" in found[0][2]
    assert "registered at " in found[0][2]
    guarded = serving.replace(held, held.replace("StaticCache", "GuardedCache"))
    files["pkg/serving.py"] = guarded
    assert lint_in_project(tmp_path, files, "pkg/serving.py") == []


_SERVING_WITH_SETUP = """
from torch import nn
from .caches import StaticCache


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.static_cache = None

    def setup_static_cache(self):
        self.static_cache = StaticCache(4)
        return self.static_cache

    def generate(self, tokens):
        self.setup_static_cache()
        return tokens


def build():
    model = Model()
{before}    model.half()
{after}    return model
"""


@pytest.mark.parametrize(
    ("before", "after", "reported"),
    [
        ("", "", False),  # built here: the setup method has not run, so there is no cache yet
        ("    model.setup_static_cache()\n", "", True),
        ("    model.generate(None)\n", "", True),  # runs the setup method
        ("    prepare(model)\n", "", True),  # handed on to a function that runs the setup
        ("    describe(model)\n", "", False),  # handed on to one that calls no setup method
        ("    print(model)\n", "", True),  # handed on outside the project: anything may run
        ("    model.setup_static_cache()\n", "    model.setup_static_cache()\n", False),
        ("    model.generate(None)\n", "    model.generate(None)\n", False),
    ],
)
def test_a_part_a_later_method_installs_counts_once_that_method_ran(
    tmp_path: Path, before: str, after: str, reported: bool
) -> None:
    serving = _SERVING_WITH_SETUP.format(before=before, after=after)
    serving += "\n\ndef prepare(model):\n    model.setup_static_cache()\n"
    serving += "\n\ndef describe(model):\n    return str(model.proj.weight.shape)\n"
    files = {"pkg/__init__.py": "", "pkg/caches.py": _CACHES, "pkg/serving.py": serving}
    found = [(f.code, f.message) for f in lint_in_project(tmp_path, files, "pkg/serving.py")]
    if reported:
        assert [code for code, _ in found] == ["RL004"]
        assert "held by `Model.static_cache`" in found[0][1]
    else:
        assert found == []


@pytest.mark.parametrize(("call", "reported"), [("", False), ("model.attach(2)", True)])
def test_a_part_class_given_as_a_parameter_default_is_installed_by_its_method(
    tmp_path: Path, call: str, reported: bool
) -> None:
    serving = (
        "from torch import nn\n"
        "from .caches import StaticCache\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))\n\n"
        "    def attach(self, size, cache_cls=StaticCache):\n"
        "        for layer in self.layers:\n"
        "            layer.cache = cache_cls(size)\n\n\n"
        "def build():\n"
        "    model = Model()\n"
        f"    {call or 'pass'}\n"
        "    model.half()\n"
        "    return model\n"
    )
    files = {"pkg/__init__.py": "", "pkg/caches.py": _CACHES, "pkg/serving.py": serving}
    found = [f.code for f in lint_in_project(tmp_path, files, "pkg/serving.py")]
    assert found == (["RL004"] if reported else [])


def test_a_parameter_of_a_class_with_a_later_installed_part_may_hold_it(tmp_path: Path) -> None:
    serving = _SERVING_WITH_SETUP.replace(
        "def build():\n    model = Model()\n", "def build(model: Model):\n"
    ).format(before="", after="")
    files = {"pkg/__init__.py": "", "pkg/caches.py": _CACHES, "pkg/serving.py": serving}
    assert [f.code for f in lint_in_project(tmp_path, files, "pkg/serving.py")] == ["RL004"]


_RING_CACHE = """
import torch
from torch import nn


class ReplayCache(nn.Module):
    def __init__(self, n, dtype=None):
        super().__init__()
        self.register_buffer("d_cache", torch.zeros(n, dtype=dtype))
        self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))
"""

_SET_FROM_OUTSIDE = """
import torch
from torch import nn

from .cache import ReplayCache


class Attention(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = nn.Linear(n, n)
        self.kv_cache = None

    def build_kv_cache(self, n):
        return ReplayCache(n, self.proj.weight.dtype)


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.attn = Attention(n)


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = nn.ModuleList(Block(n) for _ in range(2))

    def set_kv_cache(self, n):
        for block in self.blocks:
            block.attn.kv_cache = block.attn.build_kv_cache(n)

    def export(self, dtype):
        for block in self.blocks:
            {cast}
"""


@pytest.mark.parametrize(
    ("cast", "reported"),
    [
        ("block.attn.kv_cache.half()", True),
        ("block.attn.kv_cache.to(dtype)", True),
        # a device move converts nothing
        ('block.attn.kv_cache.to("cpu")', False),
    ],
)
def test_an_attribute_the_module_sets_to_an_imported_holder_is_one(
    tmp_path: Path, cast: str, reported: bool
) -> None:
    # `block.attn.kv_cache` is set from outside its class: every value the module gives an
    # attribute of that name is what `Attention.build_kv_cache` returns, a `ReplayCache`
    files = {
        "pkg/__init__.py": "",
        "pkg/cache.py": _RING_CACHE,
        "pkg/model.py": _SET_FROM_OUTSIDE.format(cast=cast),
    }
    found = lint_in_project(tmp_path, files, "pkg/model.py")
    rows = [(f.location.row, f.code) for f in found]
    assert rows == ([(34, "RL004")] if reported else [])
    if reported:
        assert "the gate buffer `g_cache` of `ReplayCache`" in found[0].message


def test_an_attribute_given_values_of_two_classes_is_not_guessed(tmp_path: Path) -> None:
    model = _SET_FROM_OUTSIDE.format(cast="block.attn.kv_cache.half()").replace(
        "    def export(self, dtype):",
        "    def drop(self, n):\n"
        "        for block in self.blocks:\n"
        "            block.attn.kv_cache = nn.Linear(n, n)\n\n"
        "    def export(self, dtype):",
    )
    files = {"pkg/__init__.py": "", "pkg/cache.py": _RING_CACHE, "pkg/model.py": model}
    assert lint_in_project(tmp_path, files, "pkg/model.py") == []


def test_an_imported_class_that_puts_saved_buffers_back_by_name_keeps_them(
    tmp_path: Path,
) -> None:
    rings = (
        "import torch\nfrom torch import nn\n\n\n"
        "class Rings(nn.Module):\n"
        '    FP32_BUFFERS = ("g_cache",)\n\n'
        "    def __init__(self):\n"
        "        super().__init__()\n"
        '        self.register_buffer("g_cache", torch.zeros(2, dtype=torch.float32))\n'
        '        self.register_buffer("d_cache", torch.zeros(2))\n\n'
        "    def _apply(self, fn, recurse=True):\n"
        "        kept = {name: getattr(self, name) for name in self.FP32_BUFFERS}\n"
        "        super()._apply(fn, recurse)\n"
        "        for name, old in kept.items():\n"
        "            setattr(self, name, old.to(self.d_cache.device))\n"
        "        return self\n"
    )
    serving = "from .rings import Rings\n\n\ndef build():\n    return Rings().half()\n"
    files = {"pkg/__init__.py": "", "pkg/rings.py": rings, "pkg/serving.py": serving}
    assert lint_in_project(tmp_path, files, "pkg/serving.py") == []
    passing = rings.replace("setattr(self, name, old.to(self.d_cache.device))", "pass")
    files["pkg/rings.py"] = passing
    assert [f.code for f in lint_in_project(tmp_path, files, "pkg/serving.py")] == ["RL004"]
