from fs_kda.dataclass.configs import (
    RING_PRECISION,
    IncrementalStateConfig,
    SlotPoolConfig,
    ring_precision,
)

__all__ = ["RING_PRECISION", "IncrementalStateConfig", "SlotPoolConfig", "ring_precision"]
