"""
Bindings for the exllamav2_ext extension. CPU stand-in for the compiled C++/CUDA module: same entry
points, and the recurrent decode op records the tensors it was handed.
"""

import torch

# Passed where the extension takes an optional tensor (meta tensor means None on the C++ side)
none_tensor = torch.empty((1, 1), device = "meta")

LAST_CALL: dict = {}


class _ExtC:

    def kda_replayssm_decode(self, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache,
                             g_cache, out, ssm_state_indices, write_pos, force_flush = None,
                             use_qk_l2norm_in_kernel = False, lower_bound = None):
        """One ReplaySSM decode step of Kimi Delta Attention (fused_recurrent_kda_replayssm_decode)"""
        LAST_CALL.clear()
        LAST_CALL.update(initial_state = initial_state, d_cache = d_cache, k_cache = k_cache, g_cache = g_cache,
                         ssm_state_indices = ssm_state_indices, write_pos = write_pos)
        out.zero_()
        return out, initial_state

    def fp16_to_q_ring(self, src, dst, scales, wbits):
        levels = (1 << (wbits - 1)) - 1
        scales.copy_(src.abs().amax(dim = -1, keepdim = True).clamp(min = 1e-6))
        dst.copy_((torch.round(src / scales * levels).clamp(-levels, levels) + levels).to(torch.uint8))

    def q_to_fp16_ring(self, src, scales, dst, wbits):
        levels = (1 << (wbits - 1)) - 1
        dst.copy_((src.to(torch.half) - levels) / levels * scales)


exllamav2_ext = _ExtC()
