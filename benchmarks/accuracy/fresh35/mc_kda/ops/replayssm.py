"""ReplaySSM decode for Kimi Delta Attention (CPU reference) and the KDA mixer that calls it.

CUDA builds ship ``replayssm_kda_decode`` as a fused kernel; this is its CPU reference with the
same in-place contract. A cache slot holds a float32 checkpoint ``state [HV, V, K]`` and three
rings with the rows written since that checkpoint: deltas ``[HV, L, V]``, keys ``[H, L, K]``
and per-channel log-decays ``[HV, L, K]`` (float32, like the gate math). A step replays the
slot's rows onto its checkpoint, applies the new token and writes the token's rows at
``write_pos``; on the last ring row the state is folded into the checkpoint instead. Callers
move their cursors afterwards (:func:`advance_cursors`).

The last few calls are kept (arguments only, by reference) for the worker's debug endpoint.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import KDAShapes

_MAX_RECORDED = 4
_recorded: List[Dict[str, Any]] = []


def last_call() -> Dict[str, Any]:
    """The ring arguments of the most recent decode call."""
    return dict(_recorded[-1]) if _recorded else {}


def kda_log_decay(a: Tensor, A_log: Tensor, dt_bias: Tensor, num_v_heads: int) -> Tensor:
    """``-exp(A_log) * softplus(a + dt_bias)`` per channel: ``[..., HV, K]`` in float32."""
    x = a.float().unflatten(-1, (num_v_heads, -1)) + dt_bias.float().view(num_v_heads, -1)
    return -A_log.float().exp().unsqueeze(-1) * F.softplus(x)


def _replayed(state: Tensor, d_rows: Tensor, k_rows: Tensor, g_rows: Tensor, count: int, group: int) -> Tensor:
    s = state.float()
    if count == 0:
        return s.clone()
    cum = g_rows[:, :count].float().cumsum(dim=1)
    total = cum[:, -1]
    keys = k_rows[:, :count].float().repeat_interleave(group, dim=0) * torch.exp(total.unsqueeze(1) - cum)
    return s * total.exp().unsqueeze(1) + torch.einsum("hcv,hck->hvk", d_rows[:, :count].float(), keys)


def replayssm_kda_decode(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    *,
    state: Tensor,
    d_cache: Tensor,
    k_cache: Tensor,
    g_cache: Tensor,
    slot_idx: Tensor,
    write_pos: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    scale: Optional[float] = None,
    out: Optional[Tensor] = None,
) -> Tensor:
    """One token for each of ``B`` rows; row ``i`` runs on slot ``slot_idx[i]`` (negative: padding).

    ``q, k [B, H, K]``, ``v [B, HV, V]``, ``a [B, HV*K]``, ``b [B, HV]``; ``slot_idx`` and
    ``write_pos`` are int32 ``[B]``. Returns ``out [B, HV, V]`` in the dtype of ``v``.
    """
    _recorded.append(
        {"state": state, "d_cache": d_cache, "k_cache": k_cache, "g_cache": g_cache, "slot_idx": slot_idx, "write_pos": write_pos}
    )
    del _recorded[:-_MAX_RECORDED]
    rows, num_heads, head_k = q.shape
    num_v_heads, ring_len, head_v = d_cache.shape[1:]
    group = num_v_heads // num_heads
    scale = head_k**-0.5 if scale is None else scale
    if out is None:
        out = v.new_zeros(rows, num_v_heads, head_v)
    qf = F.normalize(q.float(), dim=-1) * scale
    kf = F.normalize(k.float(), dim=-1)
    g = kda_log_decay(a, A_log, dt_bias, num_v_heads)
    beta = torch.sigmoid(b.float())
    for i in range(rows):
        slot = int(slot_idx[i])
        if slot < 0:
            out[i].zero_()
            continue
        pos = int(write_pos[i])
        s = _replayed(state[slot], d_cache[slot], k_cache[slot], g_cache[slot], pos, group)
        key = kf[i].repeat_interleave(group, dim=0)
        s = s * g[i].exp().unsqueeze(1)
        delta = beta[i].unsqueeze(-1) * (v[i].float() - torch.einsum("hvk,hk->hv", s, key))
        s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
        out[i] = torch.einsum("hvk,hk->hv", s, qf[i].repeat_interleave(group, dim=0))
        if pos == ring_len - 1:
            state[slot] = s
        else:
            d_cache[slot, :, pos] = delta
            k_cache[slot, :, pos] = kf[i]
            g_cache[slot, :, pos] = g[i]
    return out


def advance_cursors(cursor: Tensor, slot_idx: Tensor, write_pos: Tensor, ring_len: int) -> None:
    """Moves each live row's slot cursor one row on (back to 0 after a fold)."""
    for i in range(slot_idx.shape[0]):
        slot = int(slot_idx[i])
        if slot >= 0:
            cursor[slot] = (int(write_pos[i]) + 1) % ring_len


def chunk_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, b: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The rows a prompt of ``T < L`` tokens leaves in an empty slot, in one pass.

    ``g [T, HV, K]`` are the prompt's log-decays. Returns ``(deltas [HV, T, V], keys [H, T, K],
    out [T, HV, V])``, all float32.
    """
    steps, num_heads, head_k = q.shape
    num_v_heads, head_v = v.shape[1:]
    group = num_v_heads // num_heads
    qf = F.normalize(q.float(), dim=-1) * head_k**-0.5
    kf = F.normalize(k.float(), dim=-1)
    beta = torch.sigmoid(b.float())
    s = torch.zeros(num_v_heads, head_v, head_k, dtype=torch.float32)
    deltas, outs = [], []
    for t in range(steps):
        key = kf[t].repeat_interleave(group, dim=0)
        s = s * g[t].float().exp().unsqueeze(1)
        delta = beta[t].unsqueeze(-1) * (v[t].float() - torch.einsum("hvk,hk->hv", s, key))
        s = s + delta.unsqueeze(-1) * key.unsqueeze(1)
        outs.append(torch.einsum("hvk,hk->hv", s, qf[t].repeat_interleave(group, dim=0)))
        deltas.append(delta)
    return torch.stack(deltas, dim=1), kf.transpose(0, 1), torch.stack(outs)


class KDAMixer(nn.Module):
    """Kimi Delta Attention token mixer; decoding goes through :func:`replayssm_kda_decode`."""

    def __init__(self, shapes: KDAShapes, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.shapes = shapes
        hidden, h, hv = shapes.hidden_size, shapes.num_heads, shapes.num_v_heads
        k, v = shapes.head_k_dim, shapes.head_v_dim
        self.q_proj = nn.Linear(hidden, h * k, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(hidden, h * k, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(hidden, hv * v, bias=False, dtype=dtype)
        self.a_proj = nn.Linear(hidden, hv * k, bias=False, dtype=dtype)
        self.b_proj = nn.Linear(hidden, hv, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(hv * v, hidden, bias=False, dtype=dtype)
        self.A_log = nn.Parameter(torch.linspace(-1.0, 0.5, hv, dtype=dtype))
        self.dt_bias = nn.Parameter(torch.linspace(-0.5, 0.5, hv * k, dtype=dtype))

    def project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        n, s = x.shape[0], self.shapes
        q = self.q_proj(x).view(n, s.num_heads, s.head_k_dim)
        k = self.k_proj(x).view(n, s.num_heads, s.head_k_dim)
        v = self.v_proj(x).view(n, s.num_v_heads, s.head_v_dim)
        return q, k, v, self.a_proj(x), self.b_proj(x)

    def forward(self, x: Tensor, *, slot_idx: Tensor, write_pos: Tensor, **rings: Tensor) -> Tensor:
        q, k, v, a, b = self.project(x)
        out = replayssm_kda_decode(
            q, k, v, a, b, slot_idx=slot_idx, write_pos=write_pos, A_log=self.A_log, dt_bias=self.dt_bias, **rings
        )
        return self.o_proj(out.flatten(1).to(x.dtype))


class TinyKDAModel(nn.Module):
    """Embeddings and a stack of KDA mixers; inference only."""

    def __init__(
        self,
        shapes: KDAShapes,
        num_layers: int = 2,
        dtype: Optional[torch.dtype] = None,
        cache_slots: Optional[int] = None,
        cache_cls: Optional[Type[nn.Module]] = None,
    ) -> None:
        super().__init__()
        self.shapes = shapes
        self.embed = nn.Embedding(shapes.vocab_size, shapes.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(KDAMixer(shapes, dtype=dtype) for _ in range(num_layers))
        self.caches: Optional[nn.ModuleList] = None
        self.requires_grad_(False)
        if cache_slots is not None and cache_cls is not None:
            self.attach_caches(cache_slots, cache_cls)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def attach_caches(self, num_slots: int, cache_cls: Type[nn.Module], ring_dtype: Optional[torch.dtype] = None) -> None:
        """One in-model ring cache per layer (moves with the model)."""
        ring_dtype = ring_dtype or self.dtype
        self.caches = nn.ModuleList(cache_cls(self.shapes, num_slots, ring_dtype) for _ in self.layers)

    @torch.no_grad()
    def decode_step(self, token_ids: Tensor, caches: Sequence[Any], slot_idx: Tensor) -> Tensor:
        """One token per row on ``caches`` (anything with ``ring_args()`` and a ``cursor``)."""
        live = slot_idx.clamp(min=0).long()
        h = self.embed(token_ids)
        for layer, cache in zip(self.layers, caches):
            write_pos = cache.cursor[live].clone()
            h = h + layer(h, slot_idx=slot_idx, write_pos=write_pos, **cache.ring_args())
            advance_cursors(cache.cursor, slot_idx, write_pos, self.shapes.ring_len)
        return h


def run_tokens(model: TinyKDAModel, caches: Sequence[Any], slots: Sequence[int], tokens: Sequence[Sequence[int]]) -> Tensor:
    """Decodes ``tokens[t][row]`` at every step ``t`` on ``slots``; the hidden states of the last."""
    slot_idx = torch.tensor(list(slots), dtype=torch.int32)
    hidden = torch.empty(0)
    for row in tokens:
        hidden = model.decode_step(torch.tensor(list(row)), caches, slot_idx)
    return hidden


def build_reference_decode() -> Dict[str, Tensor]:
    """Six steps of two rows (one padding) on a three-slot cache: bf16 delta/key rings, float32
    log-decay ring, int32 cursors."""
    torch.manual_seed(0)
    s = KDAShapes()
    slots = 3
    state = torch.zeros(slots, *s.state, dtype=torch.float32)
    d_cache = torch.zeros(slots, *s.delta, dtype=torch.bfloat16)
    k_cache = torch.zeros(slots, *s.key, dtype=torch.bfloat16)
    g_cache = torch.zeros(slots, *s.forget)
    cursor = torch.zeros(slots, dtype=torch.int32)
    A_log = torch.linspace(-1.0, 0.5, s.num_v_heads)
    dt_bias = torch.zeros(s.num_v_heads * s.head_k_dim)
    slot_idx = torch.tensor([2, -1, 0], dtype=torch.int32)
    outs = []
    for _ in range(6):
        q = torch.randn(3, s.num_heads, s.head_k_dim, dtype=torch.bfloat16)
        k = torch.randn(3, s.num_heads, s.head_k_dim, dtype=torch.bfloat16)
        v = torch.randn(3, s.num_v_heads, s.head_v_dim, dtype=torch.bfloat16)
        a = torch.randn(3, s.num_v_heads * s.head_k_dim, dtype=torch.bfloat16)
        b = torch.randn(3, s.num_v_heads, dtype=torch.bfloat16)
        write_pos = cursor[slot_idx.clamp(min=0).long()].clone()
        outs.append(
            replayssm_kda_decode(
                q, k, v, a, b, state=state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache,
                slot_idx=slot_idx, write_pos=write_pos, A_log=A_log, dt_bias=dt_bias,
            )
        )
        advance_cursors(cursor, slot_idx, write_pos, s.ring_len)
    return {"state": state, "d_cache": d_cache, "k_cache": k_cache, "g_cache": g_cache, "cursor": cursor, "out": torch.stack(outs)}
