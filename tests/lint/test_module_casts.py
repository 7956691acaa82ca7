"""Module casts that reach a gate buffer through submodules (RL004): ``model.to(torch.bfloat16)``
on a model whose layers register float32 gate buffers."""

from __future__ import annotations

import textwrap

import pytest

from replaylint.lint.config.settings import Settings
from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.names import DEFAULT_GATE_CACHE_PATTERNS
from replaylint.lint.model import Applicability

# A layer that registers a float32 gate ring, and models that hold it in every supported form.
_MODELS = """
import torch
from collections import OrderedDict
from typing import Optional
from torch import nn
from replaylint.guards import KeepFp32GateCaches, keep_fp32_gate_caches


class KimiDeltaAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.A_log = nn.Parameter(torch.zeros(4))
        self.register_buffer("replay_g_cache", torch.zeros(4, dtype=torch.float32))
        self.register_buffer("replay_d_cache", torch.zeros(4))


class KimiMLAAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.q_proj = nn.Linear(4, 4)


ATTENTION_CLASSES = {"kda": KimiDeltaAttention, "mla": KimiMLAAttention}


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        if config.is_kda(layer_idx):
            self.self_attn = KimiDeltaAttention(config, layer_idx)
        else:
            self.self_attn = KimiMLAAttention(config, layer_idx)


class KimiModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(
            [DecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )

    @classmethod
    def from_pretrained(cls, config):
        model = cls(config)
        return model


class KimiForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = KimiModel(config)
        self.lm_head = nn.Linear(4, 4)


class ListModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        layers = []
        for i in range(config.num_hidden_layers):
            layers.append(KimiDeltaAttention(config, i))
        self.layers = nn.ModuleList(layers)


class SequentialModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.body = nn.Sequential(OrderedDict([("kda", KimiDeltaAttention(config, 0))]))


class DictModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleDict({"kda": KimiDeltaAttention(config, 0)})


class NamedModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        for i in range(config.num_hidden_layers):
            self.add_module(f"layer{i}", KimiDeltaAttention(config, i))


class SetattrModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        setattr(self, "kda", KimiDeltaAttention(config, 0))


class LateModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList()

    def grow(self, config):
        self.layers.append(KimiDeltaAttention(config, len(self.layers)))


class TableModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = ATTENTION_CLASSES[config.attention](config, 0)


class SubModel(KimiModel):
    pass


class MlaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = KimiMLAAttention(config, 0)


@keep_fp32_gate_caches
class GuardedModel(KimiModel):
    pass


class MixinModel(KeepFp32GateCaches, nn.Module):
    def __init__(self, config):
        super().__init__()
        self.inner = KimiModel(config)


class Fp32GatesModel(KimiModel):
    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for layer in self.layers:
            layer.self_attn.replay_g_cache = layer.self_attn.replay_g_cache.float()
        return self


class HalfKeepsGates(KimiModel):
    def half(self):
        super().half()
        return keep_fp32_gate_caches(self)


class HoldsFp32Gates(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.inner = Fp32GatesModel(config)


class Fp32GatesLayer(KimiDeltaAttention):
    def _apply(self, fn, recurse=True):
        g_cache = self.replay_g_cache
        super()._apply(fn, recurse)
        self.replay_g_cache = g_cache.to(device=self.A_log.device)
        return self


class Fp32LayerModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([Fp32GatesLayer(config, 0)])


class NotAModule:
    def __init__(self, config):
        self.model = KimiModel(config)


class Runner:
    def __init__(self, config):
        self.config = config
        self.model = None

    def load(self, dtype):
        self.model = KimiForCausalLM(self.config)
        self.model.to(dtype)


def build_model(config):
    return KimiForCausalLM(config)

"""


def _findings(use: str, models: str = _MODELS) -> list[tuple[int, str, str]]:
    text = models + textwrap.dedent(use).lstrip("\n")
    return sorted((f.location.row, f.code, f.message) for f in Linter().check(text, "m.py"))


def _rows(use: str) -> list[int]:
    """Rows of RL004 findings in ``use`` (the models' own one, in ``Runner``, left out)."""
    first = _MODELS.count("\n") + 1
    return [row - first + 1 for row, code, _ in _findings(use) if code == "RL004" and row >= first]


@pytest.mark.parametrize(
    "use",
    [
        "KimiModel(config).to(torch.bfloat16)",
        "KimiForCausalLM(config).half()",
        "KimiForCausalLM(config).bfloat16()",
        "KimiForCausalLM(config).type(torch.float16)",
        "KimiForCausalLM(config).to('cuda', torch.bfloat16)",
        "KimiForCausalLM(config).to(plan.device, plan.atype)",  # after a device: the dtype
        "KimiForCausalLM(config).cuda().to(dtype=model_dtype)",
        "KimiForCausalLM(config).to(str_dtype_to_torch(config.torch_dtype))",
        "model = KimiModel(config)\nmodel = model.to(torch.bfloat16)",
        "KimiModel.from_pretrained(config).half()",
        "SubModel.from_pretrained(config).half()",
        "build_model(config).half()",
        "ListModel(config).half()",
        "SequentialModel(config).half()",
        "DictModel(config).half()",
        "NamedModel(config).half()",
        "SetattrModel(config).half()",
        # a layer added by a method once it has run (a new `LateModel` holds none yet)
        "model = LateModel(config)\nmodel.grow(config)\nmodel.half()",
        "def cast(model: LateModel):\n    model.half()",
        "TableModel(config).half()",
        "SubModel(config).half()",
        "def cast(model: KimiForCausalLM, dtype):\n    model.to(dtype)",
        "def cast(model: Optional['KimiModel']):\n    model.half()",
        "def cast(model: 'KimiModel | None'):\n    model.half()",
        "model = KimiModel(config) if fast else ListModel(config)\nmodel.half()",
        "model = MlaModel(config) if fast else KimiModel(config)\nmodel.half()",
        # named `model`, of no known class, beside gate-buffer models: one of them
        "def cast(model):\n    model.half()",
        "def cast(model: KimiModel, config):\n    model = load(config)\n    model.half()",
    ],
)
def test_a_cast_of_a_model_that_holds_a_gate_buffer_is_reported(use: str) -> None:
    assert _rows(use) == [use.count("\n") + 1]


@pytest.mark.parametrize(
    "use",
    [
        "KimiModel(config).to('cuda')",
        "LateModel(config).half()",  # `grow` has not added a layer yet
        "KimiModel(config).to(torch.device('cuda'), non_blocking=True)",
        "KimiModel(config).float()",
        "KimiModel(config).to(torch.float32)",
        "KimiModel(config).double()",
        "KimiModel(config).to(torch.float64)",
        "KimiModel(config).type(torch.cuda.FloatTensor)",
        "MlaModel(config).half()",
        "GuardedModel(config).half()",
        "GuardedModel.from_pretrained(config).half()",
        "MixinModel(config).half()",
        "Fp32GatesModel(config).to(torch.bfloat16)",
        "Fp32GatesModel.from_pretrained(config).half()",
        "HalfKeepsGates(config).half()",
        "HoldsFp32Gates(config).half()",
        "Fp32LayerModel(config).half()",
        "NotAModule(config).half()",
        "model = keep_fp32_gate_caches(KimiModel(config)).half()",
        "model = keep_fp32_gate_caches(KimiModel(config).half())",
        "model = KimiModel(config).half()\nkeep_fp32_gate_caches(model)",
        "model = KimiModel(config)\nkeep_fp32_gate_caches(model)\nmodel.half()",
        "def cast(layer):\n    layer.half()",  # no model by name or class
        "def cast(model: MlaModel):\n    model.half()",  # the annotation decides
        "model = Fp32GatesModel(config) if keep else KimiModel(config)\nif keep:\n    model.half()",
        "model = KimiModel(config) if not keep else Fp32GatesModel(config)\n"
        "if keep:\n    model.half()",
    ],
)
def test_a_cast_that_keeps_the_gate_buffers_float32_is_not_reported(use: str) -> None:
    assert _rows(use) == []


def test_a_cast_of_an_nn_module_parameter_is_reported_beside_gate_buffer_classes() -> None:
    # the class is not known, but the module's models convert their gate buffers when cast
    assert _rows("def cast(model: nn.Module):\n    model.half()") == [2]
    assert _rows("def cast(model: nn.Module):\n    model.to('cuda')") == []


def test_the_finding_names_the_path_to_the_buffer() -> None:
    first = _MODELS.count("\n") + 1
    found = _findings("KimiForCausalLM(config).to(torch.bfloat16)\n")
    [(_, code, message)] = [finding for finding in found if finding[0] == first]
    assert code == "RL004"
    assert message.startswith(
        "`KimiForCausalLM(config).to(torch.bfloat16)` casts the gate buffer `replay_g_cache` of "
        "`KimiDeltaAttention` (registered on line 13), held by `DecoderLayer.self_attn`, itself "
        "held by `KimiModel.layers`, itself held by `KimiForCausalLM.model`, to torch.bfloat16 "
        "with every other floating buffer of `KimiForCausalLM`"
    )
    assert "decorate `KimiForCausalLM`" in message


def test_a_model_held_by_an_attribute_of_self_is_followed() -> None:
    first = _MODELS.count("\n") + 1
    row = next(
        n for n, line in enumerate(_MODELS.splitlines(), 1) if "self.model.to(dtype)" in line
    )
    found = [r for r, code, _ in _findings("") if code == "RL004"]
    assert found == [row]
    assert row < first


def test_a_module_cast_is_fixed_unsafely_by_protecting_the_gate_caches() -> None:
    text = _MODELS + "model = KimiModel(config).half()\n"
    fixes = [f.fix for f in Linter().check(text, "m.py") if f.fix is not None]
    assert fixes
    assert all(fix.applicability is Applicability.UNSAFE for fix in fixes)
    assert Linter().fix(text, "m.py").source == text  # safe fixes only: untouched
    fixed = Linter().fix(text, "m.py", unsafe=True).source
    assert "\nimport replaylint.guards\nimport torch\n" in fixed
    assert fixed.endswith(
        "model = replaylint.guards.keep_fp32_gate_caches(KimiModel(config)).half()\n"
    )


def test_a_buffer_name_the_guard_does_not_know_is_passed_to_it() -> None:
    # `decay_ring` is a gate cache by the project's configuration, which the guard cannot read
    text = (
        "import torch\nfrom torch import nn\n\n"
        "class Rings(nn.Module):\n"
        "    def __init__(self, n):\n"
        "        super().__init__()\n"
        '        self.register_buffer("decay_ring", torch.zeros(n, dtype=torch.float32))\n\n'
        "rings = Rings(2).to(torch.bfloat16)\n"
    )
    settings = Settings(gate_cache_patterns=(*DEFAULT_GATE_CACHE_PATTERNS, "decay_ring"))
    fixed = Linter(settings).fix(text, "m.py", unsafe=True).source
    assert fixed.endswith(
        "rings = replaylint.guards.keep_fp32_gate_caches(Rings(2), "
        "extend_gate_cache_names=['decay_ring']).to(torch.bfloat16)\n"
    )


def test_a_cast_through_super_has_no_fix() -> None:
    text = (
        "import torch\nfrom torch import nn\n\n"
        "class Rings(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        '        self.register_buffer("g_cache", torch.zeros(2, dtype=torch.float32))\n\n'
        "    def to_wire(self):\n"
        "        return super().half()\n\n"
        "    def half(self):\n"
        "        return self.to_wire()\n"
    )
    findings = [f for f in Linter().check(text, "m.py") if f.code == "RL004"]
    assert all(f.fix is None for f in findings)


def test_a_gate_buffer_registered_in_another_dtype_is_reported_once() -> None:
    # RL001 reports the registration; the cast narrows nothing further
    models = _MODELS.replace(
        '"replay_g_cache", torch.zeros(4, dtype=torch.float32)',
        '"replay_g_cache", torch.zeros(4, dtype=torch.bfloat16)',
    )
    found = _findings("KimiModel(config).half()\nKimiDeltaAttention(config, 0).half()\n", models)
    assert [code for _, code, _ in found] == ["RL001"]


def test_a_gate_buffer_that_inherits_the_default_dtype_is_still_cast() -> None:
    # torch's default dtype is float32 unless a loader sets it (RL003 says where it does)
    models = _MODELS.replace(
        '"replay_g_cache", torch.zeros(4, dtype=torch.float32)', '"replay_g_cache", torch.zeros(4)'
    )
    first = models.count("\n") + 1
    found = _findings("KimiModel(config).half()\n", models)
    assert [(code, row >= first) for row, code, _ in found] == [
        ("RL003", False),
        ("RL004", False),  # `Runner.load`
        ("RL004", True),
    ]


def test_an_integer_gate_buffer_is_not_cast() -> None:
    models = _MODELS.replace(
        '"replay_g_cache", torch.zeros(4, dtype=torch.float32)',
        '"replay_g_cache", torch.zeros(4, dtype=torch.int32)',
    )
    assert _findings("KimiModel(config).half()\n", models) == []


def test_a_cycle_of_attributes_terminates() -> None:
    source = """
    import torch
    from torch import nn

    class A(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = B()

    class B(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = A()
            self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))

    A().half()
    """
    found = _findings(source, "")
    assert [(row, code) for row, code, _ in found] == [(15, "RL004")]
    assert "held by `A.b`" in found[0][2]


@pytest.mark.parametrize(
    ("override", "reported"),
    [
        ("return super()._apply(fn, recurse)", True),  # passes the cast through
        (
            "kept = self.g_cache\n        super()._apply(fn, recurse)\n"
            "        self.g_cache = kept.to(self.d_cache.device)\n        return self",
            False,  # puts the gate ring back
        ),
        (
            "super()._apply(fn, recurse)\n        self.g_cache = self.g_cache.float()\n"
            "        return self",
            False,  # mentions float32
        ),
        (
            'kept = {name: getattr(self, name) for name in ("g_cache",)}\n'
            "        super()._apply(fn, recurse)\n"
            "        for name, old in kept.items():\n"
            "            setattr(self, name, old.to(self.d_cache.device))\n"
            "        return self",
            False,  # puts back, by name, what it saved before the cast
        ),
    ],
)
def test_an_apply_override_keeps_the_gate_buffer_only_when_it_restores_float32(
    override: str, reported: bool
) -> None:
    text = (
        "import torch\nfrom torch import nn\n\n"
        "class Rings(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        '        self.register_buffer("g_cache", torch.zeros(2, dtype=torch.float32))\n'
        '        self.register_buffer("d_cache", torch.zeros(2))\n\n'
        f"    def _apply(self, fn, recurse=True):\n        {override}\n\n"
        "rings = Rings().half()\n"
    )
    found = [f.code for f in Linter().check(text, "m.py")]
    assert found == (["RL004"] if reported else [])


_RESTORER = """
class Restoring(KimiModel):
    def put_gates_back(self):
        for layer in self.layers:
            layer.self_attn.replay_g_cache = layer.self_attn.replay_g_cache.float()
        return self

    def put_deltas_back(self):
        for layer in self.layers:
            layer.self_attn.replay_d_cache = layer.self_attn.replay_d_cache.float()
        return self

    _kept_in_fp32 = ("replay_g_cache",)
    _kept_deltas = ("replay_d_cache",)

    def keep_listed(self):
        for layer in self.layers:
            for name in self._kept_in_fp32:
                setattr(layer.self_attn, name, getattr(layer.self_attn, name).to(torch.float32))
        return self

    def keep_deltas(self):
        for layer in self.layers:
            for name in self._kept_deltas:
                setattr(layer.self_attn, name, getattr(layer.self_attn, name).to(torch.float32))
        return self


"""
_LOOP = "for layer in {over}.layers:\n    layer.self_attn.replay_g_cache = layer.self_attn.replay_g_cache.float()"


@pytest.mark.parametrize(
    ("use", "reported"),
    [
        # a method of the module's classes called on the cast's result puts the buffer back
        ("Restoring(config).half().put_gates_back()", False),
        ("Restoring(config).half().put_deltas_back()", True),
        # `setattr` over the names a class constant lists
        ("Restoring(config).half().keep_listed()", False),
        ("Restoring(config).half().keep_deltas()", True),
        # a loop over the cast model, later in the scope
        ("model = KimiModel(config)\nmodel.half()\n" + _LOOP.format(over="model"), False),
        ("model = KimiModel(config).half()\n" + _LOOP.format(over="model"), False),
        # before the cast, or into another model, it puts nothing back
        ("model = KimiModel(config)\n" + _LOOP.format(over="model") + "\nmodel.half()", True),
        ("model = KimiModel(config)\nmodel.half()\n" + _LOOP.format(over="other"), True),
    ],
)
def test_a_cast_followed_by_a_restore_of_its_gate_buffers(use: str, reported: bool) -> None:
    text = (_RESTORER + use).lstrip("\n")
    rows = _rows(text)
    cast_row = next(n for n, line in enumerate(text.splitlines(), 1) if "half()" in line)
    assert rows == ([cast_row] if reported else [])


def test_a_buffer_loop_over_a_part_of_a_module_without_gate_buffer_classes() -> None:
    # a loop that casts each buffer of `block.attn.kv_cache` (a class of another module), in a
    # module whose own classes register no gate buffer: nothing to report, and no error
    source = """
        import torch
        from torch import nn


        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.transformer = nn.ModuleDict(dict(h=nn.ModuleList()))

            def export(self, dtype):
                tensors = {}
                for i, block in enumerate(self.transformer.h):
                    for name, buffer in block.attn.kv_cache.named_buffers():
                        if dtype is not None and buffer.is_floating_point():
                            buffer = buffer.to(dtype)
                        tensors[f"{i}.{name}"] = buffer
                return tensors


        def gate_ring(cache):
            return cache.g_cache
        """
    assert Linter().check(textwrap.dedent(source), "model.py") == []


def test_a_setup_that_runs_after_the_cast_installs_a_float32_gate_buffer() -> None:
    source = """
        import torch
        from torch import nn


        class Cache(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.cache = None

            def set_cache(self):
                self.cache = Cache()


        def build():
            draft = Model()
            draft = draft.half()  # no cache yet: the one set up next is float32
            draft.set_cache()
            model = Model()
            model.set_cache()
            model = model.half()
            return draft, model
        """
    found = Linter().check(textwrap.dedent(source).lstrip("\n"), "model.py")
    assert [(f.location.row, f.code) for f in found] == [(26, "RL004")]
