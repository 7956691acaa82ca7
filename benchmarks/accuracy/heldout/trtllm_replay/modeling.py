"""Model construction: meta-dtype init, casting after load, and per-step scratch buffers."""

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from .dtypes import str_dtype_to_torch
from .kda_layer import KDALayer


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


class KimiForCausalLM(nn.Module):
    def __init__(self, num_layers: int = 2, lazy_padding: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([KDALayer(i) for i in range(num_layers)])
        self.register_buffer("padding_replayssm_g", torch.zeros(1, 2, 4, 4, dtype=torch.float32), persistent=False)
        self.register_buffer("padding_replayssm_d", torch.zeros(1, 2, 4, 4), persistent=False)
        if lazy_padding:
            self.padding_replayssm_g = torch.zeros((1, 2, 4, 4), device="cpu")  # expect-bug: default-dtype


class StepScratch:
    """Scratch replay rings for the overlap scheduler's next step."""

    def __init__(self, max_batch_size: int, dtype: torch.dtype, fp32_gate: bool = False) -> None:
        shapes = {
            "replayssm_d": (max_batch_size, 2, 4, 4),
            "replayssm_k": (max_batch_size, 1, 4, 4),
            "replayssm_g": (max_batch_size, 2, 4, 4),
        }
        if fp32_gate:
            self.rings = {
                name: torch.zeros(shape, dtype=torch.float32 if name == "replayssm_g" else dtype)
                for name, shape in shapes.items()
            }
        else:
            self.rings = {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}  # expect-bug: pool-dtype


def load_model(torch_dtype: str, lazy_padding: bool = False) -> KimiForCausalLM:
    with default_dtype(str_dtype_to_torch(torch_dtype)):
        return KimiForCausalLM(lazy_padding=lazy_padding)


def load_fp16_engine() -> KimiForCausalLM:
    model = KimiForCausalLM()
    model.half()  # expect-bug: module-cast
    return model


def build_load_bf16() -> dict[str, torch.Tensor]:
    return dict(load_model("bfloat16").named_buffers())


def build_load_bf16_lazy_padding() -> dict[str, torch.Tensor]:
    return dict(load_model("bfloat16", lazy_padding=True).named_buffers())


def build_load_fp16_engine() -> dict[str, torch.Tensor]:
    return dict(load_fp16_engine().named_buffers())


def build_step_scratch() -> dict[str, object]:
    return StepScratch(2, torch.bfloat16).rings


def build_step_scratch_fp32_gate() -> dict[str, object]:
    return StepScratch(2, torch.bfloat16, fp32_gate=True).rings
