# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Decoder building blocks: RMSNorm, the SwiGLU MLP, the decoder layer and the decoder."""

from typing import Any, List, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from tt_kda.utils import get_logger

log = get_logger()


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in float32 and cast back to the input dtype.

    Args:
        dim (int): size of the normalised (last) dimension.
        eps (float): added to the mean square for stability.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_fp32 = x.float()
        x_normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x_normed * self.scale.float()).type_as(x)


class FeedForward(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1(x)) * w3(x))``."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerSelfAttentionLayer(nn.Module):
    """Pre-norm decoder layer around a sequence mixer (here Kimi Delta Attention) and an MLP.

    Args:
        attn (nn.Module): the mixer; it must provide ``setup_cache``/``reset_cache`` and the
            ``kv_cache``/``cache_enabled`` attributes.
        mlp (nn.Module): the feed-forward block.
        sa_norm (Optional[nn.Module]): norm before the mixer.
        mlp_norm (Optional[nn.Module]): norm before the MLP.
    """

    def __init__(
        self,
        attn: nn.Module,
        mlp: nn.Module,
        *,
        sa_norm: Optional[nn.Module] = None,
        mlp_norm: Optional[nn.Module] = None,
    ) -> None:
        super().__init__()
        self.attn = attn
        self.mlp = mlp
        self.sa_norm = sa_norm or nn.Identity()
        self.mlp_norm = mlp_norm or nn.Identity()

    def setup_caches(
        self,
        batch_size: int,
        dtype: torch.dtype,
        *,
        encoder_max_seq_len: Optional[int] = None,
        decoder_max_seq_len: int,
        **cache_kwargs: Any,
    ) -> None:
        self.attn.setup_cache(batch_size, dtype, decoder_max_seq_len, **cache_kwargs)

    def caches_are_setup(self) -> bool:
        return self.attn.kv_cache is not None

    def caches_are_enabled(self) -> bool:
        return self.attn.cache_enabled

    def reset_cache(self) -> None:
        self.attn.reset_cache()

    def forward(self, x: torch.Tensor, *, input_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.attn(self.sa_norm(x), input_pos=input_pos) + x
        return h + self.mlp(self.mlp_norm(h))


class TransformerDecoder(nn.Module):
    """Token embeddings, a stack of decoder layers, a final norm and the output projection.

    Args:
        tok_embeddings (nn.Embedding): token embeddings.
        layers (Union[nn.Module, List[nn.Module], nn.ModuleList]): the decoder layers.
        max_seq_len (int): longest sequence the model is used with.
        norm (nn.Module): final norm.
        output (nn.Linear): projection to the vocabulary.
    """

    def __init__(
        self,
        *,
        tok_embeddings: nn.Embedding,
        layers: Union[nn.Module, List[nn.Module], nn.ModuleList],
        max_seq_len: int,
        norm: nn.Module,
        output: nn.Linear,
    ) -> None:
        super().__init__()
        if isinstance(layers, nn.Module) and not isinstance(layers, nn.ModuleList):
            layers = [layers]
        self.tok_embeddings = tok_embeddings
        self.layers = nn.ModuleList(layers)
        self.max_seq_len = max_seq_len
        self.norm = norm
        self.output = output
        self.decoder_max_cache_seq_len: Optional[int] = None

    def setup_caches(
        self,
        batch_size: int,
        dtype: torch.dtype,
        *,
        encoder_max_seq_len: Optional[int] = None,
        decoder_max_seq_len: Optional[int] = None,
        **cache_kwargs: Any,
    ) -> None:
        """Sets up the decode cache of every layer.

        Args:
            batch_size (int): number of sequences decoded together.
            dtype (torch.dtype): compute dtype of the caches.
            encoder_max_seq_len (Optional[int]): unused (decoder-only model).
            decoder_max_seq_len (Optional[int]): longest decoded sequence; defaults to
                ``max_seq_len``.
            **cache_kwargs: passed on to each layer's ``setup_cache``.
        """
        self.decoder_max_cache_seq_len = decoder_max_seq_len or self.max_seq_len
        for layer in self.layers:
            layer.setup_caches(
                batch_size,
                dtype,
                encoder_max_seq_len=encoder_max_seq_len,
                decoder_max_seq_len=self.decoder_max_cache_seq_len,
                **cache_kwargs,
            )

    def caches_are_setup(self) -> bool:
        return self.layers[0].caches_are_setup()

    def caches_are_enabled(self) -> bool:
        return self.layers[0].caches_are_enabled()

    def reset_caches(self) -> None:
        if not self.caches_are_enabled():
            raise RuntimeError("Key value caches are not setup. Call model.setup_caches() first.")
        for layer in self.layers:
            layer.reset_cache()

    def forward(
        self, tokens: torch.Tensor, *, input_pos: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Logits ``[b, s, vocab]`` (float32) for ``tokens`` ``[b, s]``."""
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, input_pos=input_pos)
        return self.output(self.norm(h)).float()
