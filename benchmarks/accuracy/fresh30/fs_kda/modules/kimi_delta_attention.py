"""Kimi Delta Attention with fairseq-style incremental decoding.

Like ``fairseq.modules.MultiheadAttention``, the layer is time-first (``T x B x C``) and keeps
its decode state in ``incremental_state`` under its own unique id. The buffer of one layer is a
dict of

* ``prev_state``     ``[B, HV, V, K]`` checkpoint of the recurrence,
* ``prev_delta``     ``[B, HV, L, V]`` delta ring,
* ``prev_key``       ``[B, H, L, K]``  key ring,
* ``prev_log_decay`` ``[B, HV, L, K]`` log-decay ring,
* ``write_pos``      ``[B]`` int32 ring cursor,

and every step goes through the ReplaySSM decode kernel (``kda_ops``). The first call of a
sequence may carry a whole prompt: prompts shorter than the ring are written straight into
rows ``0..T-1`` (the checkpoint of a new sequence is zero), longer ones are folded into the
checkpoint. ``step_slots`` runs the same kernel on a streaming decoder's slot pool instead.
"""

from typing import Dict, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fs_kda.dataclass.configs import IncrementalStateConfig
from fs_kda.utils import with_incremental_state
from fs_kda.modules import kda_ops


class LayerShape(NamedTuple):
    num_heads: int
    num_v_heads: int
    head_dim: int
    v_head_dim: int


class KernelRings(NamedTuple):
    """The ring arguments of ``fused_recurrent_kda_replayssm_decode`` for one call."""

    initial_state: Tensor
    d_cache: Tensor
    k_cache: Tensor
    g_cache: Tensor
    write_pos: Tensor


@with_incremental_state
class KimiDeltaAttention(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_v_heads: int,
        head_dim: int,
        v_head_dim: Optional[int] = None,
        ring_len: int = 4,
        lower_bound: Optional[float] = None,
        use_qk_l2norm: bool = True,
        state_config: Optional[IncrementalStateConfig] = None,
    ):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.ring_len = ring_len
        self.lower_bound = lower_bound
        self.use_qk_l2norm = use_qk_l2norm
        self.state_config = state_config or IncrementalStateConfig()
        assert num_v_heads % num_heads == 0, "num_v_heads must be a multiple of num_heads"
        self.scaling = self.head_dim**-0.5

        qkv_dim = 2 * num_heads * head_dim + num_v_heads * self.v_head_dim
        self.qkv_proj = nn.Linear(embed_dim, qkv_dim, bias=False)
        self.a_proj = nn.Linear(embed_dim, num_v_heads * head_dim, bias=False)
        self.b_proj = nn.Linear(embed_dim, num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, num_v_heads)))
        self.dt_bias = nn.Parameter(torch.full((num_v_heads * head_dim,), 0.05))
        self.out_proj = nn.Linear(num_v_heads * self.v_head_dim, embed_dim, bias=False)

    @property
    def layer_shape(self) -> LayerShape:
        return LayerShape(self.num_heads, self.num_v_heads, self.head_dim, self.v_head_dim)

    # --- projections and the recurrence --------------------------------------------------

    def _project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        return self.qkv_proj(x), self.a_proj(x), self.b_proj(x)

    def _split_qkv(self, mixed_qkv: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        h, hv, k_dim = self.num_heads, self.num_v_heads, self.head_dim
        qkv = mixed_qkv.float()
        q = qkv[..., : h * k_dim].unflatten(-1, (h, k_dim))
        k = qkv[..., h * k_dim : 2 * h * k_dim].unflatten(-1, (h, k_dim))
        v = qkv[..., 2 * h * k_dim :].unflatten(-1, (hv, self.v_head_dim))
        if self.use_qk_l2norm:
            q, k = kda_ops.l2_normalize(q), kda_ops.l2_normalize(k)
        return q, k, v

    def _log_decay(self, a: Tensor) -> Tensor:
        """Log-decays ``[..., HV, K]`` of the gate inputs ``a``."""
        if self.lower_bound is None:
            return kda_ops.kda_gate(a, self.A_log, self.dt_bias, self.num_v_heads)
        # bounded gate: lb * sigmoid(exp(A_log) * (a + dt_bias)), kept in the activation dtype
        x = (a + self.dt_bias).unflatten(-1, (self.num_v_heads, self.head_dim))
        rate = self.A_log.exp().unsqueeze(-1)
        return self.lower_bound * torch.sigmoid(rate * x)  # expect-bug: promotion id=bounded-prefill

    def _recurrence(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """Outputs and deltas ``[B, T, HV, V]`` and the final state, from ``state [B, HV, V, K]``."""
        group = self.num_v_heads // self.num_heads
        keys = k.repeat_interleave(group, dim=2)
        queries = q.repeat_interleave(group, dim=2) * self.scaling
        outs, deltas = [], []
        for t in range(q.shape[1]):
            decayed = state * g[:, t].float().exp().unsqueeze(2)
            delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", decayed, keys[:, t]))
            state = decayed + delta.unsqueeze(-1) * keys[:, t].unsqueeze(2)
            outs.append(torch.einsum("bhvk,bhk->bhv", state, queries[:, t]))
            deltas.append(delta)
        return torch.stack(outs, dim=1), torch.stack(deltas, dim=1), state

    # --- incremental buffers -------------------------------------------------------------

    def buffer_shapes(self, bsz: int) -> Dict[str, Tuple[int, ...]]:
        h, hv, k_dim, v_dim, L = self.num_heads, self.num_v_heads, self.head_dim, self.v_head_dim, self.ring_len
        return {
            "prev_state": (bsz, hv, v_dim, k_dim),
            "prev_delta": (bsz, hv, L, v_dim),
            "prev_key": (bsz, h, L, k_dim),
            "prev_log_decay": (bsz, hv, L, k_dim),
        }

    def _empty_buffer(self, bsz: int, x: Tensor) -> Dict[str, Optional[Tensor]]:
        cfg = self.state_config
        ring_dtype = cfg.ring_dtype or x.dtype
        shapes = self.buffer_shapes(bsz)
        return {
            "prev_state": torch.zeros(shapes["prev_state"], dtype=cfg.state_dtype, device=x.device),
            "prev_delta": torch.zeros(shapes["prev_delta"], dtype=ring_dtype, device=x.device),
            "prev_key": torch.zeros(shapes["prev_key"], dtype=ring_dtype, device=x.device),
            "prev_log_decay": torch.zeros(shapes["prev_log_decay"], dtype=cfg.log_decay_dtype, device=x.device),
            "write_pos": torch.zeros(bsz, dtype=torch.int32, device=x.device),
        }

    def _grown_buffer(self, buf: Dict[str, Optional[Tensor]], bsz: int) -> Dict[str, Optional[Tensor]]:
        """Zeroed buffers for ``bsz`` rows, on the device and in the dtypes of ``buf``."""
        d = buf["prev_delta"]
        return {
            "prev_state": buf["prev_state"].new_zeros((bsz, *buf["prev_state"].shape[1:])),
            "prev_delta": d.new_zeros((bsz, *d.shape[1:])),
            "prev_key": buf["prev_key"].new_zeros((bsz, *buf["prev_key"].shape[1:])),
            "prev_log_decay": d.new_zeros((bsz, self.num_v_heads, self.ring_len, self.head_dim)),  # expect-bug: like
            "write_pos": buf["write_pos"].new_zeros(bsz),
        }

    def extend_incremental_state(
        self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], extra: int
    ) -> None:
        """Adds ``extra`` empty rows at the end of the batch (new sequences, or bucket padding)."""
        buf = self._get_input_buffer(incremental_state)
        if not buf or extra <= 0:
            return
        bsz = buf["prev_delta"].size(0)
        grown = self._grown_buffer(buf, bsz + extra)
        for key, value in buf.items():
            if value is not None:
                grown[key][:bsz] = value
        self._set_input_buffer(incremental_state, grown)

    # --- forward -------------------------------------------------------------------------

    def forward(
        self,
        query: Tensor,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
    ) -> Tensor:
        """Input and output ``T x B x C``."""
        tgt_len, bsz, _ = query.shape
        x = query.transpose(0, 1)
        if incremental_state is None:
            out = self._forward_full(x)
        else:
            saved = self._get_input_buffer(incremental_state)
            if not saved and tgt_len > 1:
                out, saved = self._prefill(x)
            else:
                if not saved:
                    saved = self._empty_buffer(bsz, x)
                out = self._decode(x, saved)
            incremental_state = self._set_input_buffer(incremental_state, saved)
        return self.out_proj(out.to(query.dtype).flatten(2)).transpose(0, 1)

    def _forward_full(self, x: Tensor) -> Tensor:
        mixed_qkv, a, b = self._project(x)
        q, k, v = self._split_qkv(mixed_qkv)
        g = kda_ops.kda_gate(a, self.A_log, self.dt_bias, self.num_v_heads, self.lower_bound)
        state = x.new_zeros(x.shape[0], self.num_v_heads, self.v_head_dim, self.head_dim, dtype=torch.float32)
        outs, _, _ = self._recurrence(q, k, v, g, torch.sigmoid(b.float()), state)
        return outs

    def _prefill(self, x: Tensor) -> Tuple[Tensor, Dict[str, Optional[Tensor]]]:
        """The first call of a sequence with a ``T > 1`` prompt."""
        bsz, steps, _ = x.shape
        mixed_qkv, a, b = self._project(x)
        q, k, v = self._split_qkv(mixed_qkv)
        g = self._log_decay(a)
        beta = torch.sigmoid(b.float())
        zero = torch.zeros(bsz, self.num_v_heads, self.v_head_dim, self.head_dim, dtype=self.state_config.state_dtype)
        outs, deltas, state = self._recurrence(q, k, v, g, beta, zero)
        if steps >= self.ring_len:
            # too long for the ring: the prompt is folded into the checkpoint, the rings start empty
            ring_dtype = self.state_config.ring_dtype or x.dtype
            shapes = self.buffer_shapes(bsz)
            delta_ring = torch.zeros(shapes["prev_delta"], dtype=ring_dtype, device=x.device)
            saved = {
                "prev_state": state.to(self.state_config.state_dtype),
                "prev_delta": delta_ring,
                "prev_key": torch.zeros(shapes["prev_key"], dtype=ring_dtype, device=x.device),
                "prev_log_decay": torch.zeros_like(delta_ring),  # expect-bug: like
                "write_pos": torch.zeros(bsz, dtype=torch.int32, device=x.device),
            }
            return outs, saved
        saved = self._empty_buffer(bsz, x)
        pad = (0, 0, 0, self.ring_len - steps)
        saved["prev_delta"] = F.pad(deltas.transpose(1, 2), pad).to(saved["prev_delta"].dtype)
        saved["prev_key"] = F.pad(k.transpose(1, 2), pad).to(saved["prev_key"].dtype)
        saved["prev_log_decay"] = F.pad(g.transpose(1, 2), pad)  # expect-bug: promotion id=bounded-prefill
        saved["write_pos"].fill_(steps)
        return outs, saved

    def _decode(self, x: Tensor, saved: Dict[str, Optional[Tensor]]) -> Tensor:
        """Feeds the ``T`` tokens of ``x [B, T, C]`` one by one through the decode kernel."""
        bsz, steps, _ = x.shape
        mixed_qkv, a, b = self._project(x)
        rows = torch.arange(bsz, dtype=torch.int32, device=x.device)
        outs = []
        for t in range(steps):
            pos = saved["write_pos"].clone()
            out, _ = kda_ops.fused_recurrent_kda_replayssm_decode(
                mixed_qkv[:, t],
                a[:, t],
                b[:, t],
                self.A_log,
                self.dt_bias,
                self.scaling,
                initial_state=saved["prev_state"],
                d_cache=saved["prev_delta"],
                k_cache=saved["prev_key"],
                g_cache=saved["prev_log_decay"],
                ssm_state_indices=rows,
                write_pos=pos,
                use_qk_l2norm_in_kernel=self.use_qk_l2norm,
                lower_bound=self.lower_bound,
            )
            kda_ops.advance_write_pos(saved["write_pos"], rows, pos, self.ring_len)
            outs.append(out[:, 0])
        return torch.stack(outs, dim=1)

    def step_slots(
        self, x: Tensor, cache: nn.Module, slots: Tensor, force_flush: Optional[Tensor] = None
    ) -> Tensor:
        """One token for each row of ``x [B, C]`` on the slots of a ``LayerSlotCache``."""
        mixed_qkv, a, b = self._project(x)
        rings: KernelRings = cache.kernel_rings(slots)
        ring_kwargs = rings._asdict()
        if rings.d_cache.dtype != x.dtype:
            # the fused kernel takes its rings in the activation dtype
            ring_kwargs = {name: t.to(x.dtype) if name.endswith("_cache") else t for name, t in ring_kwargs.items()}  # expect-bug: decode-arg
        out, _ = kda_ops.fused_recurrent_kda_replayssm_decode(
            mixed_qkv,
            a,
            b,
            self.A_log,
            self.dt_bias,
            self.scaling,
            ssm_state_indices=slots,
            force_flush=force_flush,
            use_qk_l2norm_in_kernel=self.use_qk_l2norm,
            lower_bound=self.lower_bound,
            **ring_kwargs,
        )
        cache.advance(slots, rings.write_pos, force_flush)
        return self.out_proj(out[:, 0].to(x.dtype).flatten(1))

    # --- beam search ---------------------------------------------------------------------

    @torch.jit.export
    def reorder_incremental_state(
        self,
        incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
        new_order: Tensor,
    ):
        """Reorder buffered internal state (for incremental generation)."""
        input_buffer = self._get_input_buffer(incremental_state)
        if input_buffer is not None:
            for k in input_buffer.keys():
                input_buffer_k = input_buffer[k]
                if input_buffer_k is not None:
                    input_buffer[k] = input_buffer_k.index_select(0, new_order)
            incremental_state = self._set_input_buffer(incremental_state, input_buffer)
        return incremental_state

    def _get_input_buffer(
        self, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]]
    ) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "attn_state")
        if result is not None:
            return result
        else:
            empty_result: Dict[str, Optional[Tensor]] = {}
            return empty_result

    def _set_input_buffer(
        self,
        incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
        buffer: Dict[str, Optional[Tensor]],
    ):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)


def _tiny_layer(**kwargs) -> KimiDeltaAttention:
    torch.manual_seed(0)
    return KimiDeltaAttention(32, num_heads=2, num_v_heads=4, head_dim=8, v_head_dim=8, ring_len=4, **kwargs)


def build_layer_decode_bf16() -> Dict[str, object]:
    """A bf16 layer: a 2-token prompt, five single-token steps with a beam reorder in between;
    and an fp32 layer that folds a 6-token prompt into its checkpoint."""
    layer = _tiny_layer(state_config=IncrementalStateConfig.for_model_dtype(torch.bfloat16)).to(torch.bfloat16)
    state: Dict[str, Dict[str, Optional[Tensor]]] = {}
    layer(torch.randn(2, 2, 32).to(torch.bfloat16), state)
    for step in range(5):
        if step == 3:
            layer.reorder_incremental_state(state, torch.tensor([1, 1]))
        layer(torch.randn(1, 2, 32).to(torch.bfloat16), state)
    decode = dict(kda_ops.last_decode_call())

    fp32 = _tiny_layer(state_config=IncrementalStateConfig.for_model_dtype(torch.float32))
    long_state: Dict[str, Dict[str, Optional[Tensor]]] = {}
    fp32(torch.randn(6, 1, 32), long_state)
    fp32(torch.randn(1, 1, 32), long_state)
    return {
        "buffer": layer._get_input_buffer(state),
        "decode": decode,
        "long_prompt_fp32": fp32._get_input_buffer(long_state),
    }


def build_layer_prompts_bf16() -> Dict[str, object]:
    """bf16 layers: a 6-token prompt (longer than the ring), and a 3-token prompt on a
    bounded-gate layer (lower_bound=-5)."""
    cfg = IncrementalStateConfig.for_model_dtype(torch.bfloat16)
    layer = _tiny_layer(state_config=cfg).to(torch.bfloat16)
    long_state: Dict[str, Dict[str, Optional[Tensor]]] = {}
    layer(torch.randn(6, 2, 32).to(torch.bfloat16), long_state)
    layer(torch.randn(1, 2, 32).to(torch.bfloat16), long_state)

    bounded = _tiny_layer(state_config=cfg, lower_bound=-5.0).to(torch.bfloat16)
    short_state: Dict[str, Dict[str, Optional[Tensor]]] = {}
    bounded(torch.randn(3, 2, 32).to(torch.bfloat16), short_state)
    return {
        "long_prompt": layer._get_input_buffer(long_state),
        "bounded": bounded._get_input_buffer(short_state),
    }


def build_standalone_layer() -> Dict[str, object]:
    """A layer built without a state config (as in the README example), fed token by token."""
    layer = _tiny_layer()
    state: Dict[str, Dict[str, Optional[Tensor]]] = {}
    for _ in range(3):
        layer(torch.randn(1, 2, 32), state)
    return {"buffer": layer._get_input_buffer(state)}
