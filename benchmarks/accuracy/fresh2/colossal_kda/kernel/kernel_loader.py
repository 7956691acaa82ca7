"""Loaders of the compiled inference kernels. Only the CPU fallback is registered here; it records the
tensors the ops receive."""

from typing import Any, Dict, List

LAST_CALL: Dict[str, Any] = {}


class _CpuInferenceOps:
    def kda_replayssm_decode(self, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache,
                             out, ssm_state_indices, write_pos, force_flush=None, use_qk_l2norm_in_kernel=False,
                             lower_bound=None):
        """fused_recurrent_kda_replayssm_decode: one ReplaySSM decode step of Kimi Delta Attention."""
        LAST_CALL.clear()
        LAST_CALL.update(initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
                         ssm_state_indices=ssm_state_indices, write_pos=write_pos)
        out.zero_()
        return out, initial_state


class KernelLoader:
    REGISTRY: List = []

    def load(self, ext_name: str = None):
        for ops_cls in self.REGISTRY:
            return ops_cls()
        raise RuntimeError(f"No kernel extension available for {type(self).__name__}")


class InferenceOpsLoader(KernelLoader):
    REGISTRY = [_CpuInferenceOps]
