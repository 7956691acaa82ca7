"""Parameter-efficient adapters for Kimi Delta Attention models served with ReplaySSM decode."""

__version__ = "0.3.0.dev0"

from .config import PeftConfig, PeftConfigMixin, ReplayCacheConfig
from .mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING, get_peft_model
from .modeling_kda import Fp32GateReplayCache, KdaConfig, KdaForCausalLM, KdaReplayCache, ReplayRings
from .peft_model import PeftModel, PeftModelForCausalLM
from .tuners import LoraConfig, LoraModel
from .utils import (
    PeftType,
    TaskType,
    cast_mixed_precision_params,
    cast_replay_cache,
    get_peft_model_state_dict,
    prepare_model_for_low_precision_serving,
    set_peft_model_state_dict,
)
