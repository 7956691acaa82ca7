from .dataclasses import OFFLOAD_INDEX_NAME, PRECISION_TO_DTYPE, WEIGHTS_NAME, ReplayCacheKwargs
from .modeling import (
    get_ring_dtype,
    get_torch_dtype,
    load_checkpoint_in_model,
    materialize_meta_buffers,
    set_module_tensor_to_device,
)
from .offload import DiskCacheSwapper, OffloadedWeightsLoader, load_offloaded_weight, offload_weight
from .operations import send_to_device
