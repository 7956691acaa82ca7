"""Reference (HuggingFace-compatible) KimiLinear model: the modules the inference policies replace.
Its KDA layers keep a single-sequence recurrent cache in non-persistent buffers, used when the
unsharded model decodes (evaluation, boosted models)."""

from typing import Optional

import torch
import torch.nn as nn

from colossal_kda.kernel.kernel_loader import LAST_CALL, InferenceOpsLoader

inference_ops = InferenceOpsLoader().load()


class KimiLinearConfig:
    model_type = "kimi_linear"

    def __init__(self, vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                 num_key_value_heads=2, linear_attn_config: Optional[dict] = None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads
        lac = {"kda_layers": [1, 2], "num_heads": 2, "head_dim": 8, "replay_len": 4, "lower_bound": -5.0}
        lac.update(linear_attn_config or {})
        self.kda_layer_idx = [i - 1 for i in lac["kda_layers"]]
        self.kda_num_heads = lac["num_heads"]
        self.kda_num_v_heads = lac.get("num_v_heads", lac["num_heads"])
        self.kda_head_dim = lac["head_dim"]
        self.kda_ring_len = lac["replay_len"]
        self.kda_lower_bound = lac["lower_bound"]


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads, self.num_v_heads, self.head_dim = H, HV, K = (
            config.kda_num_heads, config.kda_num_v_heads, config.kda_head_dim)
        L, hidden = config.kda_ring_len, config.hidden_size
        self.scale = K**-0.5

        self.q_proj = nn.Linear(hidden, H * K, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(hidden, H * K, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(hidden, HV * K, bias=False, dtype=dtype)
        self.f_proj = nn.Linear(hidden, HV * K, bias=False, dtype=dtype)
        self.b_proj = nn.Linear(hidden, HV, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(HV * K, hidden, bias=False, dtype=dtype)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, HV, dtype=dtype)))
        self.dt_bias = nn.Parameter(torch.zeros(HV * K, dtype=dtype))

        self.register_buffer("lower_bound", torch.tensor(config.kda_lower_bound, dtype=torch.float32), persistent=False)
        self.register_buffer("state", torch.zeros(1, HV, K, K, dtype=torch.float32), persistent=False)
        self.register_buffer("d_cache", torch.zeros(1, HV, L, K, dtype=self.v_proj.weight.dtype), persistent=False)
        self.register_buffer("k_cache", torch.zeros(1, H, L, K, dtype=self.k_proj.weight.dtype), persistent=False)
        self.register_buffer("g_cache", torch.zeros(1, HV, L, K, dtype=torch.float32), persistent=False)
        self.register_buffer("write_pos", torch.zeros(1, dtype=torch.int32), persistent=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        bsz, q_len, _ = hidden_states.shape
        HV, K, L = self.num_v_heads, self.head_dim, self.d_cache.shape[2]
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        a, beta = self.f_proj(hidden_states), self.b_proj(hidden_states)

        if q_len == 1:
            out = torch.empty(bsz, HV, K, dtype=hidden_states.dtype, device=hidden_states.device)
            slots = torch.arange(bsz, dtype=torch.int32, device=hidden_states.device)
            inference_ops.kda_replayssm_decode(
                torch.cat([q, k, v], dim=-1).view(bsz, -1), a.view(bsz, -1), beta.view(bsz, -1),
                self.A_log, self.dt_bias, self.scale, self.state, self.d_cache, self.k_cache, self.g_cache,
                out, slots, self.write_pos, None, True, float(self.lower_bound),
            )
            return self.o_proj(out.view(bsz, 1, -1))

        # prompt: keep its last ring_len steps in the rings
        g_new = (self.lower_bound * torch.sigmoid(a)).view(bsz, q_len, HV, K).transpose(1, 2)  # expect-bug: promotion id=prompt-gate
        v_new = v.view(bsz, q_len, HV, K).transpose(1, 2)
        k_new = k.view(bsz, q_len, self.num_heads, K).transpose(1, 2)
        if q_len >= L:
            self.d_cache = v_new[:, :, -L:].contiguous()
            self.k_cache = k_new[:, :, -L:].contiguous()
            self.g_cache = g_new[:, :, -L:].contiguous()  # expect-bug: promotion id=prompt-gate
        else:
            self.d_cache = torch.cat([self.d_cache[:, :, q_len:], v_new.to(self.d_cache.dtype)], dim=2)
            self.k_cache = torch.cat([self.k_cache[:, :, q_len:], k_new.to(self.k_cache.dtype)], dim=2)
            self.g_cache = torch.cat([self.g_cache[:, :, q_len:], g_new], dim=2)
        self.write_pos.fill_(0)
        return self.o_proj(v_new.transpose(1, 2).reshape(bsz, q_len, -1))


class KimiAttention(nn.Module):
    """Full attention layer (its KV cache lives in the KVCacheManager once sharded for inference)."""

    def __init__(self, config: KimiLinearConfig, layer_idx: int, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False, dtype=dtype)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.qkv_proj(hidden_states).chunk(3, dim=-1)[2])


class KimiDecoderLayer(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=1e-6, dtype=dtype)
        attn_cls = KimiDeltaAttention if layer_idx in config.kda_layer_idx else KimiAttention
        self.self_attn = attn_cls(config, layer_idx, dtype=dtype)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.self_attn(self.input_layernorm(hidden_states))


class KimiLinearModel(nn.Module):
    def __init__(self, config: KimiLinearConfig, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList([KimiDecoderLayer(config, i, dtype=dtype) for i in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=1e-6, dtype=dtype)

    def forward(self, input_ids: torch.LongTensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)


class KimiLinearForCausalLM(nn.Module):
    def __init__(self, config: KimiLinearConfig, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.config = config
        self.model = KimiLinearModel(config, dtype=dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)

    def forward(self, input_ids: torch.LongTensor, **kwargs) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))


def _kda_cache(model: nn.Module) -> dict:
    return {
        name: {"d_cache": m.d_cache, "k_cache": m.k_cache, "g_cache": m.g_cache, "state": m.state}
        for name, m in model.named_modules()
        if isinstance(m, KimiDeltaAttention)
    }


def build_prompt_cache_short_prompt():
    model = KimiLinearForCausalLM(KimiLinearConfig(), dtype=torch.bfloat16)
    model(torch.tensor([[3, 1, 4]]))
    model(torch.tensor([[1]]))
    return {"rings": _kda_cache(model), "decode": dict(LAST_CALL)}


def build_prompt_cache_long_prompt():
    model = KimiLinearForCausalLM(KimiLinearConfig(), dtype=torch.bfloat16)
    model(torch.tensor([[3, 1, 4, 1, 5, 9]]))
    return _kda_cache(model)
