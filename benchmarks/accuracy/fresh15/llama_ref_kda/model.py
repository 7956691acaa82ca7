# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .args import ModelArgs
from .compat import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .datatypes import RingDtypes, ring_dtypes
from .kernels import fused_recurrent_kda_replayssm_decode as replayssm_decode
from .kernels import next_write_pos

CACHE_BUFFERS = ("cache_state", "cache_d", "cache_k", "cache_logdecay", "cache_pos")


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


class Attention(nn.Module):
    """Kimi Delta Attention with a ReplaySSM decode cache.

    Per slot the cache holds a checkpoint state ``cache_state`` [slots, HV, V, K] and three
    rings of ``ring_len`` rows: deltas ``cache_d`` [slots, HV, L, V], keys ``cache_k``
    [slots, H, L, K] and per-step log-decays ``cache_logdecay`` [slots, HV, L, K].
    ``cache_pos`` holds each slot's next ring row.
    """

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads = args.n_heads
        self.n_v_heads = args.n_v_heads
        self.head_dim = args.head_dim
        self.v_head_dim = args.v_head_dim
        self.ring_len = args.ring_len
        self.scale = self.head_dim**-0.5
        self.lower_bound = args.gate_lower_bound
        self.use_qk_l2norm = args.use_qk_l2norm

        self.wqkv = ColumnParallelLinear(args.dim, args.qkv_dim, bias=False, gather_output=False)
        self.wa = ColumnParallelLinear(args.dim, self.n_v_heads * self.head_dim, bias=False)
        self.wb = ColumnParallelLinear(args.dim, self.n_v_heads, bias=False)
        self.wo = RowParallelLinear(self.n_v_heads * self.v_head_dim, args.dim, bias=False, input_is_parallel=True)
        A = torch.linspace(1.0, 8.0, self.n_v_heads, dtype=torch.float32)
        self.A_log = nn.Parameter(torch.log(A))
        self.dt_bias = nn.Parameter(torch.full((self.n_v_heads, self.head_dim), -1.0, dtype=torch.float32))

        self.cache_slots = 0
        if args.eager_cache:
            slots = args.max_batch_size
            hv, h, k, v, length = self.n_v_heads, self.n_heads, self.head_dim, self.v_head_dim, self.ring_len
            # the caches take the default dtype that the model is built under
            self.register_buffer("cache_state", torch.zeros(slots, hv, v, k), persistent=False)
            self.register_buffer("cache_d", torch.zeros(slots, hv, length, v), persistent=False)
            self.register_buffer("cache_k", torch.zeros(slots, h, length, k), persistent=False)
            self.register_buffer("cache_logdecay", torch.zeros(slots, hv, length, k), persistent=False)  # expect-bug: default-dtype
            self.register_buffer("cache_pos", torch.zeros(slots, dtype=torch.int32), persistent=False)
            self.cache_slots = slots

    def setup_cache(self, max_batch_size: int, dtypes: RingDtypes) -> None:
        hv, h, k, v, length = self.n_v_heads, self.n_heads, self.head_dim, self.v_head_dim, self.ring_len
        self.register_buffer(
            "cache_state", torch.zeros((max_batch_size, hv, v, k), dtype=dtypes.state), persistent=False
        )
        self.register_buffer(
            "cache_d", torch.zeros((max_batch_size, hv, length, v), dtype=dtypes.delta), persistent=False
        )
        self.register_buffer(
            "cache_k", torch.zeros((max_batch_size, h, length, k), dtype=dtypes.key), persistent=False
        )
        self.register_buffer(
            "cache_logdecay",
            torch.zeros((max_batch_size, hv, length, k), dtype=dtypes.logdecay),
            persistent=False,
        )
        self.register_buffer("cache_pos", torch.zeros(max_batch_size, dtype=torch.int32), persistent=False)
        self.cache_slots = max_batch_size

    def grow_slots(self, extra: int) -> None:
        """Appends ``extra`` empty slots to the cache; live slots keep their rows."""
        n = self.cache_slots + extra
        hv, k, length = self.n_v_heads, self.head_dim, self.ring_len
        state = self.cache_state.new_zeros((n, *self.cache_state.shape[1:]))
        delta = self.cache_d.new_zeros((n, *self.cache_d.shape[1:]))
        key = self.cache_k.new_zeros((n, *self.cache_k.shape[1:]))
        logdecay = self.cache_d.new_zeros((n, hv, length, k))  # expect-bug: like
        pos = torch.zeros(n, dtype=torch.int32)
        for new, old in (
            (state, self.cache_state),
            (delta, self.cache_d),
            (key, self.cache_k),
            (logdecay, self.cache_logdecay),
            (pos, self.cache_pos),
        ):
            new[: self.cache_slots].copy_(old)
        self.cache_state, self.cache_d, self.cache_k = state, delta, key
        self.cache_logdecay, self.cache_pos = logdecay, pos
        self.cache_slots = n

    def _log_decay(self, a: torch.Tensor) -> torch.Tensor:
        """Per-step log-decays in the parameter dtype; ``a`` is [..., HV, K]."""
        x = a + self.dt_bias
        A = self.A_log.exp()[:, None]
        if self.lower_bound is None:
            return -A * F.softplus(x)
        return self.lower_bound * torch.sigmoid(A * x)

    def _split_qkv(self, mixed: torch.Tensor):
        h, hv, k, v = self.n_heads, self.n_v_heads, self.head_dim, self.v_head_dim
        lead = mixed.shape[:-1]
        q = mixed[..., : h * k].reshape(*lead, h, k)
        key = mixed[..., h * k : 2 * h * k].reshape(*lead, h, k)
        value = mixed[..., 2 * h * k :].reshape(*lead, hv, v)
        if self.use_qk_l2norm:
            q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
            key = key * torch.rsqrt(key.pow(2).sum(-1, keepdim=True) + 1e-6)
        return q, key, value

    def forward(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        force_flush: Optional[torch.Tensor] = None,
        rings: Optional[Any] = None,
    ) -> torch.Tensor:
        """One decode token per row of ``x`` [B, dim]; ``slots`` [B] int32 (-1: padding).

        ``rings`` (anything with ``state``, ``delta``, ``key``, ``logdecay`` and ``write_pos``)
        replaces the layer's own cache.
        """
        bsz = x.shape[0]
        if rings is None:
            state, delta, key = self.cache_state, self.cache_d, self.cache_k
            logdecay, cursors = self.cache_logdecay, self.cache_pos
        else:
            state, delta, key = rings.state, rings.delta, rings.key
            logdecay, cursors = rings.logdecay, rings.write_pos
        rows = slots.long().clamp(min=0)
        write_pos = cursors[rows]
        out = torch.empty((bsz, 1, self.n_v_heads, self.v_head_dim), dtype=x.dtype)
        replayssm_decode(
            self.wqkv(x),
            self.wa(x),
            self.wb(x),
            self.A_log,
            self.dt_bias,
            self.scale,
            state,
            delta,
            key,
            logdecay,
            out,
            slots,
            write_pos,
            force_flush=force_flush,
            use_qk_l2norm_in_kernel=self.use_qk_l2norm,
            lower_bound=self.lower_bound,
        )
        live = slots >= 0
        cursors[rows[live]] = next_write_pos(write_pos, self.ring_len, force_flush)[live]
        return self.wo(out.view(bsz, -1))

    def prefill(self, x: torch.Tensor, slots: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Writes a prompt of T < ring_len tokens (``x`` [B, T, dim]) into fresh slots.

        The checkpoint state stays zero and the prompt's steps become ring rows 0..T-1, so the
        next decode step replays them. Without ``slots`` the prompt fills every slot of the
        cache and the rings are rebuilt whole.
        """
        bsz, seqlen, _ = x.shape
        assert seqlen < self.ring_len, "a prompt must fit in the ring"
        group = self.n_v_heads // self.n_heads
        q, k, v = self._split_qkv(self.wqkv(x).float())
        g = self._log_decay(self.wa(x).view(bsz, seqlen, self.n_v_heads, self.head_dim))
        beta = torch.sigmoid(self.wb(x).float())
        state = torch.zeros(bsz, self.n_v_heads, self.v_head_dim, self.head_dim, dtype=torch.float32)
        deltas, outs = [], []
        for t in range(seqlen):
            k_t = k[:, t].repeat_interleave(group, dim=1)
            q_t = q[:, t].repeat_interleave(group, dim=1) * self.scale
            state = state * g[:, t].float().exp()[:, :, None, :]
            delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", state, k_t))
            state = state + delta[..., None] * k_t[:, :, None, :]
            deltas.append(delta)
            outs.append(torch.einsum("bhvk,bhk->bhv", state, q_t))
        d_rows = torch.stack(deltas, dim=2)
        k_rows = k.transpose(1, 2)
        g_rows = g.transpose(1, 2)
        if slots is None:
            assert bsz == self.cache_slots, "a whole-cache prefill needs one prompt per slot"
            free = self.ring_len - seqlen
            self.cache_d = torch.cat(
                [d_rows.to(self.cache_d.dtype), self.cache_d.new_zeros((bsz, self.n_v_heads, free, self.v_head_dim))],
                dim=2,
            )
            self.cache_k = torch.cat(
                [k_rows.to(self.cache_k.dtype), self.cache_k.new_zeros((bsz, self.n_heads, free, self.head_dim))],
                dim=2,
            )
            self.cache_logdecay = torch.cat([g_rows, g_rows.new_zeros((bsz, self.n_v_heads, free, self.head_dim))], dim=2)  # expect-bug: promotion
            self.cache_state.zero_()
            self.cache_pos.fill_(seqlen)
        else:
            rows = slots.long()
            self.cache_state[rows] = 0
            self.cache_d[rows, :, :seqlen] = d_rows.to(self.cache_d.dtype)
            self.cache_k[rows, :, :seqlen] = k_rows.to(self.cache_k.dtype)
            self.cache_logdecay[rows, :, :seqlen] = g_rows.to(torch.float32)
            self.cache_pos[rows] = seqlen
        out = torch.stack(outs, dim=1).to(x.dtype)
        return self.wo(out.reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        multiple_of: int,
        ffn_dim_multiplier: Optional[float],
    ):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        # custom dim factor multiplier
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)

        self.w1 = ColumnParallelLinear(dim, hidden_dim, bias=False, gather_output=False)
        self.w2 = RowParallelLinear(hidden_dim, dim, bias=False, input_is_parallel=True)
        self.w3 = ColumnParallelLinear(dim, hidden_dim, bias=False, gather_output=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.dim = args.dim
        self.layer_id = layer_id
        self.attention = Attention(args, layer_id)
        self.feed_forward = FeedForward(
            dim=args.dim,
            hidden_dim=4 * args.dim,
            multiple_of=args.multiple_of,
            ffn_dim_multiplier=args.ffn_dim_multiplier,
        )
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, slots, force_flush=None, rings=None):
        h = x + self.attention(self.attention_norm(x), slots, force_flush, rings)
        return h + self.feed_forward(self.ffn_norm(h))

    def prefill(self, x, slots=None):
        h = x + self.attention.prefill(self.attention_norm(x), slots)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, params: ModelArgs):
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers

        self.tok_embeddings = VocabParallelEmbedding(params.vocab_size, params.dim, init_method=lambda x: x)
        self.layers = torch.nn.ModuleList()
        for layer_id in range(params.n_layers):
            self.layers.append(TransformerBlock(layer_id, params))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        self.output = ColumnParallelLinear(params.dim, params.vocab_size, bias=False, init_method=lambda x: x)

    def setup_cache(self, max_batch_size: int, max_seq_len: int) -> None:
        """Allocates every layer's decode cache for ``max_batch_size`` slots.

        A ReplaySSM cache does not grow with the sequence; ``max_seq_len`` only bounds how
        long the generator keeps a slot.
        """
        self.max_seq_len = max_seq_len
        dtypes = ring_dtypes(self.params)
        for layer in self.layers:
            layer.attention.setup_cache(max_batch_size, dtypes)

    def grow_slots(self, extra: int) -> None:
        for layer in self.layers:
            layer.attention.grow_slots(extra)

    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        force_flush: Optional[torch.Tensor] = None,
        rings: Optional[List[Any]] = None,
    ) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer_id, layer in enumerate(self.layers):
            h = layer(h, slots, force_flush, None if rings is None else rings[layer_id])
        h = self.norm(h)
        return self.output(h).float()

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, slots: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer.prefill(h, slots)
        return self.output(self.norm(h)).float()

    def cache_snapshot(self) -> Dict[str, torch.Tensor]:
        """Copies of every layer's cache buffers, keyed ``layers.{i}.{name}``."""
        return {
            f"layers.{i}.{name}": getattr(layer.attention, name).clone()
            for i, layer in enumerate(self.layers)
            for name in CACHE_BUFFERS
        }

    def load_cache_snapshot(self, snapshot: Dict[str, torch.Tensor]) -> None:
        """Copies ``snapshot`` into the allocated caches (their dtypes are kept)."""
        for i, layer in enumerate(self.layers):
            for name in CACHE_BUFFERS:
                getattr(layer.attention, name).copy_(snapshot[f"layers.{i}.{name}"])


class KDACache(nn.Module):
    """A pool of ReplaySSM slots kept outside a ``Transformer`` (a host-side session pool).

    Buffers are named as ``Attention.forward`` expects of its ``rings`` argument. Moving or
    casting the pool moves every buffer, but ``logdecay`` always stays float32.
    """

    def __init__(self, args: ModelArgs, n_slots: int):
        super().__init__()
        hv, h, k, v, length = args.n_v_heads, args.n_heads, args.head_dim, args.v_head_dim, args.ring_len
        self.register_buffer("state", torch.zeros(n_slots, hv, v, k))
        self.register_buffer("delta", torch.zeros(n_slots, hv, length, v))
        self.register_buffer("key", torch.zeros(n_slots, h, length, k))
        self.register_buffer("logdecay", torch.zeros(n_slots, hv, length, k, dtype=torch.float32))
        self.register_buffer("write_pos", torch.zeros(n_slots, dtype=torch.int32))
        self.register_buffer("slot_table", torch.full((n_slots,), -1, dtype=torch.int64))

    def _apply(self, fn, recurse=True):
        logdecay = self._buffers.pop("logdecay")
        super()._apply(fn, recurse)
        moved = fn(logdecay)
        self._buffers["logdecay"] = moved if moved.dtype == torch.float32 else logdecay.to(moved.device)
        return self

    def assign(self, request_ids: List[int]) -> torch.Tensor:
        """Slots for ``request_ids`` (taken from the free slots, in order), as int32."""
        free = (self.slot_table < 0).nonzero().flatten()[: len(request_ids)]
        if len(free) < len(request_ids):
            raise RuntimeError(f"{len(request_ids)} slots requested, {len(free)} free")
        self.slot_table[free] = torch.tensor(request_ids, dtype=torch.int64)
        return free.to(torch.int32)

    def adopt(self, rows: Dict[str, torch.Tensor], request_ids: List[int]) -> torch.Tensor:
        """Appends slots received from another pool (in whatever dtypes it keeps them)."""
        n = rows["state"].shape[0]
        first = self.state.shape[0]
        self.state = torch.cat([self.state, rows["state"].to(self.state.dtype)])
        self.delta = torch.cat([self.delta, rows["delta"].to(self.delta.dtype)])
        self.key = torch.cat([self.key, rows["key"].to(self.key.dtype)])
        self.logdecay = torch.cat([self.logdecay, rows["logdecay"]])
        self.write_pos = torch.cat([self.write_pos, rows["write_pos"].to(torch.int32)])
        self.slot_table = torch.cat([self.slot_table, torch.tensor(request_ids, dtype=torch.int64)])
        return torch.arange(first, first + n, dtype=torch.int32)


# --- builders ---------------------------------------------------------------------------


def _tiny_args(**overrides) -> ModelArgs:
    base = dict(dim=32, n_layers=2, n_heads=2, n_v_heads=4, head_dim=8, ring_len=4, max_batch_size=3)
    base.update(overrides)
    return ModelArgs(**base)


def build_reference_transformer():
    """fp32 weights, bf16 state and rings, three decode steps with one forced flush."""
    torch.manual_seed(0)
    args = _tiny_args()
    model = Transformer(args)
    model.setup_cache(args.max_batch_size, args.max_seq_len)
    slots = torch.tensor([0, 2, -1], dtype=torch.int32)
    flush = torch.tensor([0, 1, 0], dtype=torch.int32)
    tokens = torch.tensor([5, 9, 0])
    logits = []
    for step in range(3):
        logits.append(model(tokens + step, slots, force_flush=flush if step == 1 else None))
    return {"model": model, "logits": torch.stack(logits)}


def build_warmed_transformer():
    """A bf16 model whose whole cache is warmed with a two-token prompt, then grown."""
    torch.manual_seed(0)
    args = _tiny_args(max_batch_size=2, gate_lower_bound=-5.0)
    model = Transformer(args).to(torch.bfloat16)
    model.setup_cache(args.max_batch_size, args.max_seq_len)
    prompt = torch.randint(0, args.vocab_size, (2, 2))
    model.prefill(prompt)
    model(prompt[:, -1], torch.arange(2, dtype=torch.int32))
    model.grow_slots(2)
    logits = model(torch.tensor([3, 4, 5, 6]), torch.arange(4, dtype=torch.int32))
    return {"model": model, "logits": logits}


def build_pinned_pool():
    """A standalone pool cast to bf16; two decode steps and slots adopted from a peer."""
    torch.manual_seed(0)
    args = _tiny_args()
    pool = KDACache(args, n_slots=3).to(torch.bfloat16)
    attn = Attention(args, layer_id=0)
    slots = pool.assign([101, 102])
    x = torch.randn(2, args.dim)
    outs = [attn(x, slots, rings=pool), attn(x * 0.5, slots, rings=pool)]
    peer = {
        "state": torch.randn(1, args.n_v_heads, args.v_head_dim, args.head_dim).bfloat16(),
        "delta": torch.randn(1, args.n_v_heads, args.ring_len, args.v_head_dim).bfloat16(),
        "key": torch.randn(1, args.n_heads, args.ring_len, args.head_dim).bfloat16(),
        "logdecay": -torch.rand(1, args.n_v_heads, args.ring_len, args.head_dim).bfloat16(),
        "write_pos": torch.tensor([1], dtype=torch.int32),
    }
    adopted = pool.adopt(peer, [103])
    outs.append(attn(torch.randn(1, args.dim), adopted, rings=pool))
    scratch = torch.zeros_like(pool.delta, dtype=torch.float32)
    return {"pool": pool, "outs": outs, "scratch": scratch}


def build_partial_prefill():
    """bf16 weights cast before the caches exist; a prompt in two of three slots, then decode."""
    torch.manual_seed(0)
    args = _tiny_args()
    model = Transformer(args).bfloat16()
    model.setup_cache(args.max_batch_size, args.max_seq_len)
    slots = torch.tensor([0, 2], dtype=torch.int32)
    model.prefill(torch.randint(0, args.vocab_size, (2, 3)), slots)
    model(torch.tensor([1, 2]), slots)
    snapshot = model.cache_snapshot()
    model(torch.tensor([7, 8]), slots)
    model.load_cache_snapshot(snapshot)
    logits = model(torch.tensor([7, 8]), slots)
    return {"model": model, "snapshot": snapshot, "logits": logits}
