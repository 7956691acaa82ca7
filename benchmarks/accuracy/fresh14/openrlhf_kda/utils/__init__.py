from .utils import convert_to_torch_dtype, get_model_dtype, get_replay_cache_dtypes, get_strategy

__all__ = ["convert_to_torch_dtype", "get_model_dtype", "get_replay_cache_dtypes", "get_strategy"]
