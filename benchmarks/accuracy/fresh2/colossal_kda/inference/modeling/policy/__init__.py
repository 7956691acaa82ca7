from .nopadding_kimi import NoPaddingKimiLinearModelInferPolicy, model_policy_map

__all__ = ["NoPaddingKimiLinearModelInferPolicy", "model_policy_map"]
