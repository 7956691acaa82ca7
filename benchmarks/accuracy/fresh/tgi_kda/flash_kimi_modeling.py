from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tgi_kda.globals import REPLAY_RING_LEN
from tgi_kda.ops import kda_replayssm_decode
from tgi_kda.replay_cache import ReplaySeed
from tgi_kda.utils import Weights, save_tensors


@dataclass
class KimiReplayConfig:
    vocab_size: int = 32
    hidden_size: int = 8
    num_hidden_layers: int = 2
    num_heads: int = 2
    num_k_heads: int = 1
    head_dim: int = 4
    layer_norm_eps: float = 1e-5
    gate_lower_bound: float | None = None
    replay_ring_len: int = REPLAY_RING_LEN
    num_nextn_predict_layers: int = 0


@dataclass
class Seqlen:
    input_lengths: torch.Tensor
    cu_seqlen_q: torch.Tensor

    @classmethod
    def from_lengths(cls, input_lengths: torch.Tensor) -> "Seqlen":
        cu_seqlen_q = torch.zeros(input_lengths.shape[0] + 1, dtype=torch.int32)
        cu_seqlen_q[1:] = torch.cumsum(input_lengths, -1)
        return cls(input_lengths, cu_seqlen_q)

    def tail_index(self, n: int) -> torch.Tensor:
        """Token index of each sequence's last ``n`` steps, ``[batch, n]``; -1 before its start."""
        index = self.cu_seqlen_q[1:, None] + torch.arange(-n, 0, dtype=torch.int32)[None, :]
        return torch.where(index >= self.cu_seqlen_q[:-1, None], index, -1)


class FastLinear(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    @classmethod
    def load(cls, config: KimiReplayConfig, prefix: str, weights: Weights) -> "FastLinear":
        return cls(weights.get_tensor(f"{prefix}.weight"))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight)


class FlashKimiDeltaAttention(nn.Module):
    def __init__(self, prefix: str, config: KimiReplayConfig, weights: Weights, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_heads
        self.num_k_heads = config.num_k_heads
        self.head_dim = config.head_dim
        self.ring_len = config.replay_ring_len
        self.lower_bound = config.gate_lower_bound
        self.softmax_scale = self.head_dim**-0.5
        self.qkv_proj = FastLinear.load(config, f"{prefix}.qkv_proj", weights)
        self.f_proj = FastLinear.load(config, f"{prefix}.f_proj", weights)
        self.b_proj = FastLinear.load(config, f"{prefix}.b_proj", weights)
        self.o_proj = FastLinear.load(config, f"{prefix}.o_proj", weights)
        # The decay parameters are stored in float32 and used as such.
        self.A_log = nn.Parameter(weights.get_tensor(f"{prefix}.A_log", to_dtype=False))
        self.dt_bias = nn.Parameter(weights.get_tensor(f"{prefix}.dt_bias", to_dtype=False))

    def log_decay(self, f: torch.Tensor) -> torch.Tensor:
        """Per-channel log-decay of each token, ``[tokens, num_heads, head_dim]``."""
        f = f.view(-1, self.num_heads, self.head_dim)
        if self.lower_bound is not None:
            # sigmoid gate: the log-decay stays within [lower_bound, 0]
            return self.lower_bound * torch.sigmoid(f)  # expect-bug: promotion
        A = self.A_log.exp().view(self.num_heads, 1)
        return -A * F.softplus(f + self.dt_bias.view(self.num_heads, self.head_dim))

    def prefill(
        self, hidden_states: torch.Tensor, seqlen: Seqlen
    ) -> tuple[torch.Tensor, ReplaySeed]:
        q_size = self.num_k_heads * self.head_dim
        _, k, v = self.qkv_proj(hidden_states).split(
            [q_size, q_size, self.num_heads * self.head_dim], -1
        )
        beta = torch.sigmoid(self.b_proj(hidden_states))
        g = self.log_decay(self.f_proj(hidden_states))
        d = v.view(-1, self.num_heads, self.head_dim) * beta[..., None]
        k = k.view(-1, self.num_k_heads, self.head_dim)

        tail = seqlen.tail_index(self.ring_len)
        index, valid = tail.clamp(min=0), (tail >= 0)[:, None, :, None]
        seed = ReplaySeed(
            d_cache=torch.where(valid, d[index].transpose(1, 2), 0.0),
            k_cache=torch.where(valid, k[index].transpose(1, 2), 0.0),
            g_cache=torch.where(valid, g[index].transpose(1, 2), 0.0),
        )
        return self.o_proj(d.flatten(1)), seed

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        slots: torch.Tensor,
        write_pos: torch.Tensor,
        initial_state: torch.Tensor,
        d_cache: torch.Tensor,
        k_cache: torch.Tensor,
        g_cache: torch.Tensor,
    ) -> torch.Tensor:
        out = hidden_states.new_empty(hidden_states.shape[0], self.num_heads, self.head_dim)
        out, _ = kda_replayssm_decode(
            self.qkv_proj(hidden_states),
            self.f_proj(hidden_states),
            self.b_proj(hidden_states),
            self.A_log,
            self.dt_bias,
            self.softmax_scale,
            initial_state,
            d_cache,
            k_cache,
            g_cache,
            out,
            slots,
            write_pos,
            use_qk_l2norm_in_kernel=True,
            lower_bound=self.lower_bound,
        )
        return self.o_proj(out.flatten(1))


class ReplayDraftHead(nn.Module):
    """MTP draft layer: proposes the speculative tokens with its own single-slot replay rings.

    The rings are buffers so that they follow the head from device to device.
    """

    def __init__(self, prefix: str, config: KimiReplayConfig, weights: Weights):
        super().__init__()
        shape = (1, config.num_heads, config.replay_ring_len, config.head_dim)
        k_shape = (1, config.num_k_heads, config.replay_ring_len, config.head_dim)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.proj = FastLinear.load(config, f"{prefix}.proj", weights)
        self.register_buffer("d_ring", torch.zeros(shape, dtype=weights.dtype), persistent=False)
        self.register_buffer("k_ring", torch.zeros(k_shape, dtype=weights.dtype), persistent=False)
        self.register_buffer("log_alpha", torch.zeros(shape, dtype=torch.float32), persistent=False)
        self.register_buffer("cursor", torch.zeros(1, dtype=torch.int32), persistent=False)


def load_draft_head(config: KimiReplayConfig, weights: Weights) -> ReplayDraftHead:
    head = ReplayDraftHead("mtp", config, weights)
    # Only the norm is built outside the checkpoint; it follows the serving dtype.
    head.norm.to(dtype=weights.dtype)
    return head


class FlashKimiForCausalLM(nn.Module):
    def __init__(self, prefix: str | None, config: KimiReplayConfig, weights: Weights):
        super().__init__()
        prefix = "model" if not prefix else f"{prefix}.model"
        embeddings = weights.get_tensor(f"{prefix}.embed_tokens.weight")
        self.embed_tokens = nn.Embedding.from_pretrained(embeddings)
        self.layers = nn.ModuleList()
        for i in range(config.num_hidden_layers):
            self.layers.append(
                FlashKimiDeltaAttention(f"{prefix}.layers.{i}.self_attn", config, weights, i)
            )
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.lm_head = FastLinear.load(config, "lm_head", weights)


def random_checkpoint(
    config: KimiReplayConfig, dtype: torch.dtype = torch.bfloat16
) -> dict[str, bytes]:
    """A one-shard checkpoint with the layout of the released Kimi Linear weights."""
    h, heads, k_heads, dim = (
        config.hidden_size,
        config.num_heads,
        config.num_k_heads,
        config.head_dim,
    )
    shapes = {"model.embed_tokens": (config.vocab_size, h), "lm_head": (config.vocab_size, h)}
    shapes["mtp.proj"] = (h, h)
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}.self_attn"
        shapes[f"{prefix}.qkv_proj"] = ((2 * k_heads + heads) * dim, h)
        shapes[f"{prefix}.f_proj"] = (heads * dim, h)
        shapes[f"{prefix}.b_proj"] = (heads, h)
        shapes[f"{prefix}.o_proj"] = (h, heads * dim)
    tensors = {f"{name}.weight": torch.randn(shape).to(dtype) for name, shape in shapes.items()}
    for i in range(config.num_hidden_layers):
        tensors[f"model.layers.{i}.self_attn.A_log"] = torch.log(torch.linspace(1.0, 4.0, heads))
        tensors[f"model.layers.{i}.self_attn.dt_bias"] = torch.zeros(heads * dim)
    return {"model-00001-of-00001.safetensors": save_tensors(tensors)}


def _prefill_seed(config: KimiReplayConfig) -> ReplaySeed:
    weights = Weights(random_checkpoint(config), device=torch.device("cpu"), dtype=torch.bfloat16)
    layer = FlashKimiDeltaAttention("model.layers.0.self_attn", config, weights, layer_id=0)
    lengths = torch.tensor([5, 2], dtype=torch.int32)
    hidden_states = torch.randn(int(lengths.sum()), config.hidden_size).to(torch.bfloat16)
    return layer.prefill(hidden_states, Seqlen.from_lengths(lengths))[1]


def build_prefill_seed() -> ReplaySeed:
    return _prefill_seed(KimiReplayConfig())


def build_prefill_seed_sigmoid_gate() -> ReplaySeed:
    return _prefill_seed(KimiReplayConfig(gate_lower_bound=-5.0))


def build_draft_head() -> ReplayDraftHead:
    config = KimiReplayConfig(num_nextn_predict_layers=1)
    weights = Weights(random_checkpoint(config), device=torch.device("cpu"), dtype=torch.bfloat16)
    return load_draft_head(config, weights)
