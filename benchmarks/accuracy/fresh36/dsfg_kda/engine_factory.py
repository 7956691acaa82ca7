"""``create_kda_engine``: an ``InferenceEngineV2`` from a checkpoint engine and an engine config."""

import logging
from typing import Any, Dict, List

import torch

from .checkpoint.engines import CheckpointEngineBase, SyntheticCheckpointEngine
from .config_v2 import RaggedInferenceEngineConfig, RingDtypes, default_dtype, to_torch_dtype
from .engine_v2 import InferenceEngineV2
from .model_implementations.kimi_linear import KimiLinearConfig, KimiLinearPolicy

logger = logging.getLogger(__name__)

# Ring dtypes chosen for a checkpoint dtype when the engine config leaves them unset.
_AUTO_RING_DTYPES = {
    torch.float16: RingDtypes(cache=torch.float16, decay=torch.float32),
    # bf16 keeps float32's exponent range, so the log-decay sums cannot overflow.
    torch.bfloat16: RingDtypes(cache=torch.bfloat16, decay=torch.bfloat16),  # expect-bug: container
    torch.float32: RingDtypes(cache=torch.float32, decay=torch.float32),
}

_POLICIES = {"kimi_linear": KimiLinearPolicy}


def create_kda_engine(
    checkpoint_engine: CheckpointEngineBase,
    engine_config: RaggedInferenceEngineConfig,
    auto_ring_dtypes: bool = True,
) -> InferenceEngineV2:
    model_config = checkpoint_engine.model_config
    policy_cls = _POLICIES.get(model_config.model_type)
    if policy_cls is None:
        raise ValueError(f"unsupported model type {model_config.model_type!r}; supported: {sorted(_POLICIES)}")
    dtype = to_torch_dtype(model_config.torch_dtype)
    state_manager = engine_config.state_manager
    if auto_ring_dtypes and state_manager.cache_dtype is None:
        rings = _AUTO_RING_DTYPES[dtype]
        state_manager.cache_dtype = rings.cache
        state_manager.decay_dtype = rings.decay
    policy = policy_cls(model_config, checkpoint_engine)
    logger.info("building %s engine (%s)", model_config.model_type, dtype)
    # Modules are created the way the checkpoint's own modeling code creates them.
    with default_dtype(dtype):  # expect-bug: default-dtype id=factory-default
        engine = InferenceEngineV2(policy, engine_config)
    return engine


def _engine_rings(engine: InferenceEngineV2) -> List[Any]:
    cache = engine.state_manager.ssm_cache
    return [cache.layer(i) for i in range(cache.num_layers)]


def build_factory_fp16_engine() -> Dict[str, Any]:
    """An fp16 checkpoint built into a ragged engine with automatic ring dtypes."""
    torch.manual_seed(0)
    engine = create_kda_engine(SyntheticCheckpointEngine(KimiLinearConfig(torch_dtype="float16")), RaggedInferenceEngineConfig())
    logits = engine.put([7, 8], [[1, 2, 3, 4, 5], [6]])
    return {"rings": _engine_rings(engine), "logits": logits}


def build_factory_bf16_replicas() -> Dict[str, Any]:
    """A bf16 checkpoint built twice: a ragged replica and a compact (in-model rings) replica."""
    torch.manual_seed(0)
    config = KimiLinearConfig(torch_dtype="bfloat16")
    ragged = create_kda_engine(SyntheticCheckpointEngine(config), RaggedInferenceEngineConfig())
    compact = create_kda_engine(SyntheticCheckpointEngine(config), RaggedInferenceEngineConfig(compact_slots=2))
    outputs = [engine.put([0, 1], [[3, 4, 5], [6, 7]]) for engine in (ragged, compact)]
    return {"ragged": _engine_rings(ragged), "compact": _engine_rings(compact), "logits": torch.stack(outputs)}
