"""Decoder-only stack of Kimi Delta Attention layers with ReplaySSM ring caches.

``self.state["cache"]`` holds one dict per layer with the checkpoint ``ssm_state``, the
delta/key rings ``delta_mem``/``key_mem``, the log-decay ring ``log_forget`` and the int32
``write_pos`` cursors, batch-first so that ``map_state`` can tile and reorder them. Slot caches
(``attach_slots``) keep long-lived sequences, which decode on them by slot index.
"""

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from onmt_kda.modules import replayssm
from onmt_kda.utils import misc

RING_KEYS = ("delta_mem", "key_mem", "log_forget")


class Embeddings(nn.Module):
    def __init__(self, word_vec_size, word_vocab_size, word_padding_idx):
        super().__init__()
        self.word_lut = nn.Embedding(word_vocab_size, word_vec_size, padding_idx=word_padding_idx)

    def forward(self, source, step=None):
        return self.word_lut(source)


class ReplayRings(NamedTuple):
    """The cache tensors of one decode step, under the op's argument names."""

    state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor

    @classmethod
    def from_cache(cls, c):
        return cls(c["ssm_state"], c["delta_mem"], c["key_mem"], c["log_forget"], c["write_pos"])


class KDADecoderLayer(nn.Module):
    def __init__(self, d_model, heads, v_heads, head_dim, v_head_dim, d_ff):
        super().__init__()
        self.heads, self.v_heads, self.head_dim, self.v_head_dim = heads, v_heads, head_dim, v_head_dim
        self.layer_norm_1 = nn.LayerNorm(d_model, eps=1e-6)
        self.qkv = nn.Linear(d_model, 2 * heads * head_dim + v_heads * v_head_dim, bias=False)
        self.a_proj = nn.Linear(d_model, v_heads * head_dim, bias=False)
        self.b_proj = nn.Linear(d_model, v_heads, bias=False)
        self.out_proj = nn.Linear(v_heads * v_head_dim, d_model, bias=False)
        self.A_log = nn.Parameter(torch.linspace(-1.0, 0.5, v_heads))
        self.dt_bias = nn.Parameter(torch.zeros(v_heads, head_dim))
        self.feed_forward = nn.Sequential(nn.LayerNorm(d_model, eps=1e-6), nn.Linear(d_model, d_ff), nn.SiLU(), nn.Linear(d_ff, d_model))

    def cache_shapes(self, batch_size, ring_len):
        h, hv, dk, dv = self.heads, self.v_heads, self.head_dim, self.v_head_dim
        return {"ssm_state": (batch_size, hv, dv, dk), "delta_mem": (batch_size, hv, ring_len, dv),
                "key_mem": (batch_size, h, ring_len, dk), "log_forget": (batch_size, hv, ring_len, dk)}

    def _project(self, x):
        qk = self.heads * self.head_dim
        mixed = self.qkv(x)
        q = mixed[..., :qk].unflatten(-1, (self.heads, self.head_dim))
        k = mixed[..., qk:2 * qk].unflatten(-1, (self.heads, self.head_dim))
        v = mixed[..., 2 * qk:].unflatten(-1, (self.v_heads, self.v_head_dim))
        return q, k, v, self.a_proj(x).unflatten(-1, (self.v_heads, self.head_dim)), self.b_proj(x)

    def forward(self, x, layer_cache, slot_idx):
        """One token per row: ``x [B, d_model]`` on cache rows ``slot_idx [B]`` (int32)."""
        q, k, v, a, b = self._project(self.layer_norm_1(x))
        rings = ReplayRings.from_cache(layer_cache)
        if rings.d_cache.dtype != v.dtype:
            rings = ReplayRings(*(t.to(v.dtype) if t.is_floating_point() else t for t in rings))  # expect-bug: decode-arg
        out = replayssm.replayssm_kda_decode(q, k, v, a, b, **rings._asdict(), slot_idx=slot_idx,
                                             A_log=self.A_log, dt_bias=self.dt_bias)
        x = x + self.out_proj(out.flatten(1).to(x.dtype))
        return x + self.feed_forward(x)

    def prefill(self, x, layer_cache):
        """The prompt ``x [B, T, d_model]`` (``T`` below the ring length) in one pass: same
        recurrence as the decode op, the rings written from the prompt's rows at once."""
        length, ring_len = x.size(1), layer_cache["delta_mem"].size(2)
        q, k, v, a, b = self._project(self.layer_norm_1(x))
        g = -self.A_log.exp().unsqueeze(-1) * F.softplus(a + self.dt_bias)  # expect-bug: promotion id=prefill
        group = self.v_heads // self.heads
        k = F.normalize(k.float(), dim=-1)
        q = F.normalize(q.float(), dim=-1).repeat_interleave(group, dim=2) * self.head_dim ** -0.5
        beta, state = torch.sigmoid(b.float()), layer_cache["ssm_state"].float()
        outs, deltas = [], []
        for t in range(length):
            kt = k[:, t].repeat_interleave(group, dim=1)
            state = state * g[:, t].float().exp().unsqueeze(2)
            deltas.append(beta[:, t].unsqueeze(-1) * (v[:, t].float() - torch.einsum("bhvk,bhk->bhv", state, kt)))
            state = state + deltas[-1].unsqueeze(-1) * kt.unsqueeze(2)
            outs.append(torch.einsum("bhvk,bhk->bhv", state, q[:, t]))
        pad = (0, 0, 0, ring_len - length)
        layer_cache["delta_mem"] = F.pad(torch.stack(deltas, 2), pad).to(layer_cache["delta_mem"].dtype)
        layer_cache["key_mem"] = F.pad(k.transpose(1, 2), pad).to(layer_cache["key_mem"].dtype)
        layer_cache["log_forget"] = F.pad(g.transpose(1, 2), pad)  # expect-bug: promotion id=prefill
        layer_cache["write_pos"].fill_(length)
        x = x + self.out_proj(torch.stack(outs, 1).flatten(2).to(x.dtype))
        return x + self.feed_forward(x)


class SlotCache(nn.Module):
    """Caches of one layer for ``max_slots`` sequences, as (non-persistent) buffers."""

    RING_BUFFERS = ("delta_mem", "key_mem", "forget_buf")

    def __init__(self, max_slots, shapes, dtype):
        super().__init__()
        self.register_buffer("ssm_state", torch.zeros(shapes["ssm_state"], dtype=torch.float32), persistent=False)
        self.register_buffer("delta_mem", torch.zeros(shapes["delta_mem"], dtype=dtype), persistent=False)
        self.register_buffer("key_mem", torch.zeros(shapes["key_mem"], dtype=dtype), persistent=False)
        self.register_buffer("forget_buf", torch.zeros(shapes["log_forget"]), persistent=False)  # expect-bug: default-dtype id=low-mem-init; default-dtype id=fast-load
        self.register_buffer("write_pos", torch.zeros(max_slots, dtype=torch.int32), persistent=False)

    @property
    def max_slots(self):
        return self.write_pos.size(0)

    def layer_cache(self):
        return {"ssm_state": self.ssm_state, "delta_mem": self.delta_mem, "key_mem": self.key_mem,
                "log_forget": self.forget_buf, "write_pos": self.write_pos}

    def reset_slot(self, slot):
        for buf in self.buffers():
            buf[slot].zero_()

    def copy_slot(self, dst, src):
        for buf in self.buffers():
            buf[dst].copy_(buf[src])

    def resize(self, max_slots):
        """Grows to ``max_slots`` slots; existing slots keep their contents."""
        old, ring_dtype = self.max_slots, self.delta_mem.dtype
        grown = {name: torch.zeros((max_slots, *self._buffers[name].shape[1:]), dtype=ring_dtype) for name in self.RING_BUFFERS}  # expect-bug: pool-dtype
        for name, buf in grown.items():
            buf[:old] = self._buffers[name]
            self._buffers[name] = buf
        self.ssm_state = torch.cat([self.ssm_state, self.ssm_state.new_zeros((max_slots - old, *self.ssm_state.shape[1:]))])
        self.write_pos = torch.cat([self.write_pos, self.write_pos.new_zeros(max_slots - old)])


class PinnedSlotCache(SlotCache):
    """Slot caches whose checkpoint and decay ring only follow device moves in ``.to()``."""

    storage_dtypes = {"ssm_state": None, "forget_buf": None}

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers[name] for name in self.storage_dtypes}
        super()._apply(fn, recurse)
        for name, dtype in self.storage_dtypes.items():
            self._buffers[name] = kept[name].to(device=self.delta_mem.device, dtype=dtype or kept[name].dtype)
        return self


class CompactSlotCache(PinnedSlotCache):
    """Slot caches for many mostly idle sessions (smaller storage for the rings)."""

    storage_dtypes = {"ssm_state": None, "forget_buf": torch.float16}  # expect-bug: container


SLOT_CACHES = {"plain": SlotCache, "pinned": PinnedSlotCache, "compact": CompactSlotCache}


class DecoderBase(nn.Module):
    """Abstract class for decoders."""

    attentional = False


class KDADecoder(DecoderBase):
    def __init__(self, num_layers, d_model, heads, v_heads, head_dim, v_head_dim, d_ff, ring_len,
                 embeddings, decay_dtype=torch.float32, ring_dtype=None):
        super().__init__()
        self.embeddings = embeddings
        self.ring_len, self.decay_dtype, self.ring_dtype = ring_len, decay_dtype, ring_dtype
        self.state = {}
        self.transformer_layers = nn.ModuleList(
            KDADecoderLayer(d_model, heads, v_heads, head_dim, v_head_dim, d_ff) for _ in range(num_layers))
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.slot_caches = None

    @classmethod
    def from_opt(cls, opt, embeddings):
        """Alternate constructor."""
        return cls(opt.dec_layers, opt.dec_hid_size, opt.heads, opt.v_heads, opt.head_dim, opt.v_head_dim,
                   opt.transformer_ff, opt.ring_len, embeddings, decay_dtype=misc.str2dtype(opt.decay_dtype),
                   ring_dtype=misc.str2dtype(opt.ring_dtype) if opt.ring_dtype else None)

    @property
    def dtype(self):
        return self.embeddings.word_lut.weight.dtype

    def init_state(self, src, enc_out=None, enc_final_hs=None):
        """Initialize decoder state."""
        self.state = {"src": src, "slot_idx": None, "cache": {}}
        dtype = self.ring_dtype or self.dtype
        for i, layer in enumerate(self.transformer_layers):
            shapes = layer.cache_shapes(src.size(0), self.ring_len)
            self.state["cache"][f"layer_{i}"] = {
                "ssm_state": torch.zeros(shapes["ssm_state"], dtype=torch.float32),
                "delta_mem": torch.zeros(shapes["delta_mem"], dtype=dtype),
                "key_mem": torch.zeros(shapes["key_mem"], dtype=dtype),
                "log_forget": torch.zeros(shapes["log_forget"], dtype=self.decay_dtype),
                "write_pos": torch.zeros(src.size(0), dtype=torch.int32),
            }

    def attach_slots(self, max_slots, cache_cls=SlotCache):
        dtype = self.ring_dtype or self.dtype
        caches = nn.ModuleList(cache_cls(max_slots, layer.cache_shapes(max_slots, self.ring_len), dtype)
                               for layer in self.transformer_layers)
        self.slot_caches = caches.to(self.embeddings.word_lut.weight.device)

    def bind_slots(self, slot_idx):
        """Decode on rows ``slot_idx`` (int32) of the slot caches instead of a per-batch cache."""
        self.state = {"src": None, "slot_idx": slot_idx,
                      "cache": {f"layer_{i}": c.layer_cache() for i, c in enumerate(self.slot_caches)}}

    def map_state(self, fn):
        def _recursive_map(struct, batch_dim=0):
            for k, v in struct.items():
                if v is not None:
                    if isinstance(v, dict):
                        _recursive_map(v)
                    else:
                        struct[k] = fn(v, batch_dim)

        if self.state.get("src") is not None:
            self.state["src"] = fn(self.state["src"], 0)
        if self.state.get("cache") is not None:
            _recursive_map(self.state["cache"])

    def detach_state(self):
        self.map_state(lambda state, dim: state.detach())

    def forward(self, tgt, enc_out=None, step=None, **kwargs):
        """``tgt [B, T]`` token ids; returns ``dec_out [B, T, d_model]`` and no attention."""
        emb = self.embeddings(tgt, step=step)
        slot_idx = self.state.get("slot_idx")
        if slot_idx is None:
            slot_idx = torch.arange(tgt.size(0), dtype=torch.int32, device=tgt.device)
        outs = []
        for t in range(emb.size(1)):
            x = emb[:, t]
            for i, layer in enumerate(self.transformer_layers):
                x = layer(x, self.state["cache"][f"layer_{i}"], slot_idx)
            outs.append(x)
        return self.layer_norm(torch.stack(outs, 1)), {}

    def prefill(self, src):
        """Feeds the prompt ``src [B, T]`` with :meth:`KDADecoderLayer.prefill` (``T < ring_len``)."""
        x = self.embeddings(src)
        for i, layer in enumerate(self.transformer_layers):
            x = layer.prefill(x, self.state["cache"][f"layer_{i}"])
        return self.layer_norm(x), {}


def _tiny_decoder(dtype):
    torch.manual_seed(0)
    return KDADecoder(2, 16, 2, 4, 8, 8, 32, 4, Embeddings(16, 24, 1)).to(dtype).eval()


@torch.no_grad()
def build_decoder_bf16():
    """bf16 decoder: a tiled and reordered per-batch cache, and pinned slot caches after ``.half()``."""
    decoder = _tiny_decoder(torch.bfloat16)
    src = torch.tensor([[4, 5, 6], [7, 8, 9]])
    decoder.init_state(src)
    decoder(src)
    decoder.map_state(lambda state, dim: misc.tile(state, 2, dim=dim))
    for step in range(4):
        decoder(torch.tensor([[10 + step], [11], [12], [13 + step]]))
        decoder.map_state(lambda state, dim: state.index_select(dim, torch.tensor([1, 0, 3, 3])))
    decoder.detach_state()
    slotted = _tiny_decoder(torch.float32)
    slotted.attach_slots(3, cache_cls=PinnedSlotCache)
    slotted.half()
    slotted.bind_slots(torch.tensor([2, 0], dtype=torch.int32))
    for step in range(5):
        slotted(torch.tensor([[4 + step], [9]]))
    return {"per_batch": decoder.state["cache"], "slots": slotted.slot_caches, "decode": dict(replayssm.last_call())}


@torch.no_grad()
def build_parallel_prefill_bf16():
    """A three-token prompt written into the rings of a bf16 decoder in one pass, then decoded."""
    decoder = _tiny_decoder(torch.bfloat16)
    src = torch.tensor([[4, 5, 6], [8, 9, 10]])
    decoder.init_state(src)
    decoder.prefill(src)
    for step in range(3):
        decoder(torch.tensor([[12 + step], [14]]))
    return decoder.state


@torch.no_grad()
def build_slots_grow():
    """Two bf16 slot caches in use, grown to four slots, then decoded on all of them."""
    decoder = _tiny_decoder(torch.bfloat16)
    decoder.attach_slots(2)
    decoder.bind_slots(torch.tensor([0, 1], dtype=torch.int32))
    decoder(torch.tensor([[4, 5], [6, 7]]))
    for cache in decoder.slot_caches:
        cache.resize(4)
    decoder.bind_slots(torch.tensor([0, 1, 2, 3], dtype=torch.int32))
    decoder(torch.tensor([[8], [9], [10], [11]]))
    return decoder.slot_caches
