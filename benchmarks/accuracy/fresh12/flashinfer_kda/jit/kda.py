"""JIT registry for the ReplaySSM KDA decode kernel.

The CUDA build compiles one module per (q dtype, kv dtype, index dtype, head dims, gate kind) and
caches it; on CPU every module wraps the same pure-torch kernel below, which computes in fp32 and
writes its results back into the given tensors with ``copy_``.
"""

import functools
import math
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..compat import nvtx_range, register_custom_op
from ..utils import _get_cache_buf, canonicalize_torch_dtype, filename_safe_dtype_map


@register_custom_op(
    "fused_recurrent_kda_replayssm_decode",
    mutates_args=("initial_state", "d_cache", "k_cache", "g_cache", "out"),
)
def fused_recurrent_kda_replayssm_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = True,
    lower_bound: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM decode step per row (sglang argument order); see the module docstring."""
    batch = mixed_qkv.shape[0]
    _, HV, V, K = initial_state.shape
    H, L = k_cache.shape[1], d_cache.shape[2]
    if mixed_qkv.shape[-1] != 2 * H * K + HV * V:
        raise ValueError(
            f"mixed_qkv: expected last dim {2 * H * K + HV * V}, got {mixed_qkv.shape[-1]}"
        )
    group = HV // H
    x = mixed_qkv.float()
    q = x[:, : H * K].reshape(batch, H, K)
    k = x[:, H * K : 2 * H * K].reshape(batch, H, K)
    v = x[:, 2 * H * K :].reshape(batch, HV, V)
    if use_qk_l2norm_in_kernel:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q_s = q * scale
    gate_in = a.float().reshape(batch, HV, K) + dt_bias.float().reshape(HV, K)
    A = A_log.float().exp()[:, None]
    if lower_bound is None:
        g = -A * F.softplus(gate_in, threshold=20.0)
    else:
        g = lower_bound * torch.sigmoid(A * gate_in)
    alpha = g.exp()
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    for row in range(batch):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        c = int(write_pos[row])
        flush = c == L - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        for hv in range(HV):
            h = hv // group
            rows = g_cache[slot, hv, :c].float()
            g_total = rows.sum(0)
            S = initial_state[slot, hv].float() * g_total.exp()[None, :]
            if c:
                weights = (g_total[None, :] - rows.cumsum(0)).exp() * k_cache[slot, h, :c].float()
                S = S + d_cache[slot, hv, :c].float().transpose(0, 1) @ weights
            state_q = S @ (alpha[row, hv] * q_s[row, h])
            state_k = S @ (alpha[row, hv] * k[row, h])
            delta = beta[row, hv] * (v[row, hv] - state_k)
            out[row, 0, hv].copy_(state_q + delta * (k[row, h] @ q_s[row, h]))
            if flush:
                initial_state[slot, hv].copy_(S * alpha[row, hv][None, :] + delta[:, None] * k[row, h][None, :])
            else:
                d_cache[slot, hv, c].copy_(delta)
                g_cache[slot, hv, c].copy_(g[row, hv])
                if hv % group == 0:
                    k_cache[slot, h, c].copy_(k[row, h])
    return out, initial_state


def gen_kda_decode_uri(
    dtype_q: torch.dtype,
    dtype_kv: torch.dtype,
    dtype_idx: torch.dtype,
    head_dim_k: int,
    head_dim_v: int,
    bounded_gate: bool,
    use_qk_l2norm: bool,
) -> str:
    return (
        f"kda_replay_decode_dtype_q_{filename_safe_dtype_map[dtype_q]}_"
        f"dtype_kv_{filename_safe_dtype_map[dtype_kv]}_"
        f"dtype_idx_{filename_safe_dtype_map[dtype_idx]}_"
        f"head_dim_qk_{head_dim_k}_head_dim_vo_{head_dim_v}_"
        f"bounded_{bounded_gate}_l2norm_{use_qk_l2norm}"
    )


# Captured decode graphs per (uri, batch size); values are callables, never tensors.
log_decay_graph_cache: Dict[Tuple[str, int], object] = {}


@functools.cache
def get_kda_decode_module(
    dtype_q: torch.dtype,
    dtype_kv: torch.dtype,
    dtype_idx: torch.dtype,
    head_dim_k: int,
    head_dim_v: int,
    bounded_gate: bool = False,
    use_qk_l2norm: bool = True,
) -> SimpleNamespace:
    """The decode module for one configuration (built once, then cached)."""
    uri = gen_kda_decode_uri(
        dtype_q, dtype_kv, dtype_idx, head_dim_k, head_dim_v, bounded_gate, use_qk_l2norm
    )

    def plan(
        float_workspace_buffer: torch.Tensor,
        int_workspace_buffer: torch.Tensor,
        batch_size: int,
        num_v_heads: int,
        ring_len: int,
    ) -> List[int]:
        # one CTA per (row, value head); the split of the replay over ring rows is fixed at 1 on CPU
        num_ctas = batch_size * num_v_heads
        needed = num_ctas * head_dim_v * 4
        if float_workspace_buffer.numel() < needed:
            raise ValueError(
                f"float_workspace_buffer: expected at least {needed} bytes, got {float_workspace_buffer.numel()}"
            )
        return [batch_size, num_v_heads, ring_len, num_ctas, 1]

    def run(
        plan_info: List[int],
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
        scale: float,
        out: torch.Tensor,
        ssm_state_indices: torch.Tensor,
        write_pos: torch.Tensor,
        *,
        ssm_state: torch.Tensor,
        delta_buf: torch.Tensor,
        key_buf: torch.Tensor,
        log_decay_buf: torch.Tensor,
        force_flush: Optional[torch.Tensor] = None,
        lower_bound: Optional[float] = None,
    ) -> torch.Tensor:
        if plan_info[0] != mixed_qkv.shape[0]:
            raise ValueError(f"mixed_qkv: planned for {plan_info[0]} rows, got {mixed_qkv.shape[0]}")
        with nvtx_range(uri):
            fused_recurrent_kda_replayssm_decode(
                mixed_qkv,
                a,
                b,
                A_log,
                dt_bias,
                scale,
                ssm_state,
                delta_buf,
                key_buf,
                log_decay_buf,
                out,
                ssm_state_indices,
                write_pos,
                force_flush=force_flush,
                use_qk_l2norm_in_kernel=use_qk_l2norm,
                lower_bound=lower_bound,
            )
        return out

    return SimpleNamespace(uri=uri, plan=plan, run=run)


def build_module_registry():
    """Two cached modules, one decode step straight through a module, and the scratch it used."""
    torch.manual_seed(11)
    H = HV = 2
    K = V = 8
    L, slots, batch = 4, 3, 2
    bf16 = canonicalize_torch_dtype("bf16")
    module = get_kda_decode_module(bf16, bf16, torch.int32, K, V)
    again = get_kda_decode_module(bf16, bf16, torch.int32, K, V)
    assert module is again
    fp16_module = get_kda_decode_module(torch.float16, torch.float16, torch.int32, K, V, True)

    workspace = _get_cache_buf("kda_module_registry_workspace", 4096, "cpu")
    int_workspace = torch.zeros(256, dtype=torch.uint8)
    ssm_state = torch.randn(slots, HV, V, K).to(bf16)
    delta_buf = torch.zeros(slots, HV, L, V, dtype=bf16)
    key_buf = torch.zeros(slots, H, L, K, dtype=bf16)
    log_decay_buf = torch.zeros(slots, HV, L, K, dtype=torch.float32)
    # fp32 scratch carved out of the byte workspace for the replayed prefix sums
    prefix_scratch = workspace[: slots * HV * K * 4].view(torch.float32).view(slots, HV, K)

    plan_info = module.plan(workspace, int_workspace, batch, HV, L)
    slot_ids = torch.tensor([2, 0], dtype=torch.int32)
    write_pos = torch.tensor([0, 1], dtype=torch.int32)
    out = torch.empty(batch, 1, HV, V, dtype=bf16)
    module.run(
        plan_info,
        torch.randn(batch, 2 * H * K + HV * V).to(bf16),
        torch.randn(batch, HV, K).to(bf16),
        torch.randn(batch, HV).to(bf16),
        torch.linspace(0.0, 1.0, HV),
        torch.zeros(HV, K),
        K**-0.5,
        out,
        slot_ids,
        write_pos,
        ssm_state=ssm_state,
        delta_buf=delta_buf,
        key_buf=key_buf,
        log_decay_buf=log_decay_buf,
    )
    prefix_scratch.copy_(log_decay_buf[:, :, :2].sum(2))
    log_decay_graph_cache[(module.uri, batch)] = module.run
    return {
        "uris": [module.uri, fp16_module.uri],
        "graphs": dict(log_decay_graph_cache),
        "out": out,
        "ssm_state": ssm_state,
        "delta_buf": delta_buf,
        "key_buf": key_buf,
        "log_decay_buf": log_decay_buf,
        "prefix_scratch": prefix_scratch,
    }
