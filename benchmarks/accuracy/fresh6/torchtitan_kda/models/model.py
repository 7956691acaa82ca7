"""KDA transformer: attention layers that carry their own ReplaySSM decode rings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config_manager import TORCH_DTYPE_MAP
from ..ops import kda_replayssm_decode
from . import KDAModelArgs


class KDAAttention(nn.Module):
    def __init__(self, args: KDAModelArgs) -> None:
        super().__init__()
        self.args = args
        b, hv, hk, d, n = args.max_batch_size, args.n_v_heads, args.n_heads, args.head_dim, args.ring_len
        self.wqkv = nn.Linear(args.dim, args.qkv_dim, bias=False)
        self.wa = nn.Linear(args.dim, hv * d, bias=False)
        self.wb = nn.Linear(args.dim, hv, bias=False)
        self.wo = nn.Linear(hv * d, args.dim, bias=False)
        self.A_log = nn.Parameter(torch.empty(hv))
        self.dt_bias = nn.Parameter(torch.empty(hv * d))
        # Decode rings: persistent=False keeps them out of the weight checkpoints.
        self.register_buffer("state_buf", torch.empty(b, hv, d, d, dtype=torch.float32), persistent=False)
        self.register_buffer("d_buf", torch.empty(b, hv, n, d), persistent=False)
        self.register_buffer("k_buf", torch.empty(b, hk, n, d), persistent=False)
        self.register_buffer("decay_buf", torch.empty(b, hv, n, d), persistent=False)  # expect-bug: default-dtype id=titan-meta-default
        self.register_buffer("pos_buf", torch.empty(b, dtype=torch.long), persistent=False)

    def init_weights(self, init_std: float = 0.02) -> None:
        for linear in (self.wqkv, self.wa, self.wb, self.wo):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)
        self.A_log.copy_(torch.arange(1, self.A_log.numel() + 1, dtype=torch.float32).log())
        nn.init.constant_(self.dt_bias, -1.0)
        for buf in (self.state_buf, self.d_buf, self.k_buf, self.decay_buf, self.pos_buf):
            buf.zero_()

    def reset_cache(self, batch_size: int) -> None:
        a, dtype = self.args, TORCH_DTYPE_MAP[self.args.state_dtype]
        self.state_buf = torch.zeros(batch_size, a.n_v_heads, a.head_dim, a.head_dim, dtype=torch.float32)
        self.d_buf = torch.zeros(batch_size, a.n_v_heads, a.ring_len, a.head_dim, dtype=dtype)
        self.k_buf = torch.zeros(batch_size, a.n_heads, a.ring_len, a.head_dim, dtype=dtype)
        self.decay_buf = torch.zeros(batch_size, a.n_v_heads, a.ring_len, a.head_dim, dtype=dtype)  # expect-bug: imported-policy id=titan-args-state
        self.pos_buf = torch.zeros(batch_size, dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One decode step for ``x`` [batch, dim]; the rings are updated in place."""
        rows = torch.arange(x.size(0), device=x.device)
        out = x.new_empty(x.size(0), self.args.n_v_heads, self.args.head_dim)
        flush = self.pos_buf[: x.size(0)] == self.args.ring_len - 1
        kda_replayssm_decode(self.wqkv(x), self.wa(x), self.wb(x), self.A_log, self.dt_bias, self.args.head_dim**-0.5,
                             self.state_buf, self.d_buf, self.k_buf, self.decay_buf, out, rows, self.pos_buf[: x.size(0)], force_flush=flush)
        self.pos_buf[: x.size(0)] = (self.pos_buf[: x.size(0)] + 1) % self.args.ring_len
        return self.wo(out.flatten(1))

    def decode_static(self, x: torch.Tensor) -> torch.Tensor:
        """The decode step used under graph capture: one dtype for every ring input."""
        rows = torch.arange(x.size(0), device=x.device)
        out = torch.empty(x.size(0), self.args.n_v_heads, self.args.head_dim, dtype=self.d_buf.dtype)
        kda_replayssm_decode(self.wqkv(x), self.wa(x), self.wb(x), self.A_log, self.dt_bias, self.args.head_dim**-0.5,
                             self.state_buf, self.d_buf, self.k_buf, self.decay_buf.to(self.d_buf.dtype),  # expect-bug: decode-arg
                             out, rows, self.pos_buf[: x.size(0)])
        return self.wo(out.flatten(1).to(x.dtype))

    @torch.no_grad()
    def prefill(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rings for the last ``ring_len`` positions of ``x`` [batch, seq, dim]."""
        a = self.args
        tail = x[:, -a.ring_len :]
        gate = self.wa(tail).unflatten(-1, (a.n_v_heads, a.head_dim)) + self.dt_bias.view(a.n_v_heads, a.head_dim)
        forget_log = (-self.A_log.exp()[:, None] * F.softplus(gate)).transpose(1, 2)  # expect-bug: promotion
        _, k, v = self.wqkv(tail).split([a.n_heads * a.head_dim, a.n_heads * a.head_dim, a.n_v_heads * a.head_dim], -1)
        beta = torch.sigmoid(self.wb(tail)).transpose(1, 2)[..., None]
        delta = beta * v.unflatten(-1, (a.n_v_heads, a.head_dim)).transpose(1, 2)
        return {"delta": delta, "key": k.unflatten(-1, (a.n_heads, a.head_dim)).transpose(1, 2), "forget_log": forget_log}

    def fork_cache(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Copies of the rings of ``rows`` (for a prefix shared by several requests)."""
        decay = torch.empty_like(self.d_buf[rows])  # expect-bug: like
        decay.copy_(self.decay_buf[rows])
        return {"delta": self.d_buf[rows].clone(), "key": self.k_buf[rows].clone(), "forget_log": decay}


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: KDAModelArgs) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = KDAAttention(args)
        self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attention(self.attention_norm(x))

    def init_weights(self) -> None:
        self.attention_norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)


class Transformer(nn.Module):
    def __init__(self, args: KDAModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        nn.init.trunc_normal_(self.output.weight, std=self.args.dim**-0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def build_decode_steps() -> Transformer:
    model = Transformer(KDAModelArgs())
    model.init_weights()
    for tokens in ([1, 2], [3, 4], [5, 6]):
        model(torch.tensor(tokens))
    return model


def build_prefill_rings() -> dict[str, torch.Tensor]:
    model = Transformer(KDAModelArgs())
    model.init_weights()
    attention = model.layers["0"].attention
    for param in attention.parameters():
        param.data = param.data.to(torch.bfloat16)
    x = torch.linspace(-1.0, 1.0, 2 * 5 * 8).view(2, 5, 8).to(torch.bfloat16)
    return attention.prefill(x)
