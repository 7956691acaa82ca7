"""The v2 policy of Kimi Linear: checkpoint containers, model instantiation and finalization,
and the per-slot SSM tensors a sequence carries."""

import logging
from typing import Any, Dict

import torch
from torch import nn

from ...accelerator import CPU_Accelerator, accelerator_override, get_accelerator
from ...config_v2 import DSStateManagerConfig, DtypeEnum, MemoryConfig, RaggedInferenceEngineConfig, to_torch_dtype
from ...modules import KDARingBuffers, PinnedKDARingBuffers
from ..base import ContainerMap, InferenceV2Policy, LayerContainer
from .model import KimiLinearConfig, KimiLinearInferenceModel

logger = logging.getLogger(__name__)


class KimiLinearTransformerContainer(LayerContainer):
    PARAM_MAPPING = {
        "self_attn.q_proj.weight": "q_proj.weight",
        "self_attn.k_proj.weight": "k_proj.weight",
        "self_attn.v_proj.weight": "v_proj.weight",
        "self_attn.f_proj.weight": "f_proj.weight",
        "self_attn.b_proj.weight": "b_proj.weight",
        "self_attn.o_proj.weight": "o_proj.weight",
        "self_attn.A_log": "A_log",
        "self_attn.dt_bias": "dt_bias",
    }


class KimiLinearNonTransformerContainer(LayerContainer):
    PARAM_MAPPING = {
        "model.embed_tokens.weight": "embed.weight",
        "lm_head.weight": "lm_head.weight",
    }


# The per-slot tensors of one layer and their element types: "model" follows the serving dtype
# (or a narrower transfer dtype), the others are fixed.
SSM_SLOT_TENSORS: Dict[str, str] = {
    "state": "fp32",
    "delta_ring": "model",
    "key_ring": "model",
    "decay_ring": "fp32",
    "write_pos": "int32",
}


def slot_tensor_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    role = SSM_SLOT_TENSORS[name]
    return model_dtype if role == "model" else DtypeEnum(role).value


class KimiLinearPolicy(InferenceV2Policy):
    @property
    def dtype(self) -> torch.dtype:
        return to_torch_dtype(self._model_config.torch_dtype)

    def instantiate_model(self, engine_config: RaggedInferenceEngineConfig) -> KimiLinearInferenceModel:
        ring_cls = PinnedKDARingBuffers if engine_config.pin_compact_rings else KDARingBuffers
        return KimiLinearInferenceModel(self._model_config, engine_config, self.dtype, ring_buffer_cls=ring_cls)

    def build_container_map(self, model: KimiLinearInferenceModel) -> ContainerMap:
        container_map = ContainerMap()
        container_map.set_transformer_params("model.layers", [KimiLinearTransformerContainer(layer) for layer in model.layers])
        container_map.set_non_transformer_params(KimiLinearNonTransformerContainer(model))
        container_map.set_unmapped_params(["model.norm.weight"])
        return container_map

    def finalize_model(self, model: KimiLinearInferenceModel) -> nn.Module:
        accel = get_accelerator()
        if model.model_dtype is torch.bfloat16 and not accel.is_bf16_supported():
            logger.warning("%s has no bf16 support; serving the bf16 checkpoint in fp16", accel.device_name())
            model = model.half()  # expect-bug: module-cast
        return model


def _tiny_policy(torch_dtype: str = "bfloat16") -> KimiLinearPolicy:
    from ...checkpoint.engines import SyntheticCheckpointEngine

    config = KimiLinearConfig(torch_dtype=torch_dtype)
    return KimiLinearPolicy(config, SyntheticCheckpointEngine(config, seed=0))


def _ragged_run(policy: KimiLinearPolicy, engine_config: RaggedInferenceEngineConfig) -> Dict[str, Any]:
    from ...engine_v2 import InferenceEngineV2

    engine = InferenceEngineV2(policy, engine_config)
    logits = engine.put([0, 1], [[3, 4, 5], [6, 7]])
    logits = engine.put([0, 1], [[8], [9]])
    cache = engine.state_manager.ssm_cache
    return {"rings": [cache.layer(i) for i in range(cache.num_layers)], "logits": logits}


def build_compact_model_fp16_fallback() -> Dict[str, Any]:
    """The same model on an accelerator without bf16, which serves it in fp16."""
    torch.manual_seed(0)
    with accelerator_override(CPU_Accelerator(bf16=False)):
        result = _ragged_run(_tiny_policy(), RaggedInferenceEngineConfig(compact_slots=2))
    return result


def build_pinned_model_fp16_fallback() -> Dict[str, Any]:
    """The fp16 fallback with ``pin_compact_rings``: the model's buffers follow the cast except
    the checkpoint and log-decay rings."""
    torch.manual_seed(0)
    with accelerator_override(CPU_Accelerator(bf16=False)):
        result = _ragged_run(_tiny_policy(), RaggedInferenceEngineConfig(compact_slots=2, pin_compact_rings=True))
    return result


def build_lean_ring_policy() -> Dict[str, Any]:
    """A bf16 model with fp16 delta/key rings (``ring_policy="lean"``) in a blocked cache."""
    torch.manual_seed(0)
    state_manager = DSStateManagerConfig(memory_config=MemoryConfig(ring_policy="lean"))
    return _ragged_run(_tiny_policy(), RaggedInferenceEngineConfig(state_manager=state_manager))


def build_uniform_ring_policy() -> Dict[str, Any]:
    """A bf16 model whose rings all follow the model (``ring_policy="uniform"``)."""
    torch.manual_seed(0)
    state_manager = DSStateManagerConfig(memory_config={"ring_policy": "uniform"})
    return _ragged_run(_tiny_policy(), RaggedInferenceEngineConfig(state_manager=state_manager))
