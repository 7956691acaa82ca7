from .ragged_manager import DSStateManager
from .ragged_wrapper import BlockedAllocator, DSSequenceDescriptor, RaggedBatchWrapper
from .ssm_cache import BlockedSSMCache, LayerRings

__all__ = ["BlockedAllocator", "BlockedSSMCache", "DSSequenceDescriptor", "DSStateManager", "LayerRings", "RaggedBatchWrapper"]
