"""Megatron-Core-style modules of the KDA hybrid: ``KDAConfig``, ``MegatronModule``, the KDA mixer with its
replay rings as decode buffers, the decoder block and ``Float16Module``."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kda_ops import LAST_LAUNCH, replayssm_decode

@dataclass
class KDAConfig:
    """The ``TransformerConfig`` fields the KDA layers read (H key heads, HV value heads)."""

    num_layers: int = 2
    hidden_size: int = 16
    num_attention_heads: int = 2
    num_value_heads: int = 4
    kv_channels: int = 4
    value_channels: int = 4
    replay_ring_len: int = 4
    max_batch_size: int = 2
    gate_logit_normalizer: float = 16.0
    params_dtype: torch.dtype = torch.float32
    fp16: bool = False
    bf16: bool = False
    gk_ring_dtype: str = "float32"

    def replay_ring_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        h, hv, L = self.num_attention_heads, self.num_value_heads, self.replay_ring_len
        return {"d_ring": (batch, hv, L, self.value_channels), "k_ring": (batch, h, L, self.kv_channels),
                "gk_ring": (batch, hv, L, self.kv_channels)}

    def ssm_state_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, self.num_value_heads, self.value_channels, self.kv_channels)

class MegatronModule(nn.Module):
    def __init__(self, config: KDAConfig) -> None:
        super().__init__()
        self.config = config

    def state_dict_for_save_checkpoint(self, prefix: str = "", keep_vars: bool = False) -> dict:
        return self.state_dict(prefix=prefix, keep_vars=keep_vars)

class KDAMixer(MegatronModule):
    """Kimi Delta Attention; the replay rings of ``max_batch_size`` requests are non-persistent buffers."""

    def __init__(self, config: KDAConfig, layer_number: int = 1) -> None:
        super().__init__(config)
        c, dt = config, config.params_dtype
        self.layer_number = layer_number
        self.split = [c.num_value_heads * c.kv_channels, c.num_attention_heads * c.kv_channels,
                      c.num_value_heads * c.value_channels]
        self.in_proj = nn.Linear(c.hidden_size, sum(self.split), bias=False, dtype=dt)
        self.gk_proj = nn.Linear(c.hidden_size, self.split[0], bias=False, dtype=dt)
        self.b_proj = nn.Linear(c.hidden_size, c.num_value_heads, bias=False, dtype=dt)
        self.out_proj = nn.Linear(self.split[2], c.hidden_size, bias=False, dtype=dt)
        shapes = c.replay_ring_shapes(c.max_batch_size)
        self.register_buffer("d_ring", torch.zeros(shapes["d_ring"], dtype=dt), persistent=False)
        self.register_buffer("k_ring", torch.zeros(shapes["k_ring"], dtype=dt), persistent=False)
        self.register_buffer("gk_ring", torch.zeros(shapes["gk_ring"]), persistent=False)  # expect-bug: default-dtype id=init-default
        self.register_buffer("ssm_state", torch.zeros(c.ssm_state_shape(c.max_batch_size), dtype=torch.float32),
                             persistent=False)

    def allocate_decode_buffers(self, max_batch_size: int) -> None:
        """Re-sizes the decode buffers for ``max_batch_size`` requests."""
        for name, shape in self.config.replay_ring_shapes(max_batch_size).items():
            self.register_buffer(name, torch.zeros(shape, dtype=self.config.params_dtype), persistent=False)  # expect-bug: pool-dtype
        self.register_buffer("ssm_state", torch.zeros(self.config.ssm_state_shape(max_batch_size)), persistent=False)

    def forward(self, hidden: torch.Tensor, slots: torch.Tensor, write_pos: torch.Tensor, **decode_kwargs):
        """One decode step; ``decode_kwargs`` (rings, ``initial_state``) stand in for the module's buffers."""
        c = self.config
        q, k, v = self.in_proj(hidden).split(self.split, dim=-1)
        q, k, v = q.reshape(-1, c.num_value_heads, c.kv_channels), k.reshape(-1, c.num_attention_heads, c.kv_channels), v.reshape(-1, c.num_value_heads, c.value_channels)
        log_decay = F.logsigmoid(self.gk_proj(hidden).float()).view_as(q) / c.gate_logit_normalizer
        beta = self.b_proj(hidden).float().sigmoid()
        if decode_kwargs:
            out = replayssm_decode(q, k, v, log_decay, beta, ssm_state_indices=slots, write_pos=write_pos, **decode_kwargs)
        else:
            out = replayssm_decode(q, k, v, log_decay, beta, initial_state=self.ssm_state, d_cache=self.d_ring,
                                   k_cache=self.k_ring, g_cache=self.gk_ring, ssm_state_indices=slots, write_pos=write_pos)
        return hidden + self.out_proj(out.flatten(1).to(self.out_proj.weight.dtype))

    def prefill(self, hidden: torch.Tensor) -> None:
        """Seeds every request's rings from the last ``replay_ring_len`` prompt steps ([B, T, hidden])."""
        c, L, (B, T, _) = self.config, self.config.replay_ring_len, hidden.shape
        _, k, v = self.in_proj(hidden).split(self.split, dim=-1)
        k = k.view(B, T, c.num_attention_heads, c.kv_channels).transpose(1, 2)[:, :, -L:]
        v = v.view(B, T, c.num_value_heads, c.value_channels).transpose(1, 2)[:, :, -L:]
        beta = self.b_proj(hidden).sigmoid().transpose(1, 2)[:, :, -L:, None]
        gk = F.logsigmoid(self.gk_proj(hidden)).view(B, T, -1, c.kv_channels).transpose(1, 2)[:, :, -L:] / c.gate_logit_normalizer  # expect-bug: promotion
        self.d_ring, self.k_ring, self.gk_ring = (beta * v).contiguous(), k.contiguous(), gk.contiguous()

    def swap_out(self) -> dict[str, torch.Tensor]:
        """Host copies of the decode buffers (request preemption)."""
        return {name: buf.to("cpu", copy=True) for name, buf in self.named_buffers(recurse=False)}

    def swap_in(self, host: dict[str, torch.Tensor]) -> None:
        ref = self.d_ring
        self.d_ring, self.k_ring = host["d_ring"].to(ref), host["k_ring"].to(ref)
        self.gk_ring = host["gk_ring"].to(ref)  # expect-bug: cast
        self.ssm_state = host["ssm_state"].to(ref.device)

    def set_replay_state(self, state: dict[str, torch.Tensor]) -> None:
        """Installs a snapshot in ``swap_out`` layout; ones from before ``gk_ring`` was saved restart it at zero."""
        self.d_ring.copy_(state["d_ring"])
        self.k_ring.copy_(state["k_ring"])
        if "gk_ring" in state:
            self.gk_ring.copy_(state["gk_ring"])
        else:
            self.gk_ring = torch.zeros_like(self.d_ring)  # expect-bug: like
        self.ssm_state.copy_(state["ssm_state"])

class PinnedKDAMixer(KDAMixer):
    """Keeps the gate ring and the checkpoint state in fp32 through ``.to()``, ``.half()`` and ``Float16Module``."""

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name in ("gk_ring", "ssm_state"):
            self._buffers[name] = self._buffers[name].to(getattr(torch, self.config.gk_ring_dtype))
        return self

class KDABlock(MegatronModule):
    def __init__(self, config: KDAConfig, mixer_cls: type[KDAMixer] = KDAMixer) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(mixer_cls(config, n) for n in range(1, config.num_layers + 1))

    def forward(self, hidden, slots, write_pos):
        for layer in self.layers:
            hidden = layer(hidden, slots, write_pos)
        return hidden

class Float16Module(MegatronModule):
    """Casts the wrapped module to fp16/bf16 and converts its inputs and outputs."""

    def __init__(self, config: KDAConfig, module: nn.Module) -> None:
        super().__init__(config)
        if not (config.fp16 or config.bf16):
            raise ValueError("Float16Module needs fp16 or bf16")
        self.dtype = torch.float16 if config.fp16 else torch.bfloat16
        self.add_module("module", module.half() if config.fp16 else module.bfloat16())  # expect-bug: module-cast

    def forward(self, hidden, *args, **kwargs):
        return self.module(hidden.to(self.dtype), *args, **kwargs).float()

def build_pinned_stack() -> dict:
    """Pinned bf16 mixers after two steps, a pinned mixer cast with ``.half()``, a snapshot restored into a mixer."""
    cfg = KDAConfig(params_dtype=torch.bfloat16, bf16=True)
    model = Float16Module(cfg, KDABlock(cfg, PinnedKDAMixer))
    slots, write_pos = torch.tensor([1, 0], dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    hidden = torch.randn(2, cfg.hidden_size)
    for _ in range(2):
        hidden = model(hidden, slots, write_pos)
        write_pos += 1
    snapshot, restored = model.module.layers[0].swap_out(), KDAMixer(cfg)
    restored.set_replay_state(snapshot)
    return {"model": model, "half": PinnedKDAMixer(cfg).half(), "snapshot": snapshot, "restored": restored,
            "launch": dict(LAST_LAUNCH)}

def build_decode_buffers() -> dict:
    """bf16 mixers after a resize, a prefill, a swap round trip and a restore of an old snapshot."""
    cfg = KDAConfig(params_dtype=torch.bfloat16, bf16=True)
    resized, prefilled, swapped, legacy = (KDAMixer(cfg, n) for n in range(1, 5))
    resized.allocate_decode_buffers(3)
    prefilled.prefill(torch.randn(2, 6, cfg.hidden_size, dtype=torch.bfloat16))
    swapped.swap_in(swapped.swap_out())
    legacy.set_replay_state({name: t for name, t in legacy.swap_out().items() if name != "gk_ring"})
    return {"resized": resized, "prefilled": prefilled, "swapped": swapped, "legacy": legacy}
