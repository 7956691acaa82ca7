import torch
from torch import nn

from .attention import KimiDeltaAttention, kda_attention
from .replay_cache import KDADecodeConfig, ReplayCache
from .training import set_default_dtype


class KDATransformerLayer(nn.Module):
    """Transformer layer: a KDA token mixer and an MLP, each behind an RMSNorm."""

    def __init__(self, attn: KimiDeltaAttention, mlp: nn.Module, embed_dim: int) -> None:
        super().__init__()
        self.sa_norm = nn.RMSNorm(embed_dim)
        self.attn = attn
        self.mlp_norm = nn.RMSNorm(embed_dim)
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn(self.sa_norm(x)) + x
        return self.mlp(self.mlp_norm(h)) + h


class TransformerDecoder(nn.Module):
    """Decoder of KDA layers (``torchtune.modules.TransformerDecoder`` layout)."""

    def __init__(
        self,
        *,
        tok_embeddings: nn.Embedding,
        layers: list[KDATransformerLayer],
        norm: nn.Module,
        output: nn.Linear,
    ) -> None:
        super().__init__()
        self.tok_embeddings = tok_embeddings
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.output = output

    def setup_caches(
        self,
        batch_size: int,
        dtype: torch.dtype,
        *,
        decoder_max_seq_len: int | None = None,
        gate_dtype: torch.dtype | None = None,
    ) -> None:
        """Sets up the decode caches of every KDA layer (``decoder_max_seq_len`` is unused: the
        rings have a fixed length)."""
        for layer in self.layers:
            layer.attn.setup_cache(batch_size, dtype, gate_dtype=gate_dtype)

    def replay_caches(self) -> list[ReplayCache]:
        return [layer.attn.kv_cache for layer in self.layers if layer.attn.kv_cache is not None]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step: ``tokens`` [b x 1] -> logits [b x 1 x vocab_size]."""
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def kimi_linear(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_k_heads: int,
    embed_dim: int,
    head_dim: int,
    intermediate_dim: int,
    decode_cfg: KDADecodeConfig,
) -> TransformerDecoder:
    """Component builder of a Kimi-Linear decoder made of KDA layers only."""
    layers = []
    for _ in range(num_layers):
        attn = kda_attention(embed_dim, num_heads, num_k_heads, head_dim, decode_cfg=decode_cfg)
        mlp = nn.Sequential(
            nn.Linear(embed_dim, intermediate_dim, bias=False),
            nn.SiLU(),
            nn.Linear(intermediate_dim, embed_dim, bias=False),
        )
        layers.append(KDATransformerLayer(attn, mlp, embed_dim))
    return TransformerDecoder(
        tok_embeddings=nn.Embedding(vocab_size, embed_dim),
        layers=layers,
        norm=nn.RMSNorm(embed_dim),
        output=nn.Linear(embed_dim, vocab_size, bias=False),
    )


def _kimi_linear_tiny(decode_cfg: KDADecodeConfig) -> TransformerDecoder:
    return kimi_linear(
        32, 2, 2, 1, embed_dim=8, head_dim=4, intermediate_dim=16, decode_cfg=decode_cfg
    )


def kimi_linear_tiny() -> TransformerDecoder:
    """Builder for a two-layer Kimi-Linear model, for tests and examples."""
    return _kimi_linear_tiny(KDADecodeConfig(ring_len=4, gate_dtype=torch.float32))


def kimi_linear_tiny_bounded() -> TransformerDecoder:
    """``kimi_linear_tiny`` with longer rings and lower-bounded log-decays."""
    return _kimi_linear_tiny(KDADecodeConfig(ring_len=8, lower_bound=-5.0))


def build_tiny_caches() -> TransformerDecoder:
    model = kimi_linear_tiny()
    model.setup_caches(batch_size=2, dtype=torch.bfloat16)
    return model


def build_bounded_caches() -> TransformerDecoder:
    model = kimi_linear_tiny_bounded()
    model.setup_caches(batch_size=2, dtype=torch.bfloat16)
    return model


def build_tiny_caches_in_bf16() -> TransformerDecoder:
    with set_default_dtype(torch.bfloat16):
        model = kimi_linear_tiny()
        model.setup_caches(batch_size=2, dtype=torch.bfloat16)
    return model
