from .mapping import ShardedObject, ShardedStateDict, ShardedTensor
from .serialization import load, load_common_state_dict, save

__all__ = ["ShardedObject", "ShardedStateDict", "ShardedTensor", "load", "load_common_state_dict", "save"]
