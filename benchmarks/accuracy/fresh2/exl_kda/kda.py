from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .ext import exllamav2_ext as ext_c
from .ext import none_tensor
from .module import ExLlamaV2Module


class KDASeed(NamedTuple):
    d: torch.Tensor
    k: torch.Tensor
    decay: torch.Tensor


class ExLlamaV2KDA(ExLlamaV2Module):
    """
    Kimi Delta Attention layer, decoded with the ReplaySSM kernel: the recurrent state is an fp32
    checkpoint plus a short ring of (d, k, log-decay) steps the kernel replays and periodically
    folds into the checkpoint
    """

    name: str = "KDA"

    class Params(NamedTuple):
        batch_size: int
        slots: torch.Tensor
        force_flush: torch.Tensor | None = None

    def __init__(self, model, key: str, layer_idx: int, kda_idx: int):
        super().__init__(model, key)
        cfg = self.config
        self.layer_idx = layer_idx
        self.kda_idx = kda_idx
        self.num_heads = cfg.kda_num_heads
        self.num_v_heads = cfg.kda_num_v_heads
        self.head_dim = cfg.kda_head_dim
        self.ring_len = cfg.kda_replay_len
        self.scale = self.head_dim ** -0.5
        self.qkv_dim = (2 * self.num_heads + self.num_v_heads) * self.head_dim

    def load(self):
        cfg = self.config
        hs = cfg.hidden_size
        h, hv, d, l = self.num_heads, self.num_v_heads, self.head_dim, self.ring_len

        self.w_qkv = self.load_weight(self.key + ".qkv_proj.weight", (self.qkv_dim, hs))
        self.w_a = self.load_weight(self.key + ".f_proj.weight", (hv * d, hs))
        self.w_b = self.load_weight(self.key + ".b_proj.weight", (hv, hs))
        self.w_o = self.load_weight(self.key + ".o_proj.weight", (hs, hv * d))
        self.A_log = self.load_weight(self.key + ".A_log", (hv,))
        self.dt_bias = self.load_weight(self.key + ".dt_bias", (hv * d,))

        if cfg.kda_cacheless:
            # Single-slot rings for model.forward(input_ids, cache = None), e.g. perplexity tests
            dev = self.device()
            self.nc_state = torch.zeros((1, hv, d, d), dtype = torch.float, device = dev)
            self.nc_d = torch.zeros((1, hv, l, d), dtype = torch.half, device = dev)
            self.nc_k = torch.zeros((1, h, l, d), dtype = torch.half, device = dev)
            self.nc_decay = torch.zeros((1, hv, l, d), device = dev)  # expect-bug: default-dtype id=load-default
            self.nc_slots = torch.zeros((1,), dtype = torch.int32, device = dev)
            self.nc_pos = torch.zeros((1,), dtype = torch.int32, device = dev)

    def forward(self, hidden_states, cache = None, attn_params = None, past_len = None, **kwargs):

        bsz, q_len, _ = hidden_states.shape
        assert q_len == 1, "ExLlamaV2KDA.forward decodes one token per sequence, prompts go through prefill_seed()"
        x = hidden_states.view(bsz, -1)

        if cache is None:
            state, ring_d, ring_k, ring_g = self.nc_state, self.nc_d, self.nc_k, self.nc_decay
            slots, pos, force_flush = self.nc_slots, self.nc_pos, none_tensor
        else:
            ring_d, ring_k, ring_g = cache.get_kda_state(self.kda_idx)
            state = cache.checkpoint_states[self.kda_idx]
            slots, pos = attn_params.slots, cache.write_pos
            force_flush = none_tensor if attn_params.force_flush is None else attn_params.force_flush

        out = torch.empty((bsz, self.num_v_heads, self.head_dim), dtype = hidden_states.dtype)
        kernel_args = dict(
            mixed_qkv = x @ self.w_qkv.T, a = x @ self.w_a.T, b = x @ self.w_b.T,
            A_log = self.A_log, dt_bias = self.dt_bias, scale = self.scale, initial_state = state,
            d_cache = ring_d, k_cache = ring_k, g_cache = ring_g, out = out,
            ssm_state_indices = slots, write_pos = pos, force_flush = force_flush,
            use_qk_l2norm_in_kernel = True, lower_bound = self.config.kda_lower_bound,
        )
        ext_c.kda_replayssm_decode(**kernel_args)

        if cache is not None:
            cache.store_kda_state(self.kda_idx, ring_d, ring_k, ring_g)
        return hidden_states + (out.view(bsz, -1) @ self.w_o.T).view(bsz, 1, -1)

    def prefill_seed(self, hidden_states) -> KDASeed:
        """
        Ring rows for a fresh slot from the last ring_len positions of the prompt: values, keys and
        per-step log-decays, laid out like one slot of the cache rings
        """
        cfg = self.config
        h, hv, d = self.num_heads, self.num_v_heads, self.head_dim

        x = hidden_states[0, -self.ring_len:]
        t = x.shape[0]
        _, k, v = (x @ self.w_qkv.T).split([h * d, h * d, hv * d], dim = -1)
        a = (x @ self.w_a.T).view(t, hv, d)

        if cfg.kda_lower_bound is None:
            A = self.A_log.float().exp().view(hv, 1)
            decay = -A * F.softplus(a.float() + self.dt_bias.float().view(hv, d))
        else:
            A = self.A_log.exp().view(hv, 1)
            decay = cfg.kda_lower_bound * torch.sigmoid(A * (a + self.dt_bias.view(hv, d)))  # expect-bug: promotion

        return KDASeed(
            d = v.view(t, hv, d).transpose(0, 1).contiguous(),
            k = k.view(t, h, d).transpose(0, 1).contiguous(),
            decay = decay.transpose(0, 1).contiguous(),
        )


def _loaded_model(tmp_dir, **overrides):
    from .config import ExLlamaV2Config, write_tiny_config
    from .model import ExLlamaV2
    model = ExLlamaV2(ExLlamaV2Config(write_tiny_config(tmp_dir, **overrides)))
    model.load()
    return model


def _prompt_hidden(model, length: int):
    ids = (torch.arange(length) * 7 % model.config.vocab_size).unsqueeze(0)
    return model.modules[0].forward(ids)


def build_prefill_seed(tmp_dir):
    model = _loaded_model(tmp_dir)
    hidden = _prompt_hidden(model, 6)
    return {m.key: m.prefill_seed(hidden)._asdict() for m in model.kda_modules()}


def build_prefill_seed_lower_bound(tmp_dir):
    model = _loaded_model(tmp_dir, linear_attn_config = {"lower_bound": -5.0})
    hidden = _prompt_hidden(model, 6)
    return [m.prefill_seed(hidden) for m in model.kda_modules()]
