"""Entrypoints for saving and loading the distributed checkpoints.

Functions `load` and `save` are equivalents of `torch.load` and `torch.save`
but expect torch.Tensors to be wrapped with classes from the `mapping` module.
Only the single-rank "torch" strategy exists here: every shard is the whole tensor.
"""

import json
import logging
import os
from enum import Enum
from typing import Any, Dict, Optional

import torch

from .mapping import ShardedObject, ShardedStateDict, ShardedTensor, StateDict, nested_items

logger = logging.getLogger(__name__)

_TENSORS_FILE = "__0_0.distcp"
_COMMON_FILE = "common.pt"
_METADATA_FILE = "metadata.json"


class StrictHandling(Enum):
    ASSUME_OK_UNEXPECTED = "assume_ok_unexpected"
    RAISE_UNEXPECTED = "raise_unexpected"
    RAISE_ALL = "raise_all"


class CheckpointingException(Exception):
    pass


def save(
    sharded_state_dict: ShardedStateDict,
    checkpoint_dir: str,
    sharded_strategy: Optional[str] = None,
    common_state_dict: Optional[StateDict] = None,
) -> None:
    """Saving entrypoint.

    Extracts ShardedTensors from the given state dict and saves them with the "torch" strategy;
    everything else goes to the common state dict.
    """
    if sharded_strategy not in (None, "torch"):
        raise CheckpointingException(f"unsupported strategy {sharded_strategy!r}")
    os.makedirs(checkpoint_dir, exist_ok=True)
    tensors: Dict[str, torch.Tensor] = {}
    objects: Dict[str, Any] = {}
    for key, value in nested_items(sharded_state_dict):
        if isinstance(value, ShardedTensor):
            if value.replica_id not in (0, (0, 0, 0)):
                continue
            tensors[value.key] = value.data.detach().clone()
        elif isinstance(value, ShardedObject):
            objects[value.key] = value.data
        else:
            objects[key] = value
    torch.save(tensors, os.path.join(checkpoint_dir, _TENSORS_FILE))
    torch.save({"objects": objects, "common": common_state_dict or {}}, os.path.join(checkpoint_dir, _COMMON_FILE))
    with open(os.path.join(checkpoint_dir, _METADATA_FILE), "w") as f:
        json.dump({"sharded_backend": "torch", "sharded_backend_version": 1, "common_backend": "torch"}, f)


def load_common_state_dict(checkpoint_dir: str) -> StateDict:
    """Load the common (non-sharded) part of a checkpoint."""
    common = torch.load(os.path.join(checkpoint_dir, _COMMON_FILE), map_location="cpu", weights_only=False)
    return common["common"]


def load(
    sharded_state_dict: ShardedStateDict,
    checkpoint_dir: str,
    strict: StrictHandling = StrictHandling.ASSUME_OK_UNEXPECTED,
) -> StateDict:
    """Loading entrypoint.

    Returns ``sharded_state_dict`` with every ShardedTensor replaced by the stored tensor (in the
    ShardedTensor's dtype) and every ShardedObject by the stored object.
    """
    stored = torch.load(os.path.join(checkpoint_dir, _TENSORS_FILE), map_location="cpu", weights_only=True)
    common = torch.load(os.path.join(checkpoint_dir, _COMMON_FILE), map_location="cpu", weights_only=False)
    missing = []
    loaded: StateDict = {}
    for key, value in nested_items(sharded_state_dict):
        if isinstance(value, ShardedTensor):
            if value.key not in stored:
                missing.append(value.key)
                continue
            tensor = stored[value.key]
            if tuple(tensor.shape) != tuple(value.global_shape) and not value.allow_shape_mismatch:
                raise CheckpointingException(
                    f"{value.key}: global shape {tuple(value.global_shape)} expected, {tuple(tensor.shape)} stored"
                )
            loaded[key] = tensor.to(dtype=value.dtype)
        elif isinstance(value, ShardedObject):
            loaded[key] = common["objects"].get(value.key)
        else:
            loaded[key] = value
    if missing and strict is StrictHandling.RAISE_ALL:
        raise CheckpointingException(f"missing keys in the checkpoint: {missing}")
    return loaded


def build_dist_checkpoint_roundtrip(tmp_dir):
    """Save a bf16 model and its resident decode state, load both into a fresh model."""
    from mcore_kda.core.inference.engines.static_engine import make_static_engine
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config
    from mcore_kda.core.transformer.module import Float16Module

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(
        bf16=True, kda_gate_lower_bound=-5.0, kda_state_dtype="fp32", kda_resident_inference_state=True,
        inference_max_batch_size=2,
    )
    model = Float16Module(config, kimi_linear_model_provider(config))
    engine = make_static_engine(model, max_batch_size=2)
    tokens = engine.generate([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]], num_tokens_to_generate=3)
    checkpoint_dir = os.path.join(tmp_dir, "iter_0000001")
    sharded = model.sharded_state_dict()
    sharded["replay"] = model.module.replay_buffer_sharded_state_dict()
    save(sharded, checkpoint_dir, common_state_dict={"iteration": 1, "tokens": tokens.tolist()})

    restored = Float16Module(config, kimi_linear_model_provider(config))
    target = restored.sharded_state_dict()
    target["replay"] = restored.module.replay_buffer_sharded_state_dict()
    loaded = load(target, checkpoint_dir)
    replay = {key[len("replay."):]: value for key, value in loaded.items() if key.startswith("replay.")}
    weights = {key: value for key, value in loaded.items() if not key.startswith("replay.")}
    restored.load_state_dict(weights)
    restored.module.copy_replay_buffers_(replay)
    return {"model": restored, "replay": replay, "tokens": tokens}
