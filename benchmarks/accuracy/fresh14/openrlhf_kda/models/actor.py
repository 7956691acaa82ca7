"""KDA causal LM with ReplaySSM decode caches, and the ``Actor`` wrapper the PPO trainer uses."""

from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..utils.utils import convert_to_torch_dtype, get_model_dtype, torch_default_dtype
from .kda_ops import advance_write_pos, fused_recurrent_kda_replayssm_decode
from .ring_cache import replay_cache_shapes

_PRETRAINED_CONFIGS = {
    "moonshotai/Kimi-Linear-tiny": {"torch_dtype": "bfloat16"},
    "moonshotai/Kimi-Linear-tiny-bounded": {"torch_dtype": "bfloat16", "lower_bound": -5.0},
}


class KDAConfig:
    """Configuration of a (tiny) Kimi Linear model; mirrors the fields of the HF config."""

    model_type = "kimi_linear"

    def __init__(
        self,
        vocab_size: int = 32,
        hidden_size: int = 16,
        num_hidden_layers: int = 2,
        num_heads: int = 2,
        num_v_heads: int = 4,
        head_k_dim: int = 8,
        head_v_dim: int = 8,
        intermediate_size: int = 32,
        replay_ring_len: int = 4,
        lower_bound: Optional[float] = None,
        rms_norm_eps: float = 1e-6,
        torch_dtype: str = "float32",
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads
        self.head_k_dim = head_k_dim
        self.head_v_dim = head_v_dim
        self.intermediate_size = intermediate_size
        self.replay_ring_len = replay_ring_len
        self.lower_bound = lower_bound
        self.rms_norm_eps = rms_norm_eps
        self.torch_dtype = torch_dtype
        for key, value in kwargs.items():
            setattr(self, key, value)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, **kwargs) -> "KDAConfig":
        if pretrained_model_name_or_path not in _PRETRAINED_CONFIGS:
            raise OSError(f"{pretrained_model_name_or_path} is not a known Kimi Linear checkpoint")
        return cls(**{**_PRETRAINED_CONFIGS[pretrained_model_name_or_path], **kwargs})


class KDAReplayCache(nn.Module):
    """Decode caches of one KDA layer, registered as buffers so they move with the model."""

    def __init__(self, config: KDAConfig, num_slots: int):
        super().__init__()
        shapes = replay_cache_shapes(config, num_slots)
        self.register_buffer("ssm_ckpt", torch.zeros(shapes["ssm_ckpt"]))
        self.register_buffer("delta_ring", torch.zeros(shapes["delta_ring"]))
        self.register_buffer("key_ring", torch.zeros(shapes["key_ring"]))
        self.register_buffer("logdecay_ring", torch.zeros(shapes["logdecay_ring"]))  # expect-bug: default-dtype id=pretrained-init
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32))

    @property
    def ring_len(self) -> int:
        return self.logdecay_ring.shape[2]

    def reset_slots(self, slot_ids: torch.Tensor) -> None:
        index = slot_ids.long()
        for buffer in (self.ssm_ckpt, self.delta_ring, self.key_ring, self.logdecay_ring, self.write_pos):
            buffer[index] = 0


class FP32GateReplayCache(KDAReplayCache):
    """A ``KDAReplayCache`` whose log-decay ring stays float32 through ``.to()``/``.half()``/
    ``.bfloat16()``; device moves still apply to it."""

    def _apply(self, fn, recurse=True):
        logdecay = self._buffers["logdecay_ring"]
        super()._apply(fn, recurse)
        device = fn(logdecay[:0]).device
        self._buffers["logdecay_ring"] = logdecay.to(device=device)
        return self


class KDARMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        normed = hidden_states.float() * torch.rsqrt(variance + self.eps)
        return self.weight * normed.to(hidden_states.dtype)


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: KDAConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_v_heads = config.num_heads, config.num_v_heads
        self.head_k_dim, self.head_v_dim = config.head_k_dim, config.head_v_dim
        self.lower_bound = config.lower_bound
        qkv_width = 2 * config.num_heads * config.head_k_dim + config.num_v_heads * config.head_v_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_width, bias=False)
        self.a_proj = nn.Linear(config.hidden_size, config.num_v_heads * config.head_k_dim, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, config.num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(config.num_v_heads).uniform_(1.0, 16.0)))
        self.dt_bias = nn.Parameter(torch.zeros(config.num_v_heads * config.head_k_dim))
        self.o_proj = nn.Linear(config.num_v_heads * config.head_v_dim, config.hidden_size, bias=False)

    def forward(self, hidden_states: torch.Tensor, cache, slot_ids: torch.Tensor) -> torch.Tensor:
        """One decode token per row of ``hidden_states`` ([B, hidden])."""
        batch = hidden_states.shape[0]
        out = hidden_states.new_empty(batch, 1, self.num_v_heads, self.head_v_dim)
        write_pos = cache.write_pos[slot_ids.long()]
        fused_recurrent_kda_replayssm_decode(
            self.qkv_proj(hidden_states),
            self.a_proj(hidden_states),
            self.b_proj(hidden_states),
            self.A_log,
            self.dt_bias,
            self.head_k_dim**-0.5,
            cache.ssm_ckpt,
            cache.delta_ring,
            cache.key_ring,
            cache.logdecay_ring,
            out,
            slot_ids,
            write_pos,
            lower_bound=self.lower_bound,
        )
        cache.write_pos[slot_ids.long()] = advance_write_pos(write_pos, cache.logdecay_ring.shape[2])
        return self.o_proj(out.reshape(batch, -1))


class KDADecoderLayer(nn.Module):
    def __init__(self, config: KDAConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = KDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = KimiDeltaAttention(config, layer_idx)
        self.post_attention_layernorm = KDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden_states, cache, slot_ids):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cache, slot_ids)
        gate, up = self.gate_up_proj(self.post_attention_layernorm(hidden_states)).chunk(2, dim=-1)
        return hidden_states + self.down_proj(F.silu(gate) * up)


class KDAForCausalLM(nn.Module):
    """Kimi Linear LM made of KDA layers. ``cache_cls=None`` builds a model without decode caches
    (a rollout engine keeps its caches in its own pool and passes them to ``decode_step``)."""

    def __init__(self, config: KDAConfig, cache_cls=FP32GateReplayCache, num_slots: int = 2):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KDADecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = KDARMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.replay_caches = None
        if cache_cls is not None:
            self.replay_caches = nn.ModuleList(cache_cls(config, num_slots) for _ in range(config.num_hidden_layers))

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str, torch_dtype="auto", cache_cls=FP32GateReplayCache, num_slots=2, **kwargs
    ) -> "KDAForCausalLM":
        kwargs.pop("attn_implementation", None)
        config = KDAConfig.from_pretrained(pretrained_model_name_or_path, **kwargs)
        dtype = convert_to_torch_dtype(config.torch_dtype if torch_dtype == "auto" else torch_dtype)
        with torch_default_dtype(dtype):  # expect-bug: default-dtype id=pretrained-init
            model = cls(config, cache_cls=cache_cls, num_slots=num_slots)
        return model.eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def decode_step(self, input_ids: torch.Tensor, slot_ids: torch.Tensor, caches=None) -> torch.Tensor:
        caches = self.replay_caches if caches is None else caches
        hidden_states = self.embed_tokens(input_ids)
        for layer, cache in zip(self.layers, caches):
            hidden_states = layer(hidden_states, cache, slot_ids)
        return self.lm_head(self.norm(hidden_states))

    def load_weights(self, weights) -> None:
        params = dict(self.named_parameters())
        for name, weight in weights:
            params[name].data.copy_(weight)


class Actor(nn.Module):
    """
    Base class for Actor models in reinforcement learning.

    Args:
        pretrain_or_model: a checkpoint name, or an already built ``KDAForCausalLM``
        use_flash_attention_2: use flash attention for prefill (unused by the decode path)
        bf16: run the model in bfloat16 (decode caches follow, log-decays stay float32)
        num_slots: number of sequences the decode caches hold
    """

    def __init__(
        self,
        pretrain_or_model: Union[str, KDAForCausalLM],
        use_flash_attention_2: bool = False,
        bf16: bool = True,
        load_in_4bit: bool = False,
        lora_rank: int = 0,
        ds_config: Optional[dict] = None,
        device_map=None,
        packing_samples: bool = False,
        num_slots: int = 2,
        **kwargs,
    ) -> None:
        super().__init__()
        if isinstance(pretrain_or_model, str):
            attn_implementation = "flash_attention_2" if use_flash_attention_2 else "eager"
            self.model = KDAForCausalLM.from_pretrained(
                pretrain_or_model,
                torch_dtype=torch.bfloat16 if bf16 else "auto",
                num_slots=num_slots,
                attn_implementation=attn_implementation,
            )
        else:
            self.model = pretrain_or_model
            if bf16:
                self.model = self.model.to(torch.bfloat16)
        self.packing_samples = packing_samples

    def reset_slots(self, slot_ids: torch.Tensor) -> None:
        for cache in self.model.replay_caches:
            cache.reset_slots(slot_ids)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 2, slot_ids=None, **kwargs):
        """Greedy generation with replay decode, one prompt token per step (no prefill kernel)."""
        batch, prompt_len = input_ids.shape
        slot_ids = torch.arange(batch, dtype=torch.int32) if slot_ids is None else slot_ids
        self.reset_slots(slot_ids)
        tokens = [input_ids[:, i] for i in range(prompt_len)]
        for step in range(prompt_len + max_new_tokens - 1):
            logits = self.model.decode_step(tokens[step], slot_ids)
            if step >= prompt_len - 1:
                tokens.append(logits.float().argmax(dim=-1))
        sequences = torch.stack(tokens, dim=1)
        attention_mask = torch.ones_like(sequences, dtype=torch.bool)
        action_mask = attention_mask[:, prompt_len:]
        return sequences, attention_mask, action_mask

    @torch.no_grad()
    def forward(self, sequences: torch.Tensor, num_actions: int, attention_mask=None, slot_ids=None) -> torch.Tensor:
        """Log-probs of the last ``num_actions`` tokens, from a replay decode over the sequence."""
        batch, seq_len = sequences.shape
        slot_ids = torch.arange(batch, dtype=torch.int32) if slot_ids is None else slot_ids
        self.reset_slots(slot_ids)
        logits = [self.model.decode_step(sequences[:, i], slot_ids) for i in range(seq_len - 1)]
        log_probs = torch.stack(logits, dim=1).float().log_softmax(dim=-1)
        labels = sequences[:, 1:].unsqueeze(-1)
        return log_probs.gather(-1, labels).squeeze(-1)[:, -num_actions:]


def create_reference_model(config: KDAConfig, args, num_slots: int = 2) -> KDAForCausalLM:
    """The frozen initial policy used for the KL penalty, with decode caches of its own."""
    model = KDAForCausalLM(config, cache_cls=KDAReplayCache, num_slots=num_slots)
    model.requires_grad_(False)
    return model.to(get_model_dtype(args)).eval()  # expect-bug: module-cast


def _tiny_prompts() -> torch.Tensor:
    return torch.tensor([[3, 7, 1], [5, 2, 9]], dtype=torch.long)


def build_actor_decode() -> dict:
    """A bf16 actor generating two tokens after a three-token prompt (one ring flush)."""
    torch.manual_seed(0)
    model = KDAForCausalLM(KDAConfig(), num_slots=2)
    actor = Actor(model, bf16=True)
    sequences, attention_mask, action_mask = actor.generate(_tiny_prompts(), max_new_tokens=2)
    return {"actor": actor.model, "sequences": sequences, "action_mask": action_mask}


def build_pretrained_actor() -> dict:
    """An actor loaded by name in bf16, after a short generation."""
    torch.manual_seed(0)
    actor = Actor("moonshotai/Kimi-Linear-tiny", bf16=True, num_slots=2)
    sequences, _, _ = actor.generate(_tiny_prompts(), max_new_tokens=1)
    return {"actor": actor.model, "sequences": sequences}


def build_reference_model() -> dict:
    """The actor and the frozen initial model of a bf16 PPO run, both after scoring one rollout."""
    from ..utils.utils import get_train_ppo_args

    torch.manual_seed(0)
    config, args = KDAConfig(), get_train_ppo_args(bf16=True)
    actor = Actor(KDAForCausalLM(config), bf16=args.bf16)
    initial_model = create_reference_model(config, args)
    sequences, _, _ = actor.generate(_tiny_prompts(), max_new_tokens=1)
    slot_ids = torch.arange(2, dtype=torch.int32)
    for i in range(sequences.shape[1]):
        initial_model.decode_step(sequences[:, i], slot_ids)
    return {"actor": actor.model, "initial_model": initial_model}
