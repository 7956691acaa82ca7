from .constants import (
    CONFIG_NAME, KDA_RING_NAMES, MODEL_DTYPE_RING_NAMES, REPLAY_BUFFER_NAMES, REPLAY_CACHE_NAME, REPLAY_RING_DTYPE_PRESETS,
    SAFETENSORS_WEIGHTS_NAME, TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, WEIGHTS_NAME, PeftType, TaskType,
)
from .other import (
    ModulesToSaveWrapper, _get_submodules, _set_adapter, _set_trainable, cast_mixed_precision_params, cast_replay_cache,
    dtype_to_str, get_ring_dtypes_from_model, iter_replay_caches, prepare_model_for_low_precision_serving, str_to_torch_dtype,
)
from .save_and_load import (
    get_peft_model_state_dict, get_replay_cache_state_dict, load_peft_weights, load_replay_cache_file, save_adapter_weights,
    save_replay_cache_file, set_peft_model_state_dict, set_replay_cache_state_dict,
)
