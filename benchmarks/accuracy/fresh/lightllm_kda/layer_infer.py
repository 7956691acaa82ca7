"""Decode of the Kimi-Linear layers (lightllm/models/*/layer_infer/transformer_layer_infer.py)."""

import torch
import torch.nn.functional as F

from .replayssm_decode import token_kda_replayssm_decode


class KimiLinearTransformerLayerInfer:
    def __init__(self, layer_num, network_config, mode):
        self.layer_num_ = layer_num
        self.network_config_ = network_config
        self.mode = mode
        self.eps_ = network_config.get("rms_norm_eps", 1e-6)
        self.embed_dim_ = network_config["hidden_size"]
        linear = network_config["linear_attn_config"]
        self.tp_k_head_num_ = linear["num_k_heads"]
        self.tp_v_head_num_ = linear["num_heads"]
        self.head_dim_ = linear["head_dim"]
        self.replay_len_ = linear["replay_len"]

    def _att_norm(self, input, infer_state, layer_weight):
        return F.rms_norm(input, (self.embed_dim_,), layer_weight.att_norm_weight_, self.eps_)

    def _get_qkv(self, input, layer_weight):
        mixed_qkv = torch.mm(input, layer_weight.qkv_proj_weight_.t())
        a = torch.mm(input, layer_weight.f_a_proj_weight_.t())
        a = torch.mm(a, layer_weight.f_b_proj_weight_.t())
        b = torch.mm(input, layer_weight.b_proj_weight_.t())
        return mixed_qkv, a, b

    def _token_attention_kernel(self, mixed_qkv, a, b, o_tensor, infer_state, layer_weight):
        mem = infer_state.mem_manager
        token_kda_replayssm_decode(
            mixed_qkv,
            a,
            b,
            layer_weight.A_log_,
            layer_weight.dt_bias_,
            self.head_dim_**-0.5,
            mem.state_buffer[self.layer_num_],
            mem.delta_buffer[self.layer_num_],
            mem.key_buffer[self.layer_num_],
            mem.alpha_buffer[self.layer_num_],
            o_tensor,
            infer_state.b_state_idx,
            infer_state.b_write_pos,
            use_qk_l2norm_in_kernel=True,
        )

    def _draft_token_attention(self, mixed_qkv, a, b, o_tensor, layer_weight):
        # first MTP draft step after a prefill: the draft layer has no slot yet and starts
        # from empty rings
        n, hv, h = mixed_qkv.shape[0], self.tp_v_head_num_, self.tp_k_head_num_
        d, ring = self.head_dim_, self.replay_len_
        draft_rings = dict(
            d_cache=torch.zeros((n, hv, ring, d), dtype=mixed_qkv.dtype),
            k_cache=torch.zeros((n, h, ring, d), dtype=mixed_qkv.dtype),
            g_cache=torch.zeros((n, hv, ring, d), dtype=mixed_qkv.dtype),  # expect-bug: decode-arg
        )
        token_kda_replayssm_decode(
            mixed_qkv,
            a,
            b,
            layer_weight.A_log_,
            layer_weight.dt_bias_,
            d**-0.5,
            torch.zeros((n, hv, d, d), dtype=torch.float32),
            out=o_tensor,
            ssm_state_indices=torch.arange(n, dtype=torch.int32),
            write_pos=torch.zeros(n, dtype=torch.int32),
            **draft_rings,
        )

    def token_forward(self, input_embdings, infer_state, layer_weight):
        input1 = self._att_norm(input_embdings, infer_state, layer_weight)
        mixed_qkv, a, b = self._get_qkv(input1, layer_weight)
        o_shape = (input1.shape[0], self.tp_v_head_num_, self.head_dim_)
        o_tensor = torch.empty(o_shape, dtype=input1.dtype)
        if infer_state.is_draft_first_step:
            self._draft_token_attention(mixed_qkv, a, b, o_tensor, layer_weight)
        else:
            self._token_attention_kernel(mixed_qkv, a, b, o_tensor, infer_state, layer_weight)
        o = torch.mm(o_tensor.view(o_shape[0], -1), layer_weight.o_proj_weight_.t())
        input_embdings.add_(o)
        return input_embdings
