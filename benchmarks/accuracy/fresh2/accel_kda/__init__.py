"""accel_kda: big-model inference utilities for hybrid Kimi-Delta-Attention models (ReplaySSM decode)."""

__version__ = "0.3.0.dev0"

from .big_modeling import dispatch_model, init_empty_weights, init_on_device, load_checkpoint_and_dispatch
from .hooks import AlignDevicesHook, ModelHook, ReplayDecodeHook, add_hook_to_module
from .utils import ReplayCacheKwargs, get_torch_dtype, set_module_tensor_to_device
