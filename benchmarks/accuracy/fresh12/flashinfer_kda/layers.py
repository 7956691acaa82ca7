"""KDA decode layers and the modules that hold their ReplaySSM rings as buffers."""

from typing import Optional, Tuple, Union

import torch
from torch import nn

from .jit import fused_recurrent_kda_replayssm_decode as kda_replay_decode
from .page import advance_write_pos
from .utils import ReplayRingConfig, canonicalize_torch_dtype, set_default_torch_dtype

CONFIG = ReplayRingConfig(num_qk_heads=2, num_v_heads=2, head_dim_k=8, head_dim_v=8, ring_len=4, kv_data_type="bf16")
HIDDEN = CONFIG.num_v_heads * CONFIG.head_dim_v


class KDAMixer(nn.Module):
    """Projections and gate parameters of one KDA layer; the rings are passed in."""

    def __init__(self, config: ReplayRingConfig, hidden_size: int, device=None, dtype=None) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        H, HV, K, V = config.num_qk_heads, config.num_v_heads, config.head_dim_k, config.head_dim_v
        self.config = config
        self.in_proj = nn.Linear(hidden_size, 2 * H * K + HV * V, bias=False, **factory_kwargs)
        self.a_proj = nn.Linear(hidden_size, HV * K, bias=False, **factory_kwargs)
        self.b_proj = nn.Linear(hidden_size, HV, bias=False, **factory_kwargs)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, HV, dtype=torch.float32, device=device)))
        self.dt_bias = nn.Parameter(torch.full((HV, K), 0.05, dtype=torch.float32, device=device))

    def forward(
        self,
        hidden_states: torch.Tensor,
        ring_cache: Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        write_pos: torch.Tensor,
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        cfg = self.config
        hidden_states = hidden_states.to(self.in_proj.weight.dtype)
        batch = hidden_states.shape[0]
        state, delta_buf, key_buf, log_decay_buf = ring_cache
        out = torch.zeros(batch, 1, cfg.num_v_heads, cfg.head_dim_v, dtype=hidden_states.dtype, device=hidden_states.device)
        kda_replay_decode(
            self.in_proj(hidden_states),
            self.a_proj(hidden_states).view(batch, cfg.num_v_heads, cfg.head_dim_k),
            self.b_proj(hidden_states),
            self.A_log,
            self.dt_bias,
            cfg.head_dim_k**-0.5,
            state,
            delta_buf,
            key_buf,
            log_decay_buf,
            out,
            slots,
            write_pos,
            force_flush=force_flush,
            lower_bound=cfg.lower_bound,
        )
        return out


class KDADecodeLayer(nn.Module):
    """A mixer with its own rings for ``num_slots`` slots."""

    def __init__(self, config: ReplayRingConfig, hidden_size: int, num_slots: int, layer_idx: int = 0, device=None, dtype=None) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        self.layer_idx = layer_idx
        self.mixer = KDAMixer(config, hidden_size, **factory_kwargs)
        shapes = config.ring_shapes(num_slots)
        self.register_buffer("ssm_state", torch.zeros(shapes["ssm_state"], **factory_kwargs), persistent=False)
        self.register_buffer("delta_buf", torch.zeros(shapes["delta_buf"], **factory_kwargs), persistent=False)
        self.register_buffer("key_buf", torch.zeros(shapes["key_buf"], **factory_kwargs), persistent=False)
        self.register_buffer("log_decay_buf", torch.zeros(shapes["log_decay_buf"], device=device), persistent=False)  # expect-bug: default-dtype id=layer-init
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32, device=device), persistent=False)

    def forward(self, hidden_states: torch.Tensor, slots: torch.Tensor, force_flush: Optional[torch.Tensor] = None) -> torch.Tensor:
        idx = slots.long()
        cursors = self.write_pos[idx]
        rings = (self.ssm_state, self.delta_buf, self.key_buf, self.log_decay_buf)
        out = self.mixer(hidden_states, rings, slots, cursors, force_flush)
        self.write_pos[idx] = advance_write_pos(cursors, self.delta_buf.shape[2], force_flush)
        return out


class KDAReplayCache(nn.Module):
    """Rings of one layer as buffers; module casts leave the log-decay ring in float32."""

    def __init__(self, config: ReplayRingConfig, num_slots: int, dtype=None, device=None) -> None:
        super().__init__()
        dtype = canonicalize_torch_dtype(dtype) if dtype is not None else config.state_data_type
        shapes = config.ring_shapes(num_slots)
        self.ring_len = config.ring_len
        self.register_buffer("ssm_state", torch.zeros(shapes["ssm_state"], dtype=dtype, device=device))
        self.register_buffer("delta_buf", torch.zeros(shapes["delta_buf"], dtype=dtype, device=device))
        self.register_buffer("key_buf", torch.zeros(shapes["key_buf"], dtype=dtype, device=device))
        self.register_buffer("log_decay_buf", torch.zeros(shapes["log_decay_buf"], dtype=torch.float32, device=device))
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32, device=device))

    def _apply(self, fn, recurse=True):
        log_decay = self._buffers["log_decay_buf"]
        super()._apply(fn, recurse)
        moved = self._buffers["log_decay_buf"]
        if moved.dtype != torch.float32:
            self._buffers["log_decay_buf"] = log_decay.to(device=moved.device)
        return self

    def rings(self) -> Tuple[torch.Tensor, ...]:
        return self.ssm_state, self.delta_buf, self.key_buf, self.log_decay_buf


class KDAStaticCache(nn.Module):
    """Rings of every layer, one allocation per kind (``[layers, slots, ...]``); ``layer(i)`` gives views."""

    def __init__(self, config: ReplayRingConfig, num_layers: int, num_slots: int, dtype=None, device=None) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        shapes = config.ring_shapes(num_slots)
        self.ring_len = config.ring_len
        self.register_buffer("ssm_state", torch.zeros((num_layers, *shapes["ssm_state"]), **factory_kwargs))
        self.register_buffer("delta_buf", torch.zeros((num_layers, *shapes["delta_buf"]), **factory_kwargs))
        self.register_buffer("key_buf", torch.zeros((num_layers, *shapes["key_buf"]), **factory_kwargs))
        self.register_buffer("log_decay_buf", torch.full((num_layers, *shapes["log_decay_buf"]), 0.0, device=device))  # expect-bug: default-dtype id=model-init
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32, device=device))

    def layer(self, i: int) -> Tuple[torch.Tensor, ...]:
        return self.ssm_state[i], self.delta_buf[i], self.key_buf[i], self.log_decay_buf[i]


class KDAModel(nn.Module):
    """A stack of mixers over a static cache; the hidden size is ``HV * V``."""

    def __init__(self, config: ReplayRingConfig, num_layers: int, num_slots: int, cache: Optional[nn.Module] = None, dtype=None) -> None:
        super().__init__()
        hidden = config.num_v_heads * config.head_dim_v
        self.layers = nn.ModuleList(KDAMixer(config, hidden, dtype=dtype) for _ in range(num_layers))
        self.cache = cache if cache is not None else KDAStaticCache(config, num_layers, num_slots, dtype=dtype)

    def forward(self, hidden_states: torch.Tensor, slots: torch.Tensor, force_flush: Optional[torch.Tensor] = None) -> torch.Tensor:
        idx = slots.long()
        cursors = self.cache.write_pos[idx]
        for i, layer in enumerate(self.layers):
            hidden_states = layer(hidden_states, self.cache.layer(i), slots, cursors, force_flush).flatten(1)
        self.cache.write_pos[idx] = advance_write_pos(cursors, self.cache.ring_len, force_flush)
        return hidden_states


def make_decode_layers(config: ReplayRingConfig, num_layers: int, num_slots: int, dtype: Union[str, torch.dtype]) -> nn.ModuleList:
    """Self-contained decode layers created directly in ``dtype``."""
    with set_default_torch_dtype(dtype):  # expect-bug: default-dtype id=layer-init
        return nn.ModuleList(KDADecodeLayer(config, HIDDEN, num_slots, layer_idx=i) for i in range(num_layers))


def init_decode_model(config: ReplayRingConfig, num_layers: int, num_slots: int, torch_dtype: Union[str, torch.dtype]) -> KDAModel:
    """A model whose weights and cache are created in ``torch_dtype`` (no float32 copy on the way)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(canonicalize_torch_dtype(torch_dtype))  # expect-bug: default-dtype id=model-init
    try:
        return KDAModel(config, num_layers, num_slots)
    finally:
        torch.set_default_dtype(previous)


def prepare_for_decode(model: KDAModel, dtype: Union[str, torch.dtype]) -> KDAModel:
    """Casts a float32 checkpoint's model for serving."""
    model.eval()
    return model.to(canonicalize_torch_dtype(dtype))  # expect-bug: module-cast


def _decode_steps(module: nn.Module, slots: torch.Tensor, steps: int, dtype: torch.dtype, flush_at: int = -1):
    outs = []
    for step in range(steps):
        flush = torch.full((len(slots),), int(step == flush_at), dtype=torch.int32)
        outs.append(module(torch.randn(len(slots), HIDDEN).to(dtype), slots, flush))
    return outs


def build_decode_stack():
    """A float32 model cast to bf16 for serving, and a model created in bf16; two steps each."""
    torch.manual_seed(31)
    slots = torch.tensor([0, 2], dtype=torch.int32)
    served = prepare_for_decode(KDAModel(CONFIG, num_layers=2, num_slots=3), "bf16")
    outs = _decode_steps(served, slots, 2, torch.bfloat16)
    direct = init_decode_model(CONFIG, num_layers=2, num_slots=3, torch_dtype=torch.bfloat16)
    outs += _decode_steps(direct, slots, 2, torch.bfloat16, flush_at=1)
    return {"served": served, "direct": direct, "outs": outs}


def build_cast_safe_layers():
    """Per-layer caches cast with the model, a model whose mixers alone are cast, and bf16 layers."""
    torch.manual_seed(32)
    slots = torch.tensor([1, 0], dtype=torch.int32)
    bf16_cache = KDAReplayCache(CONFIG, num_slots=2, dtype=torch.float32).to(torch.bfloat16)
    fp16_cache = KDAReplayCache(CONFIG, num_slots=2, dtype=torch.float32).half()
    model = KDAModel(CONFIG, num_layers=1, num_slots=2, cache=bf16_cache)
    model.layers.to(torch.bfloat16)
    outs = []
    for _ in range(2):
        cursors = bf16_cache.write_pos[slots.long()]
        outs.append(model.layers[0](torch.randn(2, HIDDEN), bf16_cache.rings(), slots, cursors))
        bf16_cache.write_pos[slots.long()] = advance_write_pos(cursors, CONFIG.ring_len)

    # a checkpoint saved in bf16 loads into the float32 ring by copy
    reloaded = KDAReplayCache(CONFIG, num_slots=2, dtype=torch.bfloat16)
    reloaded.load_state_dict({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in bf16_cache.state_dict().items()})

    layer = KDADecodeLayer(CONFIG, HIDDEN, num_slots=2, dtype=torch.bfloat16)
    outs += _decode_steps(layer, slots, 3, torch.bfloat16, flush_at=2)
    fp32_model = KDAModel(CONFIG, num_layers=2, num_slots=2)
    outs += _decode_steps(fp32_model, slots, 2, torch.float32)
    return {"bf16_cache": bf16_cache, "fp16_cache": fp16_cache, "model": model, "reloaded": reloaded, "layer": layer, "fp32_model": fp32_model, "outs": outs}


def build_half_layers():
    """Layers created in bf16 and float32 layers converted to fp16, three steps each."""
    torch.manual_seed(33)
    slots = torch.tensor([2, 1], dtype=torch.int32)
    bf16_layers = make_decode_layers(CONFIG, num_layers=2, num_slots=3, dtype="bf16")
    fp16_layers = nn.ModuleList(KDADecodeLayer(CONFIG, HIDDEN, num_slots=3, layer_idx=i) for i in range(2))
    fp16_layers.half()  # expect-bug: module-cast
    outs = []
    for layers, dtype in ((bf16_layers, torch.bfloat16), (fp16_layers, torch.float16)):
        for layer in layers:
            outs += _decode_steps(layer, slots, 3, dtype, flush_at=1)
    return {"bf16_layers": bf16_layers, "fp16_layers": fp16_layers, "outs": outs}
