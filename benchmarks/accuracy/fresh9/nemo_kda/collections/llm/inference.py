"""Static inference context for the ReplaySSM decode state and the model inference wrapper
(``StaticInferenceContext`` / ``GPTInferenceWrapper`` in Megatron-Core)."""

from dataclasses import dataclass

import torch

from ...lightning.precision import STATE_DTYPES, MegatronMixedPrecision, torch_dtype_from_precision
from .kda_ops import LAST_LAUNCH
from .modules import KDABlock, KDAConfig

@dataclass
class StateDtypes:
    """dtypes of one layer's replay state; ``gate`` follows ``ring`` unless given."""

    ring: torch.dtype = torch.bfloat16
    gate: torch.dtype | None = None  # expect-bug: container id=gate-follows-ring
    state: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.gate is None:
            self.gate = self.ring  # expect-bug: container id=gate-follows-ring

@dataclass
class InferenceWrapperConfig:
    hidden_size: int
    params_dtype: torch.dtype
    inference_max_requests: int = 2

class KDAInferenceContext:
    """Replay state of a static batch: ``key_value_memory_dict[layer_number] -> {ring name: tensor}``."""

    def __init__(self, max_batch_size: int, max_sequence_length: int, ring_len: int) -> None:
        self.max_batch_size, self.max_sequence_length, self.ring_len = max_batch_size, max_sequence_length, ring_len
        self.write_pos = torch.zeros(max_batch_size, dtype=torch.int32)
        self.slot_indices = torch.arange(max_batch_size, dtype=torch.int32)
        self.key_value_memory_dict: dict[int, dict[str, torch.Tensor]] = {}
        self.spec_memory_dict: dict[int, dict[str, torch.Tensor]] = {}

    @classmethod
    def from_precision(cls, precision: str, config: KDAConfig, max_sequence_length: int = 64):
        ctx = cls(config.max_batch_size, max_sequence_length, config.replay_ring_len)
        ring, gate, state = STATE_DTYPES[precision]  # expect-bug: imported-policy id=state-table
        for layer_number in range(1, config.num_layers + 1):
            ctx.allocate_layer(layer_number, config, StateDtypes(ring, gate, state))
        return ctx

    @classmethod
    def from_config(cls, icfg, config: KDAConfig):
        """From the ``model.inference`` section (``state_precision`` / ``gate_precision``)."""
        ctx = cls(icfg.max_batch_size, icfg.max_sequence_length, config.replay_ring_len)
        dtypes = StateDtypes(ring=torch_dtype_from_precision(icfg.state_precision),
                             gate=torch_dtype_from_precision(icfg.gate_precision))  # expect-bug: imported-policy id=gate-precision
        for layer_number in range(1, config.num_layers + 1):
            ctx.allocate_layer(layer_number, config, dtypes)
        return ctx

    def allocate_layer(self, layer_number: int, config: KDAConfig, dtypes: StateDtypes) -> None:
        rings = {name: torch.zeros(shape, dtype=dtypes.gate if name == "gk_ring" else dtypes.ring)
                 for name, shape in config.replay_ring_shapes(self.max_batch_size).items()}
        rings["ssm_state"] = torch.zeros(config.ssm_state_shape(self.max_batch_size), dtype=dtypes.state)
        self.key_value_memory_dict[layer_number] = rings

    def allocate_static(self, layer_number: int, config: KDAConfig, dtype: torch.dtype) -> None:
        """CUDA-graph layout: one static buffer per ring, created in the graph's dtype."""
        shapes = config.replay_ring_shapes(self.max_batch_size).values()
        d, k, gk = (torch.zeros(shape, dtype=dtype) for shape in shapes)  # expect-bug: pool-dtype
        state = torch.zeros(config.ssm_state_shape(self.max_batch_size), dtype=torch.float32)
        self.key_value_memory_dict[layer_number] = {"d_ring": d, "k_ring": k, "gk_ring": gk, "ssm_state": state}

    def allocate_for_model(self, layer_number: int, config: KDAConfig) -> None:
        shapes = config.replay_ring_shapes(self.max_batch_size)
        rings = {name: torch.zeros(shapes[name], dtype=config.params_dtype) for name in ("d_ring", "k_ring")}
        rings["gk_ring"] = torch.full(shapes["gk_ring"], 0.0)  # expect-bug: default-dtype id=setup-default
        rings["ssm_state"] = torch.zeros(config.ssm_state_shape(self.max_batch_size), dtype=torch.float32)
        self.key_value_memory_dict[layer_number] = rings

    def gk_ring(self, layer_number: int) -> torch.Tensor:
        return self.key_value_memory_dict[layer_number]["gk_ring"]

    def grow(self, max_batch_size: int) -> None:
        """Re-sizes every layer's state for more requests, keeping the live rows."""
        for rings in self.key_value_memory_dict.values():
            for name, old in rings.items():
                rings[name] = torch.cat([old, old.new_zeros(max_batch_size - old.shape[0], *old.shape[1:])])
        self.write_pos = torch.cat([self.write_pos, self.write_pos.new_zeros(max_batch_size - self.max_batch_size)])
        self.max_batch_size = max_batch_size

    def reset_requests(self, finished: torch.Tensor) -> None:
        """Zeros the state of finished requests so their rows can take new ones."""
        keep = (~finished).view(-1, 1, 1, 1)
        for rings in self.key_value_memory_dict.values():
            act = rings["d_ring"]
            rings["d_ring"], rings["k_ring"] = act * keep.type_as(act), rings["k_ring"] * keep.type_as(act)
            rings["gk_ring"] = torch.where(keep, rings["gk_ring"], 0.0).type_as(act)  # expect-bug: cast
            rings["ssm_state"] = rings["ssm_state"] * keep.type_as(act)
        self.write_pos.masked_fill_(finished, 0)

    def speculative_rings(self, layer_number: int, num_tokens: int) -> dict[str, torch.Tensor]:
        """Scratch rings for ``num_tokens`` draft steps of one layer."""
        d, k = self.key_value_memory_dict[layer_number]["d_ring"], self.key_value_memory_dict[layer_number]["k_ring"]
        spec = {name: t.new_zeros(*t.shape[:2], num_tokens, t.shape[-1]) for name, t in (("d_ring", d), ("k_ring", k))}
        spec["gk_ring"] = d.new_zeros(*d.shape[:2], num_tokens, k.shape[-1])  # expect-bug: like
        self.spec_memory_dict[layer_number] = spec
        return spec

class KDAInferenceWrapper:
    """Runs one decode step of every KDA layer over an inference context."""

    def __init__(self, model: KDABlock, inference_wrapper_config: InferenceWrapperConfig,
                 inference_context: KDAInferenceContext, precision_plugin: MegatronMixedPrecision | None = None):
        self.model, self.inference_wrapper_config = model, inference_wrapper_config
        self.inference_context, self.precision_plugin = inference_context, precision_plugin

    def run_one_forward_step(self, hidden: torch.Tensor) -> torch.Tensor:
        ctx, plugin = self.inference_context, self.precision_plugin
        hidden = plugin.convert_input(hidden) if plugin is not None else hidden
        for layer_number, layer in enumerate(self.model.layers, start=1):
            rings = ctx.key_value_memory_dict[layer_number]
            ring_kwargs = {"d_cache": rings["d_ring"], "k_cache": rings["k_ring"], "g_cache": rings["gk_ring"]}
            if plugin is not None:
                ring_kwargs = plugin.convert_input(ring_kwargs)  # expect-bug: decode-arg
            hidden = layer(hidden, ctx.slot_indices, ctx.write_pos, initial_state=rings["ssm_state"], **ring_kwargs)
        ctx.write_pos += 1
        return hidden

def _stepped(precision_plugin: MegatronMixedPrecision | None = None, steps: int = 2) -> KDAInferenceContext:
    cfg = KDAConfig(params_dtype=torch.bfloat16, bf16=True)
    ctx = KDAInferenceContext.from_precision("bf16-mixed", cfg)
    wrapper = KDAInferenceWrapper(KDABlock(cfg), InferenceWrapperConfig(cfg.hidden_size, cfg.params_dtype), ctx,
                                  precision_plugin)
    hidden = torch.randn(2, cfg.hidden_size, dtype=torch.bfloat16)
    for _ in range(steps):
        hidden = wrapper.run_one_forward_step(hidden)
    return ctx

def build_static_contexts() -> dict:
    """A bf16-mixed context after two steps and a resize, and an fp16 context with an fp32 gate."""
    ctx = _stepped()
    launch, explicit = dict(LAST_LAUNCH), KDAInferenceContext(2, 32, ctx.ring_len)
    ctx.grow(3)
    explicit.allocate_layer(1, KDAConfig(), StateDtypes(ring=torch.float16, gate=torch.float32))
    return {"context": ctx.key_value_memory_dict, "explicit": explicit.key_value_memory_dict, "launch": launch}

def build_fp16_contexts() -> dict:
    """fp16 contexts from the precision table, with default state dtypes and in the CUDA-graph layout; and fp32."""
    cfg = KDAConfig(params_dtype=torch.float16, fp16=True)
    defaults, static = (KDAInferenceContext(cfg.max_batch_size, 32, cfg.replay_ring_len) for _ in range(2))
    defaults.allocate_layer(1, cfg, StateDtypes(ring=torch.float16))
    static.allocate_static(1, cfg, torch.float16)
    return {"table": KDAInferenceContext.from_precision("16-mixed", cfg).key_value_memory_dict,
            "defaults": defaults.key_value_memory_dict, "static": static.key_value_memory_dict,
            "fp32": KDAInferenceContext.from_precision("32", cfg).key_value_memory_dict}

def build_decode_requests() -> dict:
    """Two steps under the bf16 plugin, then a finished request reset and draft scratch rings."""
    ctx = _stepped(MegatronMixedPrecision("bf16-mixed"))
    launch = dict(LAST_LAUNCH)
    ctx.reset_requests(torch.tensor([False, True]))
    ctx.speculative_rings(1, num_tokens=2)
    return {"launch": launch, "context": ctx.key_value_memory_dict, "speculative": ctx.spec_memory_dict}
