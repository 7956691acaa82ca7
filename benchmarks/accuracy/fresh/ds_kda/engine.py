"""The v1 engine (``init_inference``) and the v2 ragged engine (``create_ragged_engine``)."""

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from . import kernels
from .config import DeepSpeedInferenceConfig, RaggedInferenceEngineConfig
from .modeling import KimiDeltaAttention, KimiLinearConfig, KimiLinearForCausalLM
from .module_inject import replace_kda_layers
from .ragged import DSReplayStateManager
from .utils import log_dist

Rings = dict[str, torch.Tensor]


@dataclass
class ReplayLayerState:
    """Decode rings of one KDA layer when the engine runs the HF modules (no kernel injection)."""

    ssm_state: torch.Tensor
    delta_cache: torch.Tensor
    key_cache: torch.Tensor
    alpha_cache: torch.Tensor
    write_pos: torch.Tensor


class InferenceEngine:
    """v1 engine: injects the fused containers (or keeps the HF modules) and converts the dtype."""

    def __init__(self, model: KimiLinearForCausalLM, config: DeepSpeedInferenceConfig) -> None:
        self._config = config
        self.module = model
        self.replay_states: list[ReplayLayerState] = []
        if config.replace_with_kernel_inject:
            self.module = replace_kda_layers(self.module, config)
        else:
            self.replay_states = self._allocate_replay_states()
        self._convert_to_dtype(config)
        log_dist(f"DeepSpeed-Inference config: dtype={config.dtype}", ranks=[0])

    def _allocate_replay_states(self) -> list[ReplayLayerState]:
        replay, ring_dtype = self._config.replay, self._config.dtype
        batch, ring_len = replay.max_batch_size, replay.ring_len
        gate_dtype = replay.gate_dtype  # expect-bug: container id=ds-gate-dtype
        states = []
        for attn in self.module.kda_layers():
            hv, h, dim = attn.num_heads, attn.num_k_heads, attn.head_dim
            state = ReplayLayerState(
                ssm_state=torch.zeros(batch, hv, dim, dim, dtype=torch.float32),
                delta_cache=torch.zeros(batch, hv, ring_len, dim, dtype=ring_dtype),
                key_cache=torch.zeros(batch, h, ring_len, dim, dtype=ring_dtype),
                alpha_cache=torch.zeros(batch, hv, ring_len, dim, dtype=gate_dtype),  # expect-bug: container id=ds-gate-dtype
                write_pos=torch.zeros(batch, dtype=torch.int32),
            )
            states.append(state)
        return states

    def _convert_to_dtype(self, config: DeepSpeedInferenceConfig) -> None:
        if config.dtype == torch.half:
            self.module.half()  # expect-bug: module-cast id=ds-convert
        elif config.dtype == torch.bfloat16:
            self.module.bfloat16()  # expect-bug: module-cast id=ds-convert
        elif config.dtype == torch.float:
            self.module.float()


def init_inference(
    model: KimiLinearForCausalLM,
    config: DeepSpeedInferenceConfig | dict[str, Any] | None = None,
    **kwargs: Any,
) -> InferenceEngine:
    """``deepspeed.init_inference``: settings come as a config, a dict, or keyword arguments."""
    if not isinstance(config, DeepSpeedInferenceConfig):
        config = DeepSpeedInferenceConfig(**{**(config or {}), **kwargs})
    return InferenceEngine(model, config)


class PrefillSeed(NamedTuple):
    """Ring rows of one slot after a prompt: [HV, L, V], [H, L, K], [HV, L, K]."""

    delta_rows: torch.Tensor
    key_rows: torch.Tensor
    alpha_cache: torch.Tensor


def seed_from_prefill(g: torch.Tensor, k: torch.Tensor, delta: torch.Tensor, L: int) -> PrefillSeed:
    """The last ``L`` steps of a prompt (``g`` [T, HV, K], ``k`` [T, H, K], ``delta`` [T, HV, V]);
    steps before the prompt start are padding."""
    steps = torch.arange(g.shape[0] - L, g.shape[0])
    valid = (steps >= 0).view(1, L, 1)
    index = steps.clamp(min=0)
    delta_rows = delta[index].transpose(0, 1) * valid
    key_rows = k[index].transpose(0, 1) * valid
    alpha_cache = torch.where(valid, g[index].transpose(0, 1), 0.0)  # expect-bug: promotion
    return PrefillSeed(delta_rows, key_rows, alpha_cache)


def seed_from_chunked_prefill(chunks: list[torch.Tensor], L: int) -> torch.Tensor:
    """Alpha-ring rows [HV, L, K] from the gate chunks [t_i, HV, K] of a chunked prefill."""
    g = torch.cat(chunks)[-L:].transpose(0, 1)
    pad = torch.zeros(g.shape[0], L - g.shape[1], g.shape[2], dtype=torch.float32)
    return torch.cat([pad, g], dim=1)


class InferenceEngineV2:
    """Ragged engine: the state manager owns the rings, ``put`` runs one decode step."""

    def __init__(self, model: KimiLinearForCausalLM, config: RaggedInferenceEngineConfig) -> None:
        self._config = config
        self._model = model.to(config.dtype)
        self.state_manager = DSReplayStateManager(config.state_manager, model.config, config.dtype)
        self._graph_inputs: Rings | None = None

    def _graph_decode_inputs(self, rings: Rings, slots: list[int]) -> Rings:
        """Static, capturable buffers holding the rows of the batch."""
        if self._graph_inputs is None:
            batch, dtype = self._config.state_manager.max_ragged_batch_size, self._config.dtype
            shape = {name: (batch, *ring.shape[1:]) for name, ring in rings.items()}
            self._graph_inputs = {
                "initial_state": torch.zeros(shape["initial_state"]),
                "d_cache": torch.zeros(shape["d_cache"], dtype=dtype),
                "k_cache": torch.zeros(shape["k_cache"], dtype=dtype),
                "g_cache": torch.zeros(shape["g_cache"], dtype=dtype),  # expect-bug: decode-arg
            }
        for name, ring in rings.items():
            for row, slot in enumerate(slots):
                self._graph_inputs[name][row].copy_(ring[slot])
        return self._graph_inputs

    def _decode_layer(
        self, layer_idx: int, attn: KimiDeltaAttention, hidden: torch.Tensor, slots: list[int]
    ) -> torch.Tensor:
        mgr = self.state_manager
        rings = {
            "initial_state": mgr.ssm_state[layer_idx],
            "d_cache": mgr.delta_cache[layer_idx],
            "k_cache": mgr.key_cache[layer_idx],
            "g_cache": mgr.alpha_cache[layer_idx],
        }
        slot_index = torch.tensor(slots, dtype=torch.int32)
        indices = slot_index
        if self._config.enable_cuda_graph:
            rings = self._graph_decode_inputs(rings, slots)
            indices = torch.arange(len(slots), dtype=torch.int32)
        out = hidden.new_zeros(hidden.shape[0], 1, attn.num_heads, attn.head_dim)
        kernels.kda_replayssm_decode(
            torch.cat([attn.q_proj(hidden), attn.k_proj(hidden), attn.v_proj(hidden)], -1),
            attn.f_proj(hidden),
            attn.b_proj(hidden),
            attn.A_log,
            attn.dt_bias,
            attn.head_dim**-0.5,
            out=out,
            ssm_state_indices=indices,
            write_pos=mgr.write_pos.index_select(0, slot_index),
            use_qk_l2norm_in_kernel=True,
            **rings,
        )
        return attn.o_proj(out.flatten(1))

    def put(self, batch_uids: list[int], batch_tokens: torch.Tensor) -> torch.Tensor:
        """One decode step for each sequence of ``batch_uids`` (one token each)."""
        seqs = [self.state_manager.get_or_create_sequence(uid) for uid in batch_uids]
        slots = [seq.slot for seq in seqs]
        hidden = self._model.embed_tokens(batch_tokens)
        for layer_idx, attn in enumerate(self._model.kda_layers()):
            hidden = hidden + self._decode_layer(layer_idx, attn, hidden, slots)
        self.state_manager.write_pos[slots] += 1
        return self._model.lm_head(self._model.norm(hidden))


def create_ragged_engine(
    model: KimiLinearForCausalLM, engine_config: RaggedInferenceEngineConfig
) -> InferenceEngineV2:
    log_dist(f"building ragged engine with dtype={engine_config.dtype}", ranks=[0])
    return InferenceEngineV2(model, engine_config)


def _model() -> KimiLinearForCausalLM:
    return KimiLinearForCausalLM(KimiLinearConfig())


def build_v1_kernel_inject_fp16() -> torch.nn.Module:
    return init_inference(_model(), dtype=torch.half, replace_with_kernel_inject=True).module


def build_v1_kernel_inject_fp32() -> torch.nn.Module:
    return init_inference(_model(), dtype=torch.float32, replace_with_kernel_inject=True).module


def build_v1_autotp_fp16() -> InferenceEngine:
    return init_inference(_model(), dtype=torch.half)


def build_v1_autotp_dict_config() -> InferenceEngine:
    return init_inference(_model(), config={"dtype": "fp16", "replay": {"gate_precision": "fp32"}})


def build_ragged_engine_bf16() -> dict[str, Any]:
    engine = create_ragged_engine(_model(), RaggedInferenceEngineConfig(dtype=torch.bfloat16))
    engine.put([101, 102], torch.tensor([1, 2]))
    return {"engine": engine, "last_call": dict(kernels.LAST_CALL)}


def build_ragged_engine_fp16() -> InferenceEngineV2:
    return create_ragged_engine(_model(), RaggedInferenceEngineConfig(dtype=torch.float16))


def build_graph_decode() -> dict[str, Any]:
    config = RaggedInferenceEngineConfig(dtype=torch.bfloat16, enable_cuda_graph=True)
    create_ragged_engine(_model(), config).put([101, 102], torch.tensor([1, 2]))
    return dict(kernels.LAST_CALL)


def _prefill() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = -torch.rand(3, 2, 4).to(torch.bfloat16)
    return g, torch.randn(3, 1, 4).to(torch.bfloat16), torch.randn(3, 2, 4).to(torch.bfloat16)


def build_prefill_seed() -> PrefillSeed:
    return seed_from_prefill(*_prefill(), L=4)


def build_chunked_prefill_seed() -> dict[str, torch.Tensor]:
    g = _prefill()[0]
    return {"alpha_cache": seed_from_chunked_prefill([g[:2], g[2:]], L=4)}
