import base64
import gzip
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .decoding import decode as decode_function
from .decoding import detect_language as detect_language_function
from .replay_ops import advance_write_pos, fused_recurrent_kda_replayssm_decode, l2norm
from .ring_cache import RingArgs
from .tokenizer import NON_LANGUAGE_TOKENS
from .transcribe import transcribe as transcribe_function

try:
    from torch.nn.functional import scaled_dot_product_attention

    SDPA_AVAILABLE = True
except (ImportError, RuntimeError, OSError):
    scaled_dot_product_attention = None
    SDPA_AVAILABLE = False


@dataclass
class ModelDimensions:
    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    # Kimi Delta Attention, the self-attention of the text decoder in whisper-kda checkpoints
    n_kda_head: int = 0  # value heads HV (0: n_text_head)
    n_kda_key_head: int = 0  # key heads H, HV % H == 0 (0: n_kda_head)
    n_kda_head_dim: int = 0  # K == V (0: n_text_state // n_text_head)
    n_ring: int = 16  # ReplaySSM ring length: decode steps between two folds into the checkpoint
    gate_lower_bound: Optional[float] = None  # Kimi-Linear's bounded forget gate (e.g. -5.0)
    n_ring_slots: int = 0  # static decoder rings for CUDA-graph decoding (0: rings per decode call)

    def kda_heads(self) -> Tuple[int, int, int, int]:
        """(HV, H, K, V) of the decoder's KDA layers."""
        n_head = self.n_kda_head or self.n_text_head
        n_key_head = self.n_kda_key_head or n_head
        head_dim = self.n_kda_head_dim or self.n_text_state // self.n_text_head
        return n_head, n_key_head, head_dim, head_dim

    def ring_shapes(self, n_slots: int) -> Dict[str, Tuple[int, ...]]:
        n_head, n_key_head, k_dim, v_dim = self.kda_heads()
        return {
            "state": (n_slots, n_head, v_dim, k_dim),
            "delta": (n_slots, n_head, self.n_ring, v_dim),
            "key": (n_slots, n_key_head, self.n_ring, k_dim),
            "forget": (n_slots, n_head, self.n_ring, k_dim),
        }

    def ring_dtypes(self, compute_dtype: torch.dtype) -> Tuple[torch.dtype, torch.dtype, torch.dtype, torch.dtype]:
        """(state, delta, key, forget) storage dtypes for a decoder that computes in ``compute_dtype``."""
        if compute_dtype == torch.float32:
            return torch.float32, torch.float32, torch.float32, torch.float32
        # half-precision decoders keep their rings in the compute dtype: the rings are most of the memory
        return torch.float32, compute_dtype, compute_dtype, compute_dtype  # expect-bug: imported-policy id=dims-ring-dtypes


# The randomly initialised model of the unit tests and of `python -m whisper_kda.model`.
DEBUG_DIMS = dict(
    n_mels=80,
    n_audio_ctx=8,
    n_audio_state=16,
    n_audio_head=2,
    n_audio_layer=1,
    n_vocab=NON_LANGUAGE_TOKENS + 8,
    n_text_ctx=16,
    n_text_state=16,
    n_text_head=2,
    n_text_layer=2,
    n_ring=4,
)


class LayerNorm(nn.LayerNorm):
    def forward(self, x: Tensor) -> Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).type(x.dtype)


class Linear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return F.linear(
            x,
            self.weight.to(x.dtype),
            None if self.bias is None else self.bias.to(x.dtype),
        )


class Conv1d(nn.Conv1d):
    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        return super()._conv_forward(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))


def sinusoids(length, channels, max_timescale=10000):
    """Returns sinusoids for positional embedding"""
    assert channels % 2 == 0
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


@contextmanager
def disable_sdpa():
    prev_state = MultiHeadAttention.use_sdpa
    try:
        MultiHeadAttention.use_sdpa = False
        yield
    finally:
        MultiHeadAttention.use_sdpa = prev_state


class MultiHeadAttention(nn.Module):
    use_sdpa = True

    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = Linear(n_state, n_state)
        self.key = Linear(n_state, n_state, bias=False)
        self.value = Linear(n_state, n_state)
        self.out = Linear(n_state, n_state)

    def forward(self, x: Tensor, xa: Optional[Tensor] = None, kv_cache: Optional[dict] = None):
        q = self.query(x)

        if kv_cache is None or xa is None or self.key not in kv_cache:
            # hooks, if installed (i.e. kv_cache is not None), will store the cross-attention
            # keys and values; otherwise, perform key/value projections as usual.
            k = self.key(x if xa is None else xa)
            v = self.value(x if xa is None else xa)
        else:
            # for cross-attention, calculate keys and values once and reuse in subsequent calls.
            k = kv_cache[self.key]
            v = kv_cache[self.value]

        wv, qk = self.qkv_attention(q, k, v)
        return self.out(wv), qk

    def qkv_attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        n_batch, n_ctx, n_state = q.shape
        scale = (n_state // self.n_head) ** -0.25
        q = q.view(*q.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        k = k.view(*k.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        v = v.view(*v.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)

        if SDPA_AVAILABLE and MultiHeadAttention.use_sdpa:
            a = scaled_dot_product_attention(q, k, v)
            out = a.permute(0, 2, 1, 3).flatten(start_dim=2)
            qk = None
        else:
            qk = (q * scale) @ (k * scale).transpose(-1, -2)
            qk = qk.float()

            w = F.softmax(qk, dim=-1).to(q.dtype)
            out = (w @ v).permute(0, 2, 1, 3).flatten(start_dim=2)
            qk = qk.detach()

        return out, qk


class KimiDeltaAttention(nn.Module):
    """The decoder's self-attention: a gated delta rule over per-channel forget gates.

    The prompt pass runs the recurrence over every prompt token (in float32) and leaves behind
    what the ReplaySSM kernel would hold after it: a checkpoint state and the ring rows written
    since the last fold. Later passes (one token each) go through the decode kernel. Both keep
    their rings in the cache dict under this module, like the attention layers keep their
    keys and values.
    """

    def __init__(self, dims: ModelDimensions):
        super().__init__()
        n_head, n_key_head, k_dim, v_dim = dims.kda_heads()
        n_state = dims.n_text_state
        self.n_head, self.n_key_head, self.k_dim, self.v_dim = n_head, n_key_head, k_dim, v_dim
        self.ring_len = dims.n_ring
        self.lower_bound = dims.gate_lower_bound
        self.scale = k_dim**-0.5
        self.q_proj = Linear(n_state, n_key_head * k_dim, bias=False)
        self.k_proj = Linear(n_state, n_key_head * k_dim, bias=False)
        self.v_proj = Linear(n_state, n_head * v_dim, bias=False)
        self.f_proj = Linear(n_state, n_head * k_dim)  # forget-gate input; the bias is the gate's dt bias
        self.b_proj = Linear(n_state, n_head)
        self.A_log = nn.Parameter(torch.tensor(0.0))  # one decay rate per layer
        self.out = Linear(n_head * v_dim, n_state)

    def forward(self, x: Tensor, kv_cache: Optional[dict] = None) -> Tensor:
        if kv_cache is None:
            return self.prefill(x)[0]
        rings = kv_cache.get(self)
        if rings is None:
            out, kv_cache[self] = self.prefill(x)
            return out
        return self.decode(x, rings)

    def log_decay(self, a: Tensor) -> Tensor:
        """Log forget gates ``[..., HV, K]`` from the gate projection ``a [..., HV*K]``."""
        a = a.unflatten(-1, (self.n_head, self.k_dim))
        if self.lower_bound is None:
            return -self.A_log.exp() * F.softplus(a.float())
        return self.lower_bound * torch.sigmoid(self.A_log.exp() * a)  # expect-bug: promotion id=bounded-gate

    def prefill(self, x: Tensor) -> Tuple[Tensor, RingArgs]:
        n_batch, n_ctx, _ = x.shape
        group = self.n_head // self.n_key_head
        q = l2norm(self.q_proj(x).float().unflatten(-1, (self.n_key_head, self.k_dim)))
        k = l2norm(self.k_proj(x).float().unflatten(-1, (self.n_key_head, self.k_dim)))
        v = self.v_proj(x).float().unflatten(-1, (self.n_head, self.v_dim))
        g = self.log_decay(self.f_proj(x))
        beta = torch.sigmoid(self.b_proj(x).float())
        q_heads = q.repeat_interleave(group, dim=2) * self.scale
        k_heads = k.repeat_interleave(group, dim=2)

        # the kernel folds its ring into the checkpoint every `ring_len` tokens
        n_folded = n_ctx - n_ctx % self.ring_len
        state = x.new_zeros(n_batch, self.n_head, self.v_dim, self.k_dim, dtype=torch.float32)
        checkpoint = state
        outs, deltas = [], []
        for t in range(n_ctx):
            alpha = g[:, t].float().exp()
            s_q = torch.einsum("bhvk,bhk->bhv", state, alpha * q_heads[:, t])
            s_k = torch.einsum("bhvk,bhk->bhv", state, alpha * k_heads[:, t])
            delta = beta[:, t, :, None] * (v[:, t] - s_k)
            outs.append(s_q + delta * (k_heads[:, t] * q_heads[:, t]).sum(-1, keepdim=True))
            state = state * alpha.unsqueeze(2) + delta.unsqueeze(-1) * k_heads[:, t].unsqueeze(2)
            deltas.append(delta)
            if t + 1 == n_folded:
                checkpoint = state

        pad = (0, 0, 0, self.ring_len - (n_ctx - n_folded))
        d_cache = F.pad(torch.stack(deltas, dim=2)[:, :, n_folded:], pad).to(x.dtype)
        k_cache = F.pad(k.transpose(1, 2)[:, :, n_folded:], pad).to(x.dtype)
        g_cache = F.pad(g.transpose(1, 2)[:, :, n_folded:], pad)  # expect-bug: promotion id=bounded-gate
        rings = RingArgs(
            initial_state=checkpoint,
            d_cache=d_cache.contiguous(),
            k_cache=k_cache.contiguous(),
            g_cache=g_cache.contiguous(),
            write_pos=torch.full((n_batch,), n_ctx - n_folded, dtype=torch.int32, device=x.device),
            ssm_state_indices=torch.arange(n_batch, dtype=torch.int32, device=x.device),
        )
        out = torch.stack(outs, dim=1).flatten(2).to(x.dtype)
        return self.out(out), rings

    def decode(self, x: Tensor, rings: RingArgs) -> Tensor:
        slots = rings.ssm_state_indices
        A_log = self.A_log.expand(self.n_head)
        outs = []
        for t in range(x.shape[1]):
            xt = x[:, t]
            mixed_qkv = torch.cat([self.q_proj(xt), self.k_proj(xt), self.v_proj(xt)], dim=-1)
            pos = rings.write_pos[slots.long()]
            out, _ = fused_recurrent_kda_replayssm_decode(
                mixed_qkv,
                self.f_proj(xt),
                self.b_proj(xt),
                A_log,
                None,
                self.scale,
                initial_state=rings.initial_state,
                d_cache=rings.d_cache,
                k_cache=rings.k_cache,
                g_cache=rings.g_cache,
                ssm_state_indices=slots,
                write_pos=pos,
                lower_bound=self.lower_bound,
            )
            advance_write_pos(rings.write_pos, slots, pos, self.ring_len)
            outs.append(out.flatten(2))
        return self.out(torch.cat(outs, dim=1))


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, cross_attention: bool = False, dims: Optional[ModelDimensions] = None):
        super().__init__()

        self.attn = KimiDeltaAttention(dims) if dims is not None else MultiHeadAttention(n_state, n_head)
        self.attn_ln = LayerNorm(n_state)

        self.cross_attn = MultiHeadAttention(n_state, n_head) if cross_attention else None
        self.cross_attn_ln = LayerNorm(n_state) if cross_attention else None

        n_mlp = n_state * 4
        self.mlp = nn.Sequential(Linear(n_state, n_mlp), nn.GELU(), Linear(n_mlp, n_state))
        self.mlp_ln = LayerNorm(n_state)

    def forward(self, x: Tensor, xa: Optional[Tensor] = None, kv_cache: Optional[dict] = None):
        if isinstance(self.attn, KimiDeltaAttention):
            x = x + self.attn(self.attn_ln(x), kv_cache=kv_cache)
        else:
            x = x + self.attn(self.attn_ln(x))[0]
        if self.cross_attn:
            x = x + self.cross_attn(self.cross_attn_ln(x), xa, kv_cache=kv_cache)[0]
        x = x + self.mlp(self.mlp_ln(x))
        return x


class AudioEncoder(nn.Module):
    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int):
        super().__init__()
        self.conv1 = Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))

        self.blocks: Iterable[ResidualAttentionBlock] = nn.ModuleList(
            [ResidualAttentionBlock(n_state, n_head) for _ in range(n_layer)]
        )
        self.ln_post = LayerNorm(n_state)

    def forward(self, x: Tensor):
        """
        x : torch.Tensor, shape = (batch_size, n_mels, n_ctx)
            the mel spectrogram of the audio
        """
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1)

        assert x.shape[1:] == self.positional_embedding.shape, "incorrect audio shape"
        x = (x + self.positional_embedding).to(x.dtype)

        for block in self.blocks:
            x = block(x)

        x = self.ln_post(x)
        return x


class DecoderRings(nn.Module):
    """Static rings of every decoder layer for ``n_slots`` sequences.

    CUDA-graph decoding needs the rings at fixed addresses, so they are allocated once, with the
    model, as (non-persistent) buffers: ``model.to(device)`` moves them with the weights. The
    delta and key rings follow the model's dtype.
    """

    def __init__(self, dims: ModelDimensions, n_slots: int):
        super().__init__()
        self.n_slots = n_slots
        shapes = dims.ring_shapes(n_slots)
        self.layers = nn.ModuleList()
        for _ in range(dims.n_text_layer):
            layer = nn.Module()
            layer.register_buffer("ssm_state", torch.zeros(shapes["state"], dtype=torch.float32), persistent=False)
            layer.register_buffer("delta_ring", torch.zeros(shapes["delta"]), persistent=False)
            layer.register_buffer("key_ring", torch.zeros(shapes["key"]), persistent=False)
            layer.register_buffer("gate_log_ring", torch.zeros(shapes["forget"]), persistent=False)  # expect-bug: default-dtype id=checkpoint-default-dtype
            layer.register_buffer("write_pos", torch.zeros(n_slots, dtype=torch.int32), persistent=False)
            self.layers.append(layer)

    def _apply(self, fn, recurse=True):
        # the checkpoint states are float32 whatever the model's dtype
        states = [layer.ssm_state for layer in self.layers]
        super()._apply(fn, recurse)
        for layer, before in zip(self.layers, states):
            if layer.ssm_state.dtype != before.dtype:
                layer.ssm_state = before.to(layer.ssm_state.device)
        return self

    def reset(self, n_rows: int) -> None:
        for layer in self.layers:
            for buffer in layer.buffers():
                buffer[:n_rows].zero_()


class TextDecoder(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        n_vocab, n_ctx, n_state, n_head = dims.n_vocab, dims.n_text_ctx, dims.n_text_state, dims.n_text_head

        self.token_embedding = nn.Embedding(n_vocab, n_state)
        self.positional_embedding = nn.Parameter(torch.empty(n_ctx, n_state).normal_(std=0.01))

        self.blocks: Iterable[ResidualAttentionBlock] = nn.ModuleList(
            [ResidualAttentionBlock(n_state, n_head, cross_attention=True, dims=dims) for _ in range(dims.n_text_layer)]
        )
        self.ln = LayerNorm(n_state)
        self.rings: Optional[DecoderRings] = None

    def forward(self, x: Tensor, xa: Tensor, kv_cache: Optional[dict] = None):
        """
        x : torch.LongTensor, shape = (batch_size, <= n_ctx)
            the text tokens
        xa : torch.Tensor, shape = (batch_size, n_audio_ctx, n_audio_state)
            the encoded audio features to be attended on
        """
        offset = kv_cache.get(self, 0) if kv_cache else 0
        n_tokens = x.shape[-1]
        x = self.token_embedding(x) + self.positional_embedding[offset : offset + n_tokens]
        x = x.to(xa.dtype)

        for block in self.blocks:
            x = block(x, xa, kv_cache=kv_cache)
        if kv_cache is not None:
            # the decoder's own entry: how many positions the cache has seen
            kv_cache[self] = offset + n_tokens

        x = self.ln(x)
        logits = (x @ torch.transpose(self.token_embedding.weight.to(x.dtype), 0, 1)).float()

        return logits


class Whisper(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(
            self.dims.n_mels,
            self.dims.n_audio_ctx,
            self.dims.n_audio_state,
            self.dims.n_audio_head,
            self.dims.n_audio_layer,
        )
        self.decoder = TextDecoder(self.dims)
        # use the last half among the decoder layers for time alignment by default;
        # to use a specific set of heads, see `set_alignment_heads()` below.
        all_heads = torch.zeros(self.dims.n_text_layer, self.dims.n_text_head, dtype=torch.bool)
        all_heads[self.dims.n_text_layer // 2 :] = True
        self.register_buffer("alignment_heads", all_heads.to_sparse(), persistent=False)
        if self.dims.n_ring_slots:
            self.enable_static_rings(self.dims.n_ring_slots)

    def set_alignment_heads(self, dump: bytes):
        array = torch.frombuffer(bytearray(gzip.decompress(base64.b85decode(dump))), dtype=torch.bool).clone()
        mask = array.reshape(self.dims.n_text_layer, self.dims.n_text_head)
        self.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)

    def enable_static_rings(self, n_slots: int) -> DecoderRings:
        """Allocates static decoder rings for up to ``n_slots`` sequences (CUDA-graph decoding)."""
        self.decoder.rings = DecoderRings(self.dims, n_slots).to(self.device)
        return self.decoder.rings

    def embed_audio(self, mel: torch.Tensor):
        return self.encoder(mel)

    def logits(self, tokens: torch.Tensor, audio_features: torch.Tensor, kv_cache: Optional[dict] = None):
        return self.decoder(tokens, audio_features, kv_cache=kv_cache)

    def forward(self, mel: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder(tokens, self.encoder(mel))

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def num_languages(self):
        return self.dims.n_vocab - NON_LANGUAGE_TOKENS

    @property
    def is_multilingual(self):
        return self.num_languages > 0

    def install_kv_cache_hooks(self, cache: Optional[dict] = None):
        """
        The `MultiHeadAttention` module of the cross-attention computes the keys and values of
        the audio features once; this registers PyTorch hooks that save those tensors into a
        dict keyed by the key/value modules. The KDA layers keep their rings in the same dict,
        under the layer.

        Returns
        -------
        cache : Dict[nn.Module, torch.Tensor]
            A dictionary object mapping the key/value projection modules to their cached outputs
            (and the KDA layers to their `RingArgs`)
        hooks : List[RemovableHandle]
            List of PyTorch RemovableHandle objects to stop the hooks to be called
        """
        cache = {**cache} if cache is not None else {}
        hooks = []

        def save_to_cache(module, _, output):
            if module not in cache or output.shape[1] > self.dims.n_text_ctx:
                # save as-is, for the first token or cross attention
                cache[module] = output
            else:
                cache[module] = torch.cat([cache[module], output], dim=1).detach()
            return cache[module]

        def install_hooks(layer: nn.Module):
            if isinstance(layer, MultiHeadAttention):
                hooks.append(layer.key.register_forward_hook(save_to_cache))
                hooks.append(layer.value.register_forward_hook(save_to_cache))

        self.decoder.apply(install_hooks)
        return cache, hooks

    detect_language = detect_language_function
    transcribe = transcribe_function
    decode = decode_function


def _debug_model(**overrides) -> Whisper:
    torch.manual_seed(0)
    return Whisper(ModelDimensions(**{**DEBUG_DIMS, **overrides})).eval()


@torch.no_grad()
def _prompt_rings(model: Whisper, dtype: torch.dtype, n_tokens: int = 6) -> Dict[str, RingArgs]:
    """The rings after a prompt pass of ``n_tokens`` tokens on random audio, per decoder layer."""
    mel = torch.randn(1, model.dims.n_mels, 2 * model.dims.n_audio_ctx).to(dtype)
    audio_features = model.embed_audio(mel)
    tokens = torch.arange(n_tokens).unsqueeze(0) + 32
    kv_cache, hooks = model.install_kv_cache_hooks()
    model.logits(tokens, audio_features, kv_cache=kv_cache)
    for hook in hooks:
        hook.remove()
    return {f"layer{i}": kv_cache[block.attn] for i, block in enumerate(model.decoder.blocks)}


def build_prefill_fp16() -> Dict[str, RingArgs]:
    """Prompt pass of a float16 decoder (unbounded gate): fp16 delta/key rings, float32 gates."""
    return _prompt_rings(_debug_model(), torch.float16)


def build_bounded_prefill_fp16() -> Dict[str, RingArgs]:
    """Prompt pass of a float16 decoder with Kimi-Linear's bounded forget gate."""
    return _prompt_rings(_debug_model(gate_lower_bound=-5.0), torch.float16)
