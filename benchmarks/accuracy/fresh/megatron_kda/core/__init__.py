from megatron_kda.core.inference_params import InferenceParams
from megatron_kda.core.transformer_config import TransformerConfig

__all__ = ["InferenceParams", "TransformerConfig"]
