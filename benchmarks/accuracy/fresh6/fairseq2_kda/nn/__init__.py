from .incremental_state import IncrementalState, IncrementalStateBag, ReplayRingState, ReplayStatePool
from .kda import KimiDeltaAttention, get_decode_op, kda_replayssm_decode
