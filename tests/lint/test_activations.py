"""Gate caches computed from a model's activations (``dataflow/activations.py``) and the operands
that never promote them (``dataflow/scalars.py``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from project_support import lint_in_project

from replaylint.lint.config.settings import Settings
from replaylint.lint.engine import Linter


def _rows(source: str) -> list[tuple[int, str]]:
    linter = Linter(Settings())
    text = textwrap.dedent(source).lstrip("\n")
    return [(f.location.row, f.code) for f in linter.check(text, "m.py")]


def _fixed(source: str) -> str:
    text = textwrap.dedent(source).lstrip("\n")
    return Linter().fix(text, "m.py", unsafe=True).source


_LAYER = """
import torch
import torch.nn.functional as F
from torch import nn
from dataclasses import dataclass

DEFAULT_BOUND = -5.0


@dataclass
class GateConfig:
    gate_lower_bound: float | None = None
    normalizer: float = 16.0


class Gate(nn.Module):
    def __init__(self, config: GateConfig, dim: int):
        super().__init__()
        self.f_proj = nn.Linear(dim, dim)
        self.lower_bound = config.gate_lower_bound
        self.register_buffer("normalizer", torch.tensor(config.normalizer), persistent=False)
        self.register_buffer("scale", torch.ones(dim, dtype=torch.float32), persistent=False)

    def forward(self, hidden):
        {line}
"""


@pytest.mark.parametrize(
    ("line", "flagged"),
    [
        # a 0-dim buffer does not promote a dimensioned tensor
        ("self.g_cache = F.logsigmoid(self.f_proj(hidden)) / self.normalizer", True),
        # a field annotated as a number, through the instance
        ("self.g_cache = self.lower_bound * torch.sigmoid(self.f_proj(hidden))", True),
        # `x or DEFAULT`: a number
        (
            "self.g_cache = (self.lower_bound or DEFAULT_BOUND) * self.f_proj(hidden).sigmoid()",
            True,
        ),
        # a forward argument is an activation, views and indexing keep its dtype
        ("self.g_cache = -F.softplus(hidden.transpose(0, 1)[None])", True),
        # a float32 buffer with dimensions promotes the result
        ("self.g_cache = self.scale * torch.sigmoid(self.f_proj(hidden))", False),
        # cast before the gate math
        ("self.g_cache = F.logsigmoid(self.f_proj(hidden).float()) / self.normalizer", False),
        # cast after it
        ("self.g_cache = (self.lower_bound * self.f_proj(hidden).sigmoid()).float()", False),
        # nothing computed: a layer's output stored as it is is not judged here
        ("self.g_cache = self.f_proj(hidden).view(2, -1)", False),
    ],
)
def test_a_gate_cache_computed_from_activations(line: str, flagged: bool) -> None:
    rows = _rows(_LAYER.format(line=line))
    assert (rows == [(24, "RL003")]) if flagged else rows == []


def test_the_finding_is_where_a_method_computes_the_values() -> None:
    source = """
        import torch
        from torch import nn


        class Mixer(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.in_proj = nn.Linear(dim, 3 * dim)

            def _log_decay(self, gate_logits):
                gate_logits = gate_logits.unflatten(-1, (2, -1))
                return 0.5 * torch.sigmoid(gate_logits)

            def _states(self, log_decay):
                g_cache = log_decay[-4:].permute(1, 0, 2, 3).contiguous()
                return g_cache

            def forward(self, hidden):
                q, gate_logits, beta = self.in_proj(hidden).split([4, 4, 4], dim=-1)
                return self._states(self._log_decay(gate_logits))
        """
    assert _rows(source) == [(12, "RL003")]
    # the cast goes where the value becomes the gate cache: other uses keep their values
    assert "g_cache = log_decay[-4:].permute(1, 0, 2, 3).contiguous().to(torch.float32)" in (
        _fixed(source)
    )


def test_an_argument_is_an_activation_only_where_the_module_passes_activations() -> None:
    # the module's only call passes a fresh float32 allocation: nothing to report
    source = """
        import torch

        def ring_from(logits):
            g_cache = torch.sigmoid(logits) * 0.5
            return g_cache

        ring = ring_from(torch.zeros(4, 16, dtype=torch.float32))
        """
    assert _rows(source) == []
    # a function nobody in the module calls: its argument's dtype is not known
    assert _rows(source.replace("ring = ring_from(", "ring = print(")) == []


def test_a_method_that_computes_from_what_its_caller_passes_is_reported_inside() -> None:
    # the call passes bf16 data; the missing cast is in the method, whoever calls it
    source = """
        import torch
        from torch import nn


        class Attention(nn.Module):
            def gate_ring(self, gate_logits: torch.Tensor) -> torch.Tensor:
                return -5.0 * torch.sigmoid(gate_logits[:, -4:])


        def make() -> Attention:
            return Attention()


        def build():
            return {"g_cache": make().gate_ring(torch.randn(2, 6).to(torch.bfloat16))}
        """
    assert _rows(source) == [(7, "RL003")]


def test_a_ring_passed_in_unchanged_is_not_an_activation() -> None:
    source = """
        import torch
        from torch import nn


        class Cache(nn.Module):
            def __init__(self, d_cache, k_cache, g_cache):
                super().__init__()
                self.d_cache, self.k_cache = d_cache, k_cache
                self.g_cache = g_cache

            def forward(self, g):
                self.g_cache = g.clone()
        """
    findings = Linter().check(textwrap.dedent(source).lstrip("\n"), "m.py")
    # the constructor's ring is checked where it is made; the clone is RL003's copy finding
    assert [(f.location.row, f.code) for f in findings] == [(12, "RL003")]
    assert "a clone of `g`" in findings[0].message


_WEIGHTS = """
import torch
import torch.nn.functional as F
from torch import nn


class Gate(nn.Module):
    def __init__(self, dim, dtype=None, checkpoint=None):
        super().__init__()
        self.f_proj = nn.Linear(dim, dim, dtype=dtype)
        self.A_log = {a_log}
        self.dt_bias = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def seed(self, logits, rings):
        rings.g_cache = {line}
"""


@pytest.mark.parametrize(
    ("a_log", "line", "flagged"),
    [
        # a weight made in the model's dtype, combined with activations
        (
            "nn.Parameter(torch.empty(dim, dtype=dtype))",
            "-self.A_log.exp() * F.softplus(self.f_proj(logits) + self.dt_bias)",
            True,
        ),
        # torch's default dtype in a module's code is the model's too; a buffer counts as well
        ("nn.Buffer(torch.ones(dim))", "-torch.exp(self.A_log) * self.f_proj(logits)", True),
        # weights alone, with no elementwise function in between
        ("nn.Parameter(torch.empty(dim, dtype=dtype))", "self.A_log * self.dt_bias", True),
        # a float32 weight with dimensions promotes the product to float32
        (
            "nn.Parameter(torch.zeros(dim, dtype=torch.float32))",
            "-self.A_log.exp() * F.softplus(self.f_proj(logits))",
            False,
        ),
        # a weight loaded as stored: a checkpoint may keep it float32
        (
            "nn.Parameter(torch.load(checkpoint)['A_log'])",
            "-self.A_log.exp() * F.softplus(self.f_proj(logits))",
            False,
        ),
        # cast before the gate math
        (
            "nn.Parameter(torch.empty(dim, dtype=dtype))",
            "-self.A_log.float().exp() * F.softplus(self.f_proj(logits).float())",
            False,
        ),
        # not a weight: an attribute the class sets to something else
        ("checkpoint", "-self.A_log.exp() * F.softplus(self.f_proj(logits))", False),
    ],
)
def test_a_gate_cache_computed_from_the_modules_weights(
    a_log: str, line: str, flagged: bool
) -> None:
    rows = _rows(_WEIGHTS.format(a_log=a_log, line=line))
    # one finding for the whole expression, not one per operand
    assert (rows == [(14, "RL003")]) if flagged else rows == []


def test_a_finding_on_weights_names_them_and_casts_where_the_gate_cache_is_set() -> None:
    source = _WEIGHTS.format(
        a_log="nn.Parameter(torch.empty(dim, dtype=dtype))",
        line="-self.A_log.exp() * F.softplus(self.f_proj(logits))",
    )
    (finding,) = Linter().check(textwrap.dedent(source).lstrip("\n"), "m.py")
    assert "`self.A_log`, a weight of `Gate`" in finding.message
    assert "`self.f_proj(logits)`, a layer's output" in finding.message
    assert (
        "rings.g_cache = (-self.A_log.exp() * F.softplus(self.f_proj(logits))).to(torch.float32)"
    ) in _fixed(source)


def test_a_name_guessed_from_its_neighbours_does_not_make_a_computed_value_a_ring() -> None:
    # `log_decay` is named like the gate ring `decay_buffer` beside `delta` and `key`; here it is
    # a forward's output, in the model's dtype until something stores it
    source = """
        import torch
        import torch.nn.functional as F
        from torch import nn


        class Attention(nn.Module):
            def __init__(self, dim, dtype=None):
                super().__init__()
                self.a_proj = nn.Linear(dim, dim, dtype=dtype)
                self.A_log = nn.Parameter(torch.empty(dim, dtype=dtype))
                self.register_buffer("delta_buffer", torch.zeros(2, dim, dtype=dtype))
                self.register_buffer("key_buffer", torch.zeros(2, dim, dtype=dtype))
                self.register_buffer("decay_buffer", torch.zeros(2, dim, dtype=torch.float32))

            def forward(self, x, out, slots, pos):
                kda_replayssm_decode(x, d_cache=self.delta_buffer, k_cache=self.key_buffer,
                                     g_cache=self.decay_buffer, out=out, ssm_state_indices=slots)

            def window(self, hidden, delta, key):
                log_decay = -self.A_log.exp() * F.softplus(self.a_proj(hidden))
                return delta, key, log_decay
        """

    def rows(text: str) -> list[tuple[int, str]]:
        linter = Linter(Settings())
        text = textwrap.dedent(text).lstrip("\n")
        linter.learn([("m.py", text)])  # `decay_buffer` is the gate ring
        return [(f.location.row, f.code) for f in linter.check(text, "m.py")]

    assert rows(source) == []
    # the same computation stored under a name that means the ring is reported
    stored = source.replace("return delta, key, log_decay", "self.g_cache = log_decay")
    assert rows(stored) == [(20, "RL003")]


_UPCAST_ELSEWHERE = """
import torch
import torch.nn.functional as F
from torch import nn


class Gate(nn.Module):
    def __init__(self, dim, checkpoint):
        super().__init__()
        self.w_a = nn.Parameter(torch.load(checkpoint)["w_a"])
        self.A_log = {a_log}

    def exact(self, x):
        return -self.A_log.float().exp() * F.softplus((x @ self.w_a).float())

    def forward(self, x, rings):
        rings.g_cache = {line}
"""


@pytest.mark.parametrize(
    ("a_log", "line", "flagged"),
    [
        # float32 where it is made, yet the class upcasts it in `exact`: a model cast elsewhere
        # (or a checkpoint) leaves it in the model's dtype, and the fast path forgets the cast
        (
            "nn.Parameter(torch.zeros(dim, dtype=torch.float32))",
            "-self.A_log.exp() * F.softplus(x @ self.w_a)",
            True,
        ),
        (
            "nn.Parameter(torch.load(checkpoint)['A_log'])",
            "-self.A_log.exp() * (x @ self.w_a)",
            True,
        ),
        # the fast path keeps the cast
        (
            "nn.Parameter(torch.zeros(dim, dtype=torch.float32))",
            "-self.A_log.float().exp() * F.softplus((x @ self.w_a).float())",
            False,
        ),
    ],
)
def test_a_weight_the_class_upcasts_elsewhere_is_in_the_models_dtype(
    a_log: str, line: str, flagged: bool
) -> None:
    # `x @ self.w_a`: a matrix product has its operands' one dtype, so `x` tells it
    rows = _rows(_UPCAST_ELSEWHERE.format(a_log=a_log, line=line))
    assert (rows == [(16, "RL003")]) if flagged else rows == []


def test_a_weight_a_helper_of_the_module_upcasts_is_in_the_models_dtype() -> None:
    source = """
import torch
import torch.nn.functional as F
from torch import nn


def exact_gate(a, A_log):
    return -A_log.float().exp() * F.softplus(a.float())


class Gate(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.A_log = nn.Parameter(torch.zeros(dim, dtype=torch.float32))
        self.f_proj = nn.Linear(dim, dim)

    def forward(self, x, rings, exact):
        if exact:
            rings.g_cache = exact_gate(self.f_proj(x), self.A_log)
        else:
            rings.g_cache = -self.A_log.exp() * F.softplus(self.f_proj(x))
"""
    assert _rows(source) == [(20, "RL003")]  # the fast branch; the helper casts


_SEED = """
import torch
from torch import nn


class Seeder(nn.Module):
    def __init__(self, config, checkpoint):
        super().__init__()
        self.config = config
        self.w_a = nn.Parameter(torch.load(checkpoint)["w_a"])

    def seed(self, hidden, rings):
        a = hidden[0] @ self.w_a.T
        rings.g_cache = {line}
"""


@pytest.mark.parametrize(
    ("line", "flagged"),
    [
        # a product with one of the module's weights is a layer's output, whatever the
        # argument is; a setting of the config is a number
        ("self.config.gate_lower_bound * torch.sigmoid(a)", True),
        ("-torch.nn.functional.softplus(a.t())", True),
        ("self.config.gate_lower_bound * torch.sigmoid(a.float())", False),
        # a ring the caller passes is judged where it is made
        ("rings.g_cache * 0.5", False),
    ],
)
def test_a_product_with_a_weight_is_an_activation(line: str, flagged: bool) -> None:
    rows = _rows(_SEED.format(line=line))
    assert (rows == [(13, "RL003")]) if flagged else rows == []


def test_a_ring_named_by_a_records_fields_is_checked_where_it_is_handed_on() -> None:
    # `decay` is the gate ring by its place after `d` and `k` in the record's fields; a local of
    # that name is not checked where it is computed, but where it becomes the record's field
    source = """
        import torch
        from typing import NamedTuple
        from torch import nn


        class Seed(NamedTuple):
            d: torch.Tensor
            k: torch.Tensor
            decay: torch.Tensor


        class Layer(nn.Module):
            def forward(self, hidden, g_cache):
                decay = 0.5 * torch.sigmoid(hidden)
                {handed_on}
        """

    def rows(handed_on: str) -> list[tuple[int, str]]:
        text = textwrap.dedent(source.replace("{handed_on}", handed_on)).lstrip("\n")
        linter = Linter(Settings())
        linter.learn([("m.py", text)])
        return [(f.location.row, f.code) for f in linter.check(text, "m.py")]

    assert rows("return Seed(d=hidden, k=hidden, decay=decay)") == [(14, "RL003")]
    assert rows("return Seed(d=hidden, k=hidden, decay=decay.float())") == []
    assert rows("return hidden, hidden, decay") == []


_KERNELS = """
import torch.nn.functional as F


def exact_log_decay(a, A_log):
    return -A_log.float().exp() * F.softplus(a.float())


def log_decay(a, A_log, lower_bound=None):
    return exact_log_decay(a, A_log) if lower_bound is None else lower_bound * a.sigmoid()
"""

_MODEL = """
import torch
import torch.nn.functional as F
from torch import nn

from .kernels import {helper}


class Gate(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.a_proj = nn.Linear(dim, dim)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, dim, dtype=torch.float32)))

    def forward(self, x, rings):
        rings.g_cache = {helper}(self.a_proj(x), self.A_log).float()

    def fast(self, x, rings):
        rings.g_cache = -self.A_log.exp() * F.softplus(self.a_proj(x))
"""


@pytest.mark.parametrize("helper", ["exact_log_decay", "log_decay"])
def test_a_weight_a_function_of_another_module_upcasts_is_in_the_models_dtype(
    tmp_path: Path, helper: str
) -> None:
    # made float32, but handed to a kernel helper that widens it (directly, or through another
    # function of its module): the class expects it in the model's dtype at run time
    files = {
        "pkg/__init__.py": "",
        "pkg/kernels.py": _KERNELS,
        "pkg/model.py": _MODEL.format(helper=helper),
    }
    rows = [(f.location.row, f.code) for f in lint_in_project(tmp_path, files, "pkg/model.py")]
    assert rows == [(18, "RL003")]
    # a helper that does not widen it says nothing: the float32 weight promotes the product
    files["pkg/kernels.py"] = _KERNELS.replace("A_log.float()", "A_log")
    assert lint_in_project(tmp_path, files, "pkg/model.py") == []


def test_a_view_of_a_weight_handed_to_a_widening_function_marks_the_weight(
    tmp_path: Path,
) -> None:
    # `A_log = self.A_log.view(-1)` passed to the widening helper: the class still expects
    # `self.A_log` in the model's dtype
    model = _MODEL.format(helper="exact_log_decay").replace(
        "rings.g_cache = exact_log_decay(self.a_proj(x), self.A_log).float()",
        "A_log = self.A_log.view(-1)\n        rings.g_cache = exact_log_decay(self.a_proj(x), A_log).float()",
    )
    files = {"pkg/__init__.py": "", "pkg/kernels.py": _KERNELS, "pkg/model.py": model}
    rows = [(f.location.row, f.code) for f in lint_in_project(tmp_path, files, "pkg/model.py")]
    assert rows == [(19, "RL003")]
    # a local that is rebound to something else is not a view of the weight
    rebound = model.replace(
        "A_log = self.A_log.view(-1)\n", "A_log = self.A_log.view(-1)\n        A_log = x\n"
    )
    files["pkg/model.py"] = rebound
    assert lint_in_project(tmp_path, files, "pkg/model.py") == []


def test_values_written_into_the_ring_are_checked_for_the_models_dtype() -> None:
    source = """
        import torch.nn.functional as F
        from torch import nn


        class Draft(nn.Module):
            normalizer = 16.0

            def __init__(self, dim):
                super().__init__()
                self.f_proj = nn.Linear(dim, dim)

            def gate(self, hidden):
                return F.logsigmoid(self.f_proj(hidden)) / self.normalizer

            def step(self, hidden, slot, t):
                self.g_cache[slot, :, t] = self.gate(hidden)
                self.g_cache[slot].copy_(F.logsigmoid(self.f_proj(hidden)))
                self.g_cache[slot].index_copy_(0, t, self.f_proj(hidden).sigmoid())
        """
    assert _rows(source) == [(13, "RL003"), (17, "RL003"), (18, "RL003")]
    # computed in float32: the copy writes what was computed
    assert _rows(source.replace("(hidden)", "(hidden).float()")) == []
    # a class constant that is a tensor may promote: not a number
    assert _rows(source.replace("normalizer = 16.0", "normalizer = torch.ones(1)")) == [
        (17, "RL003"),
        (18, "RL003"),
    ]


def test_an_element_a_method_of_the_module_returns_is_followed() -> None:
    # `a, beta = self.project(x)`: `a` is what `project` returns in that place, a layer's output
    source = """
        import torch
        import torch.nn.functional as F
        from torch import nn


        class Block(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.a_proj = nn.Linear(dim, dim)

            def project(self, x):
                return self.a_proj(x), self.a_proj(x).sigmoid()

            def seed(self, hidden, rings):
                a, beta = self.project(hidden)
                rings.g_cache = -F.softplus(a)
        """
    assert _rows(source) == [(16, "RL003")]
    assert _rows(source.replace("-F.softplus(a)", "-F.softplus(a.float())")) == []


def test_a_number_set_with_another_attribute_in_one_statement_is_a_number() -> None:
    source = """
        import torch.nn.functional as F
        from torch import nn


        class Gate(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.w = nn.Linear(dim, dim)
                self.normalizer, self.scale = 16.0, dim**-0.5

            def seed(self, x, rings):
                rings.g_cache = F.logsigmoid(self.w(x)) / self.normalizer
        """
    assert _rows(source) == [(12, "RL003")]


_MODEL_OBJECTS = """
import torch
import torch.nn.functional as F
from torch import nn


class KDAAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dim: int) -> None:
        super().__init__()
        self.a_proj = nn.Linear(hidden, heads * dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.dt_bias = nn.Parameter(torch.zeros(heads * dim))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([KDAAttention(8, 2, 4) for _ in range(2)])


def seed(model{annotation}, hidden, d_cache, k_cache):
    for attn in model.layers:
        {line}
        fused_recurrent_kda_replayssm_decode(d_cache=d_cache, k_cache=k_cache, g_cache=log_decay)
"""


@pytest.mark.parametrize("annotation", [": Model", ""])
@pytest.mark.parametrize(
    ("line", "flagged"),
    [
        # weights and a layer of another module object: the model's dtype
        ("log_decay = -attn.A_log.exp() * F.softplus(attn.a_proj(hidden) + attn.dt_bias)", True),
        # every operand cast first: float32
        (
            "log_decay = -attn.A_log.float().exp() * F.softplus("
            "attn.a_proj(hidden).float() + attn.dt_bias.float())",
            False,
        ),
        # the result cast: float32
        (
            "log_decay = (-attn.A_log.exp() * F.softplus(attn.a_proj(hidden) + attn.dt_bias))"
            ".float()",
            False,
        ),
    ],
)
def test_weights_and_layers_of_other_model_objects(
    annotation: str, line: str, *, flagged: bool
) -> None:
    source = _MODEL_OBJECTS.replace("{annotation}", annotation).replace("{line}", line)
    assert _rows(source) == ([(22, "RL003")] if flagged else [])


def test_a_method_of_an_unknown_object_is_not_a_layer() -> None:
    # `store.read(x)` is no projection: what it returns is not known to be an activation
    source = """
    import torch
    import torch.nn.functional as F

    def seed(store, hidden, d_cache, k_cache):
        log_decay = -store.A_log.exp() * F.softplus(store.read(hidden))
        fused_recurrent_kda_replayssm_decode(d_cache=d_cache, k_cache=k_cache, g_cache=log_decay)
    """
    assert _rows(source) == []


@pytest.mark.parametrize("named", [False, True])
def test_padding_made_like_an_activation_is_one_finding_at_the_join(*, named: bool) -> None:
    join = (
        "pad = step.new_zeros(4, 4)\n        ring = torch.cat([step, pad], dim=1)"
        if named
        else "ring = torch.cat([step, step.new_zeros(4, 4)], dim=1)"
    )
    source = """
    import torch
    import torch.nn.functional as F

    def prefill(attn, hidden, d_cache, k_cache):
        mixed, a, b = attn.project(hidden)
        step = -attn.A_log.exp()[:, None] * F.softplus(a + attn.dt_bias)
        {join}
        fused_recurrent_kda_replayssm_decode(d_cache=d_cache, k_cache=k_cache, g_cache=ring)
    """.replace("{join}", join)
    assert _rows(source) == [(8 if named else 7, "RL003")]


def test_a_computed_ring_is_reported_where_it_is_formed() -> None:
    source = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a_proj = nn.Linear(8, 8)
            self.A_log = nn.Parameter(torch.zeros(8))

        def step(self, hidden, filled, d_cache, k_cache):
            step = -self.A_log.exp() * F.softplus(self.a_proj(hidden))
            log_gate = torch.where(filled, step, torch.tensor(0.0))
            fused_recurrent_kda_replayssm_decode(d_cache=d_cache, k_cache=k_cache, g_cache=log_gate)
    """
    assert _rows(source) == [(13, "RL003")]
    fixed = _fixed(source)
    assert "g_cache=log_gate.to(torch.float32)" in fixed
    assert _rows(fixed) == []


_HELD_MIXER = """
import torch
import torch.nn.functional as F
from torch import nn


class Mixer(nn.Module):
    def __init__(self, dim, lower_bound=None):
        super().__init__()
        self.a_proj = nn.Linear(dim, dim)
        self.A_log = nn.Parameter(torch.zeros(dim))
        self.lower_bound = lower_bound

    def prompt_log_decay(self, a):
        bound = self.lower_bound if self.lower_bound is not None else -8.0
        return bound * torch.sigmoid(self.A_log.exp() * a)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.mixer = Mixer(dim)
        self.register_buffer("g_cache", torch.zeros(2, 2, dim, dtype=torch.float32))

    def prefill(self, x, steps):
        parts = []
        for _ in range(steps):
            log_decay = self.mixer.prompt_log_decay(self.mixer.a_proj(x))
            parts.append(F.pad(log_decay.transpose(0, 1), (0, 1)))
        self.g_cache = torch.stack(parts)
"""


def test_a_method_of_a_held_module_and_a_list_of_its_results_keep_the_model_dtype() -> None:
    # `self.mixer` holds a `Mixer`: its method's result, padded and appended, is stacked into the
    # ring; `lower_bound=None` is a bound, a number
    assert _rows(_HELD_MIXER) == [(15, "RL003")]


def test_a_list_read_elsewhere_is_not_followed() -> None:
    source = _HELD_MIXER.replace(
        "        self.g_cache = torch.stack(parts)",
        "        self.history = parts\n        self.g_cache = torch.stack(parts)",
    )
    assert _rows(source) == []
