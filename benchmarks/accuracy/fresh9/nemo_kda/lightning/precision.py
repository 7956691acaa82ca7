"""``MegatronMixedPrecision`` and the ``trainer.precision`` helpers ("32", "16-mixed", "bf16-mixed", "*-true")."""

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..collections.llm.modules import Float16Module, KDABlock, KDAConfig, PinnedKDAMixer

_PRECISION_TO_DTYPE = {"32": torch.float32, "32-true": torch.float32, "16-mixed": torch.float16,
                       "16-true": torch.float16, "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16}

# (ring, gate, checkpoint state) dtypes of the ReplaySSM decode state for each trainer precision
STATE_DTYPES = {
    "32": (torch.float32, torch.float32, torch.float32),
    "bf16-mixed": (torch.bfloat16, torch.float32, torch.float32),
    "16-mixed": (torch.float16, torch.float16, torch.float32),  # expect-bug: imported-policy id=state-table
}

def torch_dtype_from_precision(precision: str | int, megatron_amp_O2: bool = True) -> torch.dtype:
    """The parameter/activation dtype of a ``trainer.precision`` value (O1 keeps fp32 parameters)."""
    if str(precision).endswith("-mixed") and not megatron_amp_O2:
        return torch.float32
    if str(precision) not in _PRECISION_TO_DTYPE:
        raise ValueError(f"Could not parse the precision of `{precision}` to a valid torch.dtype")
    return _PRECISION_TO_DTYPE[str(precision)]

@dataclass
class DtypeConfig:
    fp16: bool = False
    bf16: bool = False
    params_dtype: torch.dtype = torch.float32
    autocast_dtype: torch.dtype = torch.float32

def _convert_fp_tensors(data, dtype: torch.dtype):
    if isinstance(data, torch.Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    return {key: _convert_fp_tensors(value, dtype) for key, value in data.items()} if isinstance(data, dict) else data

class MegatronMixedPrecision:
    def __init__(self, precision: str, params_dtype: torch.dtype | None = None) -> None:
        self.precision, dtype = str(precision), torch_dtype_from_precision(precision)
        self.dtype_config = DtypeConfig(fp16=dtype == torch.float16, bf16=dtype == torch.bfloat16,
                                        params_dtype=params_dtype or dtype, autocast_dtype=dtype)

    def convert_config(self, config: KDAConfig) -> KDAConfig:
        config.fp16, config.bf16 = self.dtype_config.fp16, self.dtype_config.bf16
        config.params_dtype = self.dtype_config.params_dtype
        return config

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Wraps the model in ``Float16Module`` for half precisions, as ``MegatronStrategy`` does."""
        if self.dtype_config.fp16 or self.dtype_config.bf16:
            return Float16Module(self.convert_config(module.config), module)
        return module

    def convert_input(self, data):
        """Casts the floating-point tensors of a batch (a tensor or a dict) to the autocast dtype."""
        return _convert_fp_tensors(data, self.dtype_config.autocast_dtype)

    @contextmanager
    def module_init_context(self):
        """``*-true`` precisions create the parameters directly in the target dtype."""
        previous = torch.get_default_dtype()
        if self.precision.endswith("-true"):
            torch.set_default_dtype(self.dtype_config.params_dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

class Trainer:  # the part of ``lightning.Trainer`` the models read
    def __init__(self, precision: str = "bf16-mixed", plugins: MegatronMixedPrecision | None = None) -> None:
        self.precision = str(precision)
        self.precision_plugin = plugins or MegatronMixedPrecision(self.precision)

def build_convert_module() -> dict:
    """A KDA block and a block of pinned mixers, both converted by the bf16 plugin, after two decode steps."""
    plugin = MegatronMixedPrecision("bf16-mixed")
    model = plugin.convert_module(KDABlock(plugin.convert_config(KDAConfig())))
    pinned = plugin.convert_module(KDABlock(plugin.convert_config(KDAConfig()), PinnedKDAMixer))
    slots, write_pos = torch.tensor([1, 0], dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    hidden = torch.randn(2, model.config.hidden_size)
    for _ in range(2):
        hidden = pinned(model(hidden, slots, write_pos), slots, write_pos)
        write_pos += 1
    return {"model": model, "pinned": pinned, "hidden": hidden}
