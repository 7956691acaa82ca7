from .amp import amp_autocast_factory, resolve_amp_dtype, resolve_dtype, ring_dtypes_for_amp
from .cuda import NativeScaler, StaticDecodeBuffers, dispatch_clip_grad
from .model_ema import ModelEmaV3
