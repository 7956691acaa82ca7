from fs_kda.modules.kimi_delta_attention import KernelRings, KimiDeltaAttention, LayerShape
from fs_kda.modules.slot_state_pool import LayerSlotCache, SlotStatePool, SwapEntry

__all__ = [
    "KernelRings",
    "KimiDeltaAttention",
    "LayerShape",
    "LayerSlotCache",
    "SlotStatePool",
    "SwapEntry",
]
