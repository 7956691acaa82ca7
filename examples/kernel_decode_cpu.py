"""Run the bundled ReplaySSM decode kernel on CPU (Helion interpreter) against the plain recurrence."""

import torch
from replaylint.kernels import ReplaySSMCache, recurrent_decode_reference

B, H, HV, K, V, L = 2, 2, 4, 16, 16, 4
cache = ReplaySSMCache(slots=3, num_heads=H, num_value_heads=HV, head_k_dim=K, head_v_dim=V,
                       ring_len=L, state_dtype=torch.bfloat16)
print(cache.state.dtype, cache.d_cache.dtype, cache.g_cache.dtype)  # bf16, bf16, float32
torch.manual_seed(0)
A_log, dt_bias = torch.linspace(-3.0, 0.0, HV), torch.zeros(HV, K)
rows = torch.tensor([2, 0], dtype=torch.int32)  # pool slot per batch row (-1 = padding)
plain = cache.state.double()
for step in range(6):
    mixed_qkv, a, b = torch.randn(B, 2 * H * K + HV * V), torch.randn(B, HV, K), torch.randn(B, HV)
    out = torch.empty(B, 1, HV, V)
    cache.decode(mixed_qkv, a, b, A_log, dt_bias, K**-0.5, out, rows, use_qk_l2norm_in_kernel=True)
    ref = torch.empty(B, 1, HV, V, dtype=torch.float64)
    recurrent_decode_reference(mixed_qkv.double(), a.double(), b, A_log, dt_bias, K**-0.5,
                               plain, ref, rows, use_qk_l2norm_in_kernel=True)
    print(step, cache.write_pos.tolist(), f"{((out.double() - ref).norm() / ref.norm()):.1e}")
