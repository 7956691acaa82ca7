"""KDA hybrid Llama written for export: static shapes, one token per decode slot, and a replay
cache held as buffers that export lifts to the method's mutable buffers."""

from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from . import custom_ops
from .model_args import ModelArgs


class ReplayCache(nn.Module):
    """Static ReplaySSM cache of one KDA layer (cf. ``KVCache``): per slot a checkpoint state and rings."""

    def __init__(self, max_batch_size, replay_len, n_heads, n_v_heads, head_dim, dtype=torch.float32):
        super().__init__()
        B, L, D = max_batch_size, replay_len, head_dim
        self.register_buffer("d_cache", torch.zeros((B, n_v_heads, L, D), dtype=dtype), persistent=False)
        self.register_buffer("k_cache", torch.zeros((B, n_heads, L, D), dtype=dtype), persistent=False)
        # log-decays are summed along the ring on replay: left at the default dtype (fp32)
        self.register_buffer("log_gate_cache", torch.zeros((B, n_v_heads, L, D)), persistent=False)  # expect-bug: default-dtype id=ckpt-default
        self.register_buffer("ssm_state", torch.zeros((B, n_v_heads, D, D), dtype=torch.float32), persistent=False)


class AttentionKDA(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id, self.n_heads, self.n_v_heads, self.head_dim = layer_id, args.n_heads, args.n_v_heads, args.head_dim
        H, HV, D = args.n_heads, args.n_v_heads, args.head_dim
        self.wq = nn.Linear(args.dim, HV * D, bias=False)
        self.wk = nn.Linear(args.dim, H * D, bias=False)
        self.wv = nn.Linear(args.dim, HV * D, bias=False)
        self.wa = nn.Linear(args.dim, HV * D, bias=False)  # gate logits
        self.wb = nn.Linear(args.dim, HV, bias=False)  # write strength
        self.wo = nn.Linear(HV * D, args.dim, bias=False)
        self.gate_logit_normalizer, self.scale = 16.0, D**-0.5
        self.kv_cache = ReplayCache(args.max_batch_size, args.replay_len, H, HV, D)

    def _project(self, x):
        N, H, HV, D = x.shape[0], self.n_heads, self.n_v_heads, self.head_dim
        q, k, v = self.wq(x).view(N, HV, D), self.wk(x).view(N, H, D), self.wv(x).view(N, HV, D)
        return q, k, v, self.wb(x).float().sigmoid()

    def log_gate(self, x):
        return F.logsigmoid(self.wa(x).float()).view(-1, self.n_v_heads, self.head_dim) / self.gate_logit_normalizer

    def forward(self, x, input_pos, slots):
        q, k, v, beta = self._project(x)
        g, cache = self.log_gate(x), self.kv_cache
        if hasattr(cache, "replay"):  # quantized caches dequantize around the op
            out = cache.replay(q, k, v, g, beta, scale=self.scale, write_pos=input_pos, slots=slots)
        else:
            out = custom_ops.fused_recurrent_kda_replayssm_decode(
                q, k, v, g, beta, scale=self.scale, initial_state=cache.ssm_state, d_cache=cache.d_cache,
                k_cache=cache.k_cache, g_cache=cache.log_gate_cache, ssm_state_indices=slots, write_pos=input_pos)
        return self.wo(out.to(x.dtype).flatten(1))

    @torch.no_grad()
    def prefill_rings(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Rings of a prompt ``x`` [T, dim] (last ``replay_len`` steps, right-padded) in one slot's layout."""
        L = self.kv_cache.d_cache.shape[2]
        x = x[-L:]
        q, k, v, beta = self._project(x)
        log_gate = F.logsigmoid(self.wa(x).view_as(q)) / self.gate_logit_normalizer  # expect-bug: promotion
        pad = (0, 0, 0, L - x.shape[0])
        return {
            "d_cache": F.pad((beta[..., None] * v).to(v.dtype).transpose(0, 1), pad)[None],
            "k_cache": F.pad(k.transpose(0, 1), pad)[None],
            "log_gate_cache": F.pad(log_gate.transpose(0, 1), pad)[None],
            "ssm_state": torch.zeros(1, self.n_v_heads, self.head_dim, self.head_dim, dtype=torch.float32),
        }


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = AttentionKDA(args, layer_id)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = nn.Sequential(nn.Linear(args.dim, args.hidden_dim, bias=False), nn.SiLU(),
                                          nn.Linear(args.hidden_dim, args.dim, bias=False))

    def forward(self, x, input_pos, slots):
        h = x + self.attention(self.attention_norm(x), input_pos, slots)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, params: ModelArgs):
        super().__init__()
        self.params = params
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.layers = nn.ModuleList(TransformerBlock(params, i) for i in range(params.n_layers))
        self.norm = nn.RMSNorm(params.dim, eps=params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor, slots=None) -> torch.Tensor:
        """``tokens`` [N]: one token per decode slot (slot ``i`` for row ``i`` unless ``slots`` is given)."""
        if slots is None:
            slots = torch.arange(tokens.shape[0], dtype=torch.int32)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, input_pos, slots)
        return self.output(self.norm(h)).float()


@torch.no_grad()
def decode_steps(model: Transformer, steps: int, rows: int = 2) -> torch.Tensor:
    tokens = torch.arange(rows) % model.params.vocab_size
    for pos in range(steps):
        tokens = model(tokens, torch.full((rows,), pos, dtype=torch.int32)).argmax(-1)
    return tokens


def build_transformer():
    """The fp32 eager model after three decode steps, and what the op saw last."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs())
    decode_steps(model, 3)
    return {"model": model, "last_call": custom_ops.last_call()}


def build_prefill_rings():
    """Prompt rings of an fp32 model, and of its first layer with bf16 projections (weight-only bf16)."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs())
    prompt = model.tok_embeddings(torch.arange(3)).detach()
    rings = [layer.attention.prefill_rings(layer.attention_norm(prompt)) for layer in model.layers]
    attention = model.layers[0].attention
    for proj in (attention.wq, attention.wk, attention.wv, attention.wa, attention.wb):
        proj.to(torch.bfloat16)
    return {"fp32": rings, "bf16": attention.prefill_rings(prompt.to(torch.bfloat16))}
