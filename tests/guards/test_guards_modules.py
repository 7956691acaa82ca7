"""keep_fp32_gate_caches and the KeepFp32GateCaches mixin: module casts keep gate caches float32."""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from replaylint.guards import (  # noqa: E402
    GateCacheDtypeError,
    KeepFp32GateCaches,
    assert_fp32_gate_caches,
    find_gate_caches,
    keep_fp32_gate_caches,
)

F32 = torch.float32
BF16 = torch.bfloat16
HAS_BUFFER = hasattr(nn, "Buffer")


class Attention(nn.Module):
    """Every way a module can hold a gate cache, next to ordinary weights and state."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("g_cache", torch.full((2, 4), 0.1))  # persistent buffer
        self.register_buffer("conv_state", torch.zeros(2, 4))  # not a gate cache
        self.register_buffer("layer_gate_cache", torch.full((2, 4), 0.2), persistent=False)
        self.replayssm_g = nn.Parameter(torch.full((4,), 0.3))
        self.step_count = torch.zeros((), dtype=torch.int64)  # plain attribute, not a gate cache
        self._g_cache = torch.full((3,), 0.4)  # plain tensor attribute
        if HAS_BUFFER:
            self.kv_g_cache = nn.Buffer(torch.full((2,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        decay = torch.exp(self.g_cache.cumsum(-1)).to(x.dtype)
        return self.proj(x) * decay[0]


class Model(nn.Module):
    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleDict({"attn": Attention()}) for _ in range(layers))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer["attn"](x)
        return self.head(x)


GATE_CACHES = ["g_cache", "layer_gate_cache", "replayssm_g", "_g_cache"] + (
    ["kv_g_cache"] if HAS_BUFFER else []
)


def gate_dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    return {found.path: found.dtype for found in find_gate_caches(model)}


def assert_kept(model: nn.Module, other: torch.dtype) -> None:
    assert_fp32_gate_caches(model)
    attn = model.layers[3]["attn"]
    assert attn.proj.weight.dtype is other
    assert attn.conv_state.dtype is other
    assert model.head.weight.dtype is other
    assert attn.step_count.dtype is torch.int64


CASTS: dict[str, Callable[[nn.Module], Any]] = {
    "to(bfloat16)": lambda m: m.to(BF16),
    "to(dtype=float16)": lambda m: m.to(dtype=torch.float16),
    "half()": lambda m: m.half(),
    "bfloat16()": lambda m: m.bfloat16(),
    "double()": lambda m: m.double(),
    "type(float16)": lambda m: m.type(torch.float16),
    "to(cpu, bfloat16)": lambda m: m.to("cpu", BF16),
}
CAST_DTYPES = {
    "to(bfloat16)": BF16,
    "to(dtype=float16)": torch.float16,
    "half()": torch.float16,
    "bfloat16()": BF16,
    "double()": torch.float64,
    "type(float16)": torch.float16,
    "to(cpu, bfloat16)": BF16,
}


def test_without_protection_the_casts_turn_gate_caches_bf16() -> None:
    model = Model().to(BF16)
    wrong = {path: dtype for path, dtype in gate_dtypes(model).items() if dtype is not F32}
    assert "model.layers.3.attn.g_cache" in wrong
    with pytest.raises(GateCacheDtypeError) as info:
        assert_fp32_gate_caches(model)
    assert "model.layers.3.attn.g_cache: torch.bfloat16" in str(info.value)


@pytest.mark.parametrize("cast", list(CASTS))
def test_every_cast_keeps_every_kind_of_gate_cache_float32(cast: str) -> None:
    model = keep_fp32_gate_caches(Model())
    values = {found.path: found.tensor.clone() for found in find_gate_caches(model)}
    CASTS[cast](model)
    assert_kept(model, CAST_DTYPES[cast])
    found = find_gate_caches(model)
    assert len(found) == 4 * len(GATE_CACHES)
    for entry in found:
        assert torch.equal(entry.tensor, values[entry.path])  # values exact, no round trip


def test_the_mixin_and_the_class_decorator_protect_every_instance() -> None:
    class MixedIn(KeepFp32GateCaches, Model):
        pass

    @keep_fp32_gate_caches
    class Decorated(Model):
        pass

    for cls in (MixedIn, Decorated):
        model = cls().half()
        assert_kept(model, torch.float16)
        assert isinstance(model, Model)
    assert Decorated.__name__ == "Decorated"
    assert Decorated.__qualname__.endswith("Decorated")


def test_the_instance_keeps_its_class_name_and_is_still_an_instance_of_it() -> None:
    model = keep_fp32_gate_caches(Model())
    assert isinstance(model, Model)
    assert type(model).__name__ == "Model"
    assert isinstance(model, KeepFp32GateCaches)
    assert isinstance(model.layers[0]["attn"], Attention)
    assert type(model.head) is nn.Linear  # submodules without gate caches are left alone


def test_device_moves_and_memory_formats_apply_as_usual() -> None:
    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("g_cache", torch.rand(2, 3, 4, 5))
            self.conv = nn.Conv2d(3, 3, 1)

    model = keep_fp32_gate_caches(Conv())
    before = model.g_cache.clone()
    model.to(torch.device("meta"), BF16)
    assert model.g_cache.device.type == "meta"
    assert model.g_cache.dtype is F32
    assert model.conv.weight.device.type == "meta"
    model = keep_fp32_gate_caches(Conv())
    model.g_cache.copy_(before)
    model.to(memory_format=torch.channels_last, dtype=BF16)
    assert model.g_cache.dtype is F32
    assert model.g_cache.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(model.g_cache, before)


def test_protection_converts_existing_non_float32_gate_caches_and_refuses_integer_ones() -> None:
    model = Model().to(BF16)
    keep_fp32_gate_caches(model)
    assert_kept(model, BF16)

    class Wrong(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("g_cache", torch.zeros(2, dtype=torch.int32))

    with pytest.raises(
        GateCacheDtypeError, match=r"'g_cache' \(buffer of .*Wrong\) is torch\.int32"
    ):
        keep_fp32_gate_caches(Wrong())


def test_gradients_of_gate_cache_parameters_stay_float32() -> None:
    model = keep_fp32_gate_caches(Model())
    attn = model.layers[0]["attn"]
    attn.replayssm_g.grad = torch.ones(4)
    model.half()
    assert attn.replayssm_g.dtype is F32
    assert attn.replayssm_g.grad is not None
    assert attn.replayssm_g.grad.dtype is F32
    assert attn.proj.weight.dtype is torch.float16


def test_load_state_dict_keeps_float32_also_with_assign() -> None:
    source = Model()
    state = {key: value.to(BF16) for key, value in source.state_dict().items()}
    for assign in (False, True):
        model = keep_fp32_gate_caches(Model().to(BF16))
        model.load_state_dict(state, assign=assign)
        assert_kept(model, BF16)
        attn = model.layers[2]["attn"]
        assert torch.equal(attn.g_cache, state["layers.2.attn.g_cache"].float())
        assert isinstance(attn.replayssm_g, nn.Parameter)


def test_load_state_dict_refuses_float64_gate_caches_beyond_float32() -> None:
    model = keep_fp32_gate_caches(Model())
    state = model.state_dict()
    state["layers.1.attn.g_cache"] = torch.full((2, 4), 1e300, dtype=torch.float64)
    with pytest.raises(GateCacheDtypeError, match=r"'layers\.1\.attn\.g_cache' is torch\.float64"):
        model.load_state_dict(state)


def test_state_dict_round_trips_through_a_bf16_checkpoint_and_torch_save() -> None:
    model = keep_fp32_gate_caches(Model())
    model.to(BF16)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded["layers.0.attn.g_cache"].dtype is F32
    fresh = keep_fp32_gate_caches(Model()).to(BF16)
    fresh.load_state_dict(loaded)
    assert_kept(fresh, BF16)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_protected_modules_deepcopy_and_pickle_and_stay_protected() -> None:
    model = keep_fp32_gate_caches(Model())
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert isinstance(clone, KeepFp32GateCaches)
        clone.to(BF16)
        assert_kept(clone, BF16)


def test_extra_and_replacement_names() -> None:
    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("decay_ring", torch.zeros(2))
            self.register_buffer("g_cache", torch.zeros(2))

    extended = keep_fp32_gate_caches(Custom(), extend_gate_cache_names=["decay_ring"]).half()
    assert (extended.decay_ring.dtype, extended.g_cache.dtype) == (F32, F32)
    replaced = keep_fp32_gate_caches(Custom(), gate_cache_names=["decay_ring"]).half()
    assert (replaced.decay_ring.dtype, replaced.g_cache.dtype) == (F32, torch.float16)

    class Declared(KeepFp32GateCaches, Custom):
        replaylint_extend_gate_cache_names = ("decay_*",)

    assert Declared().bfloat16().decay_ring.dtype is F32
    with pytest.raises(TypeError, match=r"list of name patterns"):
        keep_fp32_gate_caches(Custom(), extend_gate_cache_names="decay_ring")


def test_gate_caches_added_after_protection_are_kept_too() -> None:
    model = keep_fp32_gate_caches(Model(layers=1))
    model.register_buffer("late_g_cache", torch.zeros(2))
    model.layers.append(nn.ModuleDict({"attn": Attention()}))
    model.half()
    assert model.late_g_cache.dtype is F32
    assert model.layers[1]["attn"].g_cache.dtype is F32
    unprotected = Attention()
    unprotected.half()  # casting an unprotected module on its own is not covered
    assert unprotected.g_cache.dtype is torch.float16


def test_non_modules_are_refused_with_a_pointer_to_the_walker() -> None:
    with pytest.raises(TypeError, match=r"assert_fp32_gate_caches"):
        keep_fp32_gate_caches({"g_cache": torch.zeros(1)})  # type: ignore[call-overload]


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_forward_of_a_protected_module(fresh_dynamo: None) -> None:
    model = keep_fp32_gate_caches(Model())
    x = torch.ones(3, 4)
    expected = model(x)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    assert torch.allclose(compiled(x), expected)
    compiled.to(BF16)  # casting the compiled wrapper casts the module inside it
    assert_kept(model, BF16)
    assert compiled(x.to(BF16)).dtype is BF16


def test_compiled_forward_with_inductor(fresh_dynamo: None) -> None:
    model = keep_fp32_gate_caches(Model(layers=1)).to(BF16)
    out = torch.compile(model)(torch.ones(2, 4, dtype=BF16))
    assert out.dtype is BF16
    assert len(assert_fp32_gate_caches(model)) == len(GATE_CACHES)
