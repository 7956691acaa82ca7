"""KDA operators for decode: the ReplaySSM kernel (a pure-torch stand-in of the fused sglang
kernel), module-owned ring buffers, the injected attention layer and a graph runner with
fixed-address buffers."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..models.configuration_kimi_linear import KimiLinearConfig
from ..models.modeling_kimi_linear import KimiDeltaAttention
from ..util.custom_gguf import GGUFLoader
from ..util.utils import (
    advance_write_pos,
    alloc_ring_set,
    kda_cache_dtype,
    kda_compute_dtype,
    torch_default_dtype,
)
from .base_operator import BaseInjectedModule


def fused_recurrent_kda_replayssm_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = True,
    lower_bound: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM decode step per row (sglang argument order).

    Rebuilds each row's state from the checkpoint in ``initial_state`` and the ring rows before its
    cursor, writes the output into ``out`` and either appends one ring row (delta, key, log-decay)
    or, on a flush, writes the advanced state back into ``initial_state``. Arithmetic is float32;
    results are written back into the given tensors in their own dtypes.
    """
    num_rows = mixed_qkv.shape[0]
    _, hv, vd, kd = initial_state.shape
    h, ring_len = k_cache.shape[1], g_cache.shape[2]
    qkv = mixed_qkv.float()
    q = qkv[:, : h * kd].reshape(num_rows, h, kd)
    k = qkv[:, h * kd : 2 * h * kd].reshape(num_rows, h, kd)
    v = qkv[:, 2 * h * kd :].reshape(num_rows, hv, vd)
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    x = a.float().reshape(num_rows, hv, kd) + dt_bias.float().reshape(hv, kd)
    A = A_log.float().exp()[:, None]
    if lower_bound is None:
        g = -A * F.softplus(x, beta=1.0, threshold=20.0)
    else:
        g = lower_bound * torch.sigmoid(A * x)
    alpha = g.exp()
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    heads = torch.arange(hv, device=qkv.device) // (hv // h)
    for row in range(num_rows):
        slot = int(ssm_state_indices[row])
        if slot < 0:
            out[row].zero_()
            continue
        cursor = int(write_pos[row])
        flush = cursor == ring_len - 1 or (force_flush is not None and int(force_flush[row]) != 0)
        k_row, q_row = k[row, heads], q[row, heads] * scale
        state = initial_state[slot].float()
        if cursor > 0:
            prefix = g_cache[slot, :, :cursor].float().cumsum(1)
            total = prefix[:, -1]
            decayed_k = (total[:, None] - prefix).exp() * k_cache[slot][heads, :cursor].float()
            replayed = torch.einsum("hjv,hjk->hvk", d_cache[slot, :, :cursor].float(), decayed_k)
            state = state * total.exp()[:, None, :] + replayed
        alpha_row = alpha[row]
        state_q = torch.einsum("hvk,hk->hv", state, alpha_row * q_row)
        state_k = torch.einsum("hvk,hk->hv", state, alpha_row * k_row)
        delta = beta[row][:, None] * (v[row] - state_k)
        out[row, 0].copy_(state_q + delta * (k_row * q_row).sum(-1, keepdim=True))
        if flush:
            initial_state[slot].copy_(state * alpha_row[:, None, :] + delta[:, :, None] * k_row[:, None, :])
        else:
            d_cache[slot, :, cursor].copy_(delta)
            g_cache[slot, :, cursor].copy_(g[row])
            k_cache[slot, :, cursor].copy_(k[row])
    return out, initial_state


def random_decode_batch(config: KimiLinearConfig, num_rows: int, dtype: torch.dtype) -> dict:
    """Random kernel inputs for ``num_rows`` rows (activations in ``dtype``, gate parameters fp32)."""
    hv, kd = config.num_value_heads, config.head_dim
    return {
        "mixed_qkv": torch.randn(num_rows, config.mixed_qkv_dim).to(dtype),
        "a": torch.randn(num_rows, hv * kd).to(dtype),
        "b": torch.randn(num_rows, hv).to(dtype),
        "A_log": torch.linspace(0.0, 1.0, hv),
        "dt_bias": torch.linspace(-0.5, 0.5, hv * kd),
        "scale": kd**-0.5,
    }


class _RingStepMixin:
    """Decode step over module-owned rings (``state``, ``delta_ring``, ``key_ring``, ``alpha_log_ring``)."""

    def step(self, mixed_qkv, a, b, A_log, dt_bias, scale, slot_ids, force_flush=None, lower_bound=None):
        out = torch.empty(
            mixed_qkv.shape[0], 1, self.state.shape[1], self.state.shape[2], dtype=mixed_qkv.dtype
        )
        index = slot_ids.long()
        write_pos = self.write_pos[index]
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, A_log, dt_bias, scale,
            self.state, self.delta_ring, self.key_ring, self.alpha_log_ring,
            out, slot_ids, write_pos, force_flush=force_flush, lower_bound=lower_bound,
        )
        self.write_pos[index] = advance_write_pos(write_pos, self.alpha_log_ring.shape[2], force_flush)
        return out


class KDARingBuffers(_RingStepMixin, nn.Module):
    """Rings owned by one layer for ``num_slots`` sequences.

    ``state``, ``delta_ring`` and ``key_ring`` follow module casts; ``alpha_log_ring`` keeps float32
    through ``.to(dtype)``, ``.half()`` and ``.bfloat16()`` and only follows device moves.
    """

    def __init__(self, config: KimiLinearConfig, num_slots: int, dtype: torch.dtype, device: str = "cpu") -> None:
        super().__init__()
        shapes = config.ring_shapes(num_slots)
        self.register_buffer("state", torch.zeros(shapes["state"], dtype=dtype, device=device))
        self.register_buffer("delta_ring", torch.zeros(shapes["delta"], dtype=dtype, device=device))
        self.register_buffer("key_ring", torch.zeros(shapes["key"], dtype=dtype, device=device))
        self.register_buffer("alpha_log_ring", torch.zeros(shapes["alpha_log"], dtype=torch.float32, device=device))
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32, device=device))

    def _apply(self, fn, recurse=True):
        alpha_log = self._buffers["alpha_log_ring"]
        super()._apply(fn, recurse)
        self._buffers["alpha_log_ring"] = alpha_log.to(device=self._buffers["state"].device)
        return self


class KDATorchRingBuffers(_RingStepMixin, nn.Module):
    """Rings for the pure-torch backend, created under the activation dtype as default dtype; the
    log-decay ring is allocated in ``alpha_log_dtype``."""

    def __init__(
        self,
        config: KimiLinearConfig,
        num_slots: int,
        dtype: torch.dtype,
        alpha_log_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        shapes = config.ring_shapes(num_slots)
        with torch_default_dtype(dtype):
            self.register_buffer("state", torch.zeros(shapes["state"]))
            self.register_buffer("delta_ring", torch.zeros(shapes["delta"]))
            self.register_buffer("key_ring", torch.zeros(shapes["key"]))
            self.register_buffer("alpha_log_ring", torch.zeros(shapes["alpha_log"], dtype=alpha_log_dtype))
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32))

    def resize(self, num_slots: int) -> None:
        """Re-allocates every ring for ``num_slots`` sequences, keeping the slots that remain."""
        keep = min(num_slots, self.state.shape[0])
        for name in ("state", "delta_ring", "key_ring", "write_pos"):
            old = getattr(self, name)
            new = old.new_zeros((num_slots, *old.shape[1:]))
            new[:keep] = old[:keep]
            setattr(self, name, new)
        alpha_log = self.delta_ring.new_zeros((num_slots, *self.alpha_log_ring.shape[1:]))  # expect-bug: like
        alpha_log[:keep] = self.alpha_log_ring[:keep]
        self.alpha_log_ring = alpha_log


class KKimiDeltaAttention(BaseInjectedModule):
    """Injected KDA layer: projections from the original module, recurrence through the ReplaySSM kernel.

    ``ring_buffers`` picks where the rings live: ``"cache"`` (the ``KDAStaticCache`` passed to
    ``forward``), ``"pinned"`` (module-owned ``KDARingBuffers``) or ``"torch"``
    (module-owned ``KDATorchRingBuffers``). Module-owned rings are allocated by ``load``.
    """

    def __init__(
        self,
        key: str,
        gguf_loader: Optional[GGUFLoader],
        config: KimiLinearConfig,
        orig_module: KimiDeltaAttention,
        prefill_device: str = "cpu",
        generate_device: str = "cpu",
        ring_buffers: str = "cache",
        num_slots: Optional[int] = None,
        **kwargs,
    ) -> None:
        super().__init__(key, gguf_loader, config, orig_module, prefill_device, generate_device, **kwargs)
        object.__setattr__(self, "ring_buffers", ring_buffers)
        object.__setattr__(self, "num_slots", num_slots or config.max_batch_size)
        object.__setattr__(self, "layer_idx", orig_module.layer_idx)
        object.__setattr__(self, "scale", config.head_dim**-0.5)
        self.rings = None

    def load(self) -> None:
        if self.gguf_loader is not None:
            super().load()
        if self.ring_buffers == "pinned":
            dtype = kda_cache_dtype(self.config, "delta")
            self.rings = KDARingBuffers(self.config, self.num_slots, dtype=dtype, device=self.generate_device)
        elif self.ring_buffers == "torch":
            self.rings = KDATorchRingBuffers(self.config, self.num_slots, dtype=kda_compute_dtype(self.config))

    def spare_rings(self, num_slots: Optional[int] = None) -> KDATorchRingBuffers:
        """A second ring set of the torch backend's layout, for swapping a sequence in while another decodes."""
        return KDATorchRingBuffers(
            self.config,
            num_slots or self.num_slots,
            dtype=kda_compute_dtype(self.config),
            alpha_log_dtype=kda_cache_dtype(self.config, "alpha_log"),  # expect-bug: imported-policy id=cache-dtype-policy
        )

    def prepare_for_fp16_generate(self) -> None:
        """Switches the layer to float16 for generate devices without bfloat16 arithmetic."""
        self.orig_module.half()
        self.rings.half()  # expect-bug: module-cast

    def _kernel_inputs(self, hidden_states: torch.Tensor, force_flush: Optional[torch.Tensor]) -> dict:
        mixed_qkv, a, b = self.orig_module.project(hidden_states.to(self.generate_device))
        return {
            "mixed_qkv": mixed_qkv,
            "a": a,
            "b": b,
            "A_log": self.orig_module.A_log,
            "dt_bias": self.orig_module.dt_bias,
            "scale": self.scale,
            "force_flush": force_flush,
            "lower_bound": self.config.kda_lower_bound,
        }

    def forward(self, hidden_states, cache=None, slot_ids=None, force_flush=None, **kwargs):
        bsz = hidden_states.shape[0]
        inputs = self._kernel_inputs(hidden_states, force_flush)
        if cache is not None:
            out = cache.step(self.layer_idx, slot_ids=slot_ids, **inputs)
        else:
            out = self.rings.step(slot_ids=slot_ids, **inputs)
        return self.orig_module.o_proj(out.reshape(bsz, -1))

    def prefill_stepwise(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor]:
        """Runs a prompt (``[T, hidden]``, ``T < L``) token by token through the kernel on a one-slot
        scratch ring set and returns that set with its cursor."""
        act_dtype = hidden_states.dtype
        shapes = self.config.ring_shapes(1)
        with torch_default_dtype(act_dtype):
            state = torch.zeros(shapes["state"])
            delta_ring = torch.zeros(shapes["delta"])
            key_ring = torch.zeros(shapes["key"])
            alpha_log_ring = torch.zeros(shapes["alpha_log"])  # expect-bug: default-dtype
            out = torch.zeros(1, 1, self.config.num_value_heads, self.config.v_head_dim)
        slot = torch.zeros(1, dtype=torch.int32)
        write_pos = torch.zeros(1, dtype=torch.int32)
        for t in range(hidden_states.shape[0]):
            inputs = self._kernel_inputs(hidden_states[t : t + 1], None)
            fused_recurrent_kda_replayssm_decode(
                **inputs, initial_state=state, d_cache=delta_ring, k_cache=key_ring,
                g_cache=alpha_log_ring, out=out, ssm_state_indices=slot, write_pos=write_pos,
            )
            write_pos = advance_write_pos(write_pos, self.config.replay_ring_len)
        return {"state": state, "delta": delta_ring, "key": key_ring, "alpha_log": alpha_log_ring, "write_pos": write_pos}

    def prefill_chunk(self, hidden_states: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ring set ``prefill_stepwise`` leaves, computed for the whole prompt at once."""
        cfg, attn = self.config, self.orig_module
        steps, act_dtype = hidden_states.shape[0], hidden_states.dtype
        h, hv, kd, vd = cfg.num_attention_heads, cfg.num_value_heads, cfg.head_dim, cfg.v_head_dim
        pad = cfg.replay_ring_len - steps
        mixed_qkv, a, b = attn.project(hidden_states)
        log_decay = -attn.A_log.exp()[:, None] * F.softplus(a.view(steps, hv, kd) + attn.dt_bias.view(hv, kd))
        qkv = mixed_qkv.float()
        k = F.normalize(qkv[:, h * kd : 2 * h * kd].view(steps, h, kd), dim=-1, eps=1e-6)
        v = qkv[:, 2 * h * kd :].view(steps, hv, vd)
        beta = torch.sigmoid(b.float()).to(b.dtype).float()
        k_v = k[:, torch.arange(hv) // (hv // h)]
        state = torch.zeros(hv, vd, kd)
        deltas = []
        for t in range(steps):
            state = state * log_decay[t].float().exp()[:, None, :]
            delta = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", state, k_v[t]))
            state = state + delta[:, :, None] * k_v[t][:, None, :]
            deltas.append(delta)
        delta_ring = F.pad(torch.stack(deltas, dim=1), (0, 0, 0, pad)).to(act_dtype)[None]
        key_ring = F.pad(k.transpose(0, 1), (0, 0, 0, pad)).to(act_dtype)[None]
        alpha_log_ring = torch.cat([log_decay.transpose(0, 1), log_decay.new_zeros(hv, pad, kd)], dim=1)[None]  # expect-bug: promotion
        checkpoint = torch.zeros(1, hv, vd, kd, dtype=act_dtype)
        write_pos = torch.full((1,), steps, dtype=torch.int32)
        return {"state": checkpoint, "delta": delta_ring, "key": key_ring, "alpha_log": alpha_log_ring, "write_pos": write_pos}


class KDAGraphRunner:
    """Fixed-address buffers for one layer's decode step, replayed through a captured closure
    (CUDA-graph style). ``replay`` copies the inputs and the rings of the given slots in, runs the
    captured step and copies the rings back into the cache."""

    def __init__(self, attn: KKimiDeltaAttention, batch_size: int) -> None:
        self.attn = attn
        self.config = attn.config
        self.dtype = kda_compute_dtype(attn.config)
        self.alpha_log_graphs: dict[int, Callable[[], torch.Tensor]] = {}
        self._allocate(batch_size)

    def _allocate(self, batch_size: int) -> None:
        self.batch_size = batch_size
        shapes = self.config.ring_shapes(batch_size)
        with torch_default_dtype(self.dtype):
            self.static_hidden = torch.zeros(batch_size, self.config.hidden_size)
            self.static_out = torch.zeros(batch_size, 1, self.config.num_value_heads, self.config.v_head_dim)
            self.static_state = torch.zeros(shapes["state"])
            self.static_delta = torch.zeros(shapes["delta"])
            self.static_key = torch.zeros(shapes["key"])
        self.static_alpha_log = torch.zeros(shapes["alpha_log"])
        self.static_slots = torch.arange(batch_size, dtype=torch.int32)
        self.static_write_pos = torch.zeros(batch_size, dtype=torch.int32)

    def capture(self) -> None:
        attn = self.attn

        def graph() -> torch.Tensor:
            inputs = attn._kernel_inputs(self.static_hidden, None)
            fused_recurrent_kda_replayssm_decode(
                **inputs, initial_state=self.static_state, d_cache=self.static_delta,
                k_cache=self.static_key, g_cache=self.static_alpha_log, out=self.static_out,
                ssm_state_indices=self.static_slots, write_pos=self.static_write_pos,
            )
            return self.static_out

        self.alpha_log_graphs[self.batch_size] = graph

    def regrow(self, batch_size: int) -> None:
        """Re-allocates the static buffers for a larger captured batch and captures again."""
        rings = alloc_ring_set(self.config.ring_shapes(batch_size), self.dtype)  # expect-bug: pool-dtype
        self.static_state, self.static_delta = rings["state"], rings["delta"]
        self.static_key, self.static_alpha_log = rings["key"], rings["alpha_log"]
        with torch_default_dtype(self.dtype):
            self.static_hidden = torch.zeros(batch_size, self.config.hidden_size)
            self.static_out = torch.zeros(batch_size, 1, self.config.num_value_heads, self.config.v_head_dim)
        self.static_slots = torch.arange(batch_size, dtype=torch.int32)
        self.static_write_pos = torch.zeros(batch_size, dtype=torch.int32)
        self.batch_size = batch_size
        self.capture()

    def replay(self, hidden_states: torch.Tensor, cache, slot_ids: torch.Tensor) -> torch.Tensor:
        n, index, layer = slot_ids.numel(), slot_ids.long(), self.attn.layer_idx
        self.static_hidden[:n].copy_(hidden_states)
        self.static_state[:n].copy_(cache.ssm_states[layer][index])
        self.static_delta[:n].copy_(cache.delta_cache[layer][index])
        self.static_key[:n].copy_(cache.key_cache[layer][index])
        self.static_alpha_log[:n].copy_(cache.alpha_log_cache[layer][index])
        self.static_write_pos[:n].copy_(cache.write_pos[index])
        out = self.alpha_log_graphs[self.batch_size]()
        for ring, static in (
            (cache.ssm_states[layer], self.static_state),
            (cache.delta_cache[layer], self.static_delta),
            (cache.key_cache[layer], self.static_key),
            (cache.alpha_log_cache[layer], self.static_alpha_log),
        ):
            ring[index] = static[:n].to(ring.dtype)
        return self.attn.orig_module.o_proj(out[:n].reshape(n, -1))


def _make_layer(config: KimiLinearConfig, ring_buffers: str, dtype: torch.dtype) -> KKimiDeltaAttention:
    orig = KimiDeltaAttention(config, layer_idx=0).to(dtype)
    layer = KKimiDeltaAttention(
        "model.layers.0.self_attn", None, config, orig, ring_buffers=ring_buffers, num_slots=config.max_batch_size
    )
    layer.load()
    return layer


def build_injected_attention():
    """An injected layer with pinned rings cast to bf16, decoded on its own rings, on a cache and
    through a captured graph."""
    from ..models.custom_cache import KDAStaticCache

    torch.manual_seed(21)
    config = KimiLinearConfig()
    layer = _make_layer(config, "pinned", torch.float32).to(torch.bfloat16)
    slot_ids = torch.tensor([0, 2], dtype=torch.int32)
    for _ in range(2):
        layer(torch.randn(2, config.hidden_size).bfloat16(), slot_ids=slot_ids)
    cache = KDAStaticCache(config)
    layer(torch.randn(2, config.hidden_size).bfloat16(), cache=cache, slot_ids=slot_ids)
    cache.advance(slot_ids)
    runner = KDAGraphRunner(layer, batch_size=2)
    runner.capture()
    runner.replay(torch.randn(2, config.hidden_size).bfloat16(), cache, slot_ids)
    cache.advance(slot_ids)

    restored = KDARingBuffers(config, config.max_batch_size, dtype=torch.bfloat16)
    restored.load_state_dict(layer.rings.state_dict())
    prompt_log_decay = -F.softplus(torch.randn(config.num_value_heads, 2, config.head_dim)).bfloat16()
    alpha_log_history = torch.cat([prompt_log_decay, cache.alpha_log_cache[0][0]], dim=1)
    return {
        "layer": layer,
        "cache": cache,
        "runner": runner,
        "restored_rings": restored,
        "alpha_log_history": alpha_log_history,
    }


def build_prompt_prefill():
    """Prompts prefilled token by token and as one chunk, and a decode cache adopting a prefill cache."""
    from ..models.custom_cache import KDAStaticCache

    torch.manual_seed(22)
    config = KimiLinearConfig(max_batch_size=2)
    layer = _make_layer(config, "cache", torch.bfloat16)
    prompt = torch.randn(2, config.hidden_size).bfloat16()
    stepwise = layer.prefill_stepwise(prompt)
    chunk = layer.prefill_chunk(prompt)

    prefill_cache = KDAStaticCache(config, device=layer.prefill_device)
    slot_ids = torch.tensor([0, 1], dtype=torch.int32)
    for t in range(prompt.shape[0]):
        layer(prompt[t : t + 1].expand(2, -1), cache=prefill_cache, slot_ids=slot_ids)
        prefill_cache.advance(slot_ids)
    decode_cache = KDAStaticCache(config, device=layer.generate_device)
    decode_cache.adopt_prefill(prefill_cache)
    layer(torch.randn(2, config.hidden_size).bfloat16(), cache=decode_cache, slot_ids=slot_ids)
    decode_cache.advance(slot_ids)
    return {"stepwise": stepwise, "chunk": chunk, "prefill_cache": prefill_cache, "decode_cache": decode_cache}


def build_graph_regrow():
    """A graph runner captured for two rows, then regrown to three."""
    from ..models.custom_cache import KDAStaticCache

    torch.manual_seed(23)
    config = KimiLinearConfig()
    layer = _make_layer(config, "cache", torch.bfloat16)
    cache = KDAStaticCache(config)
    runner = KDAGraphRunner(layer, batch_size=2)
    runner.capture()
    two = torch.tensor([0, 1], dtype=torch.int32)
    runner.replay(torch.randn(2, config.hidden_size).bfloat16(), cache, two)
    cache.advance(two)
    runner.regrow(3)
    three = torch.tensor([0, 1, 2], dtype=torch.int32)
    runner.replay(torch.randn(3, config.hidden_size).bfloat16(), cache, three)
    cache.advance(three)
    return {"runner": runner, "cache": cache}


def build_torch_ring_layer():
    """The torch ring backend: a layer moved to fp16, a spare ring set and a resized ring set."""
    torch.manual_seed(24)
    config = KimiLinearConfig()
    layer = _make_layer(config, "torch", torch.bfloat16)
    slot_ids = torch.tensor([1, 2], dtype=torch.int32)
    layer(torch.randn(2, config.hidden_size).bfloat16(), slot_ids=slot_ids)
    layer.prepare_for_fp16_generate()
    layer(torch.randn(2, config.hidden_size).half(), slot_ids=slot_ids)

    spare = layer.spare_rings(2)
    resized = KDATorchRingBuffers(config, 2, dtype=torch.bfloat16)
    batch = random_decode_batch(config, 2, torch.bfloat16)
    resized.step(slot_ids=torch.tensor([0, 1], dtype=torch.int32), **batch)
    resized.resize(3)
    return {"layer": layer, "spare_rings": spare, "resized_rings": resized}
