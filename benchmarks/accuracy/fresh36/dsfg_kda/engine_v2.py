"""``InferenceEngineV2``: the ragged inference engine over a model implementation."""

import logging
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from .accelerator import get_accelerator
from .checkpoint.engines import SSMStateCheckpointEngine
from .config_v2 import DtypeEnum, RaggedInferenceEngineConfig
from .ragged import DSStateManager, LayerRings, RaggedBatchWrapper

logger = logging.getLogger(__name__)


class InferenceEngineV2:
    def __init__(self, policy: Any, engine_config: RaggedInferenceEngineConfig) -> None:
        self._config = engine_config
        self._policy = policy
        self._model = policy.build_model(engine_config)
        self._batch = RaggedBatchWrapper(engine_config.state_manager)
        self._state_manager = DSStateManager(
            engine_config.state_manager, self._model.ssm_cache_config(), ssm_cache=self._model.ssm_cache()
        )

    @property
    def model(self) -> Any:
        return self._model

    @property
    def state_manager(self) -> DSStateManager:
        return self._state_manager

    def put(self, batch_uids: Sequence[int], batch_tokens: Sequence[Sequence[int]], do_checks: bool = True) -> Tensor:
        """Runs the new tokens of each sequence; returns the float32 logits of their last tokens."""
        self._batch.clear()
        for uid, tokens in zip(batch_uids, batch_tokens):
            seq = self._state_manager.get_or_create_sequence(uid)
            self._batch.insert_sequence(seq, torch.as_tensor(list(tokens), dtype=torch.long), do_checks=do_checks)
        self._batch.finalize()
        logits = self._model.forward(self._batch, self._state_manager.ssm_cache)
        for seq in self._batch.current_sequences:
            seq.post_forward()
        return logits

    def query(self, uid: int) -> int:
        seq = self._state_manager.get_sequence(uid)
        return 0 if seq is None else seq.seen_tokens

    def flush(self, uid: int) -> None:
        self._state_manager.flush_sequence(uid)

    def serialize(self, save_path: str, ring_dtype: Optional[torch.dtype] = None) -> str:
        """Writes the SSM state of every tracked sequence (and which slot each one holds)."""
        cache = self._state_manager.ssm_cache
        layers = [cache.layer_tensors(i) for i in range(cache.num_layers)]
        slots = {uid: (seq.slot, seq.seen_tokens) for uid, seq in self._state_manager.tracked_sequences.items()}
        torch.save(slots, f"{save_path}/sequences.pt")
        return SSMStateCheckpointEngine(save_path).save(layers, model_dtype=self._model.model_dtype, ring_dtype=ring_dtype)

    def restore(self, save_path: str) -> None:
        """Restores a ``serialize``d engine: the loaded tensors become the cache's storage."""
        meta, layers = SSMStateCheckpointEngine(save_path).load(device=get_accelerator().current_device_name())
        cache = self._state_manager.ssm_cache
        if DtypeEnum(meta["model_dtype"]).value != self._model.model_dtype:
            logger.info("snapshot written by a %s replica; converting its rings", meta["model_dtype"])
            for i, tensors in enumerate(layers):
                ring_dtype = self._state_manager.ssm_configs[i].cache_dtype.value
                layers[i] = {
                    name: t.to(ring_dtype) if name.endswith("_ring") else t for name, t in tensors.items()  # expect-bug: load
                }
        slots = torch.load(f"{save_path}/sequences.pt", weights_only=True)
        for uid, (slot, seen_tokens) in slots.items():
            seq = self._state_manager.get_or_create_sequence(uid)
            if seq.slot != slot:
                raise RuntimeError(f"sequence {uid} restored on slot {seq.slot}, snapshot has {slot}")
            seq.seen_tokens = seen_tokens
        for i, tensors in enumerate(layers):
            cache.adopt_layer(i, tensors)

    def capture_decode_buffers(self, batch_size: int) -> List[Dict[str, Tensor]]:
        """Static per-layer kernel arguments for a captured decode graph of ``batch_size`` rows.

        ``decode_static`` gathers the batch's slots into them before the launch and scatters
        them back after, so the captured graph always sees the same addresses.
        """
        cache = self._state_manager.ssm_cache
        buffers = []
        for i in range(cache.num_layers):
            rings = cache.layer(i)
            d_cache, k_cache, g_cache = (
                rings.delta_ring.new_zeros((batch_size, *ring.shape[1:]))  # expect-bug: like
                for ring in (rings.delta_ring, rings.key_ring, rings.decay_ring)
            )
            buffers.append(
                {
                    "initial_state": torch.zeros((batch_size, *rings.state.shape[1:]), dtype=rings.state.dtype),
                    "d_cache": d_cache,
                    "k_cache": k_cache,
                    "g_cache": g_cache,
                    "write_pos": torch.zeros(batch_size, dtype=torch.int32),
                }
            )
        return buffers

    @torch.no_grad()
    def decode_static(self, buffers: List[Dict[str, Tensor]], batch_uids: Sequence[int], tokens: Sequence[int]) -> Tensor:
        """One decode token per sequence through the static buffers; returns float32 logits."""
        cache = self._state_manager.ssm_cache
        seqs = [self._state_manager.get_or_create_sequence(uid) for uid in batch_uids]
        slots = torch.tensor([seq.slot for seq in seqs], dtype=torch.long)
        n = len(seqs)
        layer_rings = []
        for i, static in enumerate(buffers):
            live = cache.layer(i)
            for name, field in zip(static, LayerRings._fields):
                static[name][:n].copy_(getattr(live, field)[slots])
            layer_rings.append(LayerRings(static["initial_state"], static["d_cache"], static["k_cache"], static["g_cache"], static["write_pos"]))
        slot_ids = torch.arange(n, dtype=torch.int32)
        hidden = self._model.decode_step(torch.as_tensor(list(tokens), dtype=torch.long), slot_ids, layer_rings)
        for i, static in enumerate(buffers):
            live = cache.layer(i)
            for name, field in zip(static, LayerRings._fields):
                target = getattr(live, field)
                target[slots] = static[name][:n].to(target.dtype)
        for seq in seqs:
            seq.seen_tokens += 1
        return self._model.lm_head(hidden).float()


def _tiny_engine(torch_dtype: str = "bfloat16", **engine_kwargs: Any) -> InferenceEngineV2:
    from .checkpoint.engines import SyntheticCheckpointEngine
    from .model_implementations.kimi_linear import KimiLinearConfig, KimiLinearPolicy

    config = KimiLinearConfig(torch_dtype=torch_dtype)
    policy = KimiLinearPolicy(config, SyntheticCheckpointEngine(config, seed=0))
    return InferenceEngineV2(policy, RaggedInferenceEngineConfig(**engine_kwargs))


def _layers(engine: InferenceEngineV2) -> List[LayerRings]:
    cache = engine.state_manager.ssm_cache
    return [cache.layer(i) for i in range(cache.num_layers)]


def build_engine_put_flush() -> Dict[str, Any]:
    """Ragged puts of three sequences on a bf16 engine; one is flushed and its slot reused."""
    torch.manual_seed(0)
    engine = _tiny_engine()
    first = engine.put([1, 2, 3], [[5, 6, 7, 8, 9], [10], [11, 12]])
    engine.flush(2)
    second = engine.put([1, 4, 3], [[13], [14, 15, 16], [17]])
    return {"rings": _layers(engine), "logits": torch.stack([first, second]), "seen": torch.tensor([engine.query(1), engine.query(4)])}


def build_engine_restore_other_dtype(tmp_dir: str) -> Dict[str, Any]:
    """A snapshot of an fp16 replica restored into a bf16 replica, which then continues."""
    torch.manual_seed(0)
    source = _tiny_engine("float16")
    source.put([1, 2], [[3, 4, 5], [6, 7]])
    source.serialize(tmp_dir)
    target = _tiny_engine("bfloat16")
    target.restore(tmp_dir)
    logits = target.put([1, 2], [[8], [9]])
    return {"rings": _layers(target), "logits": logits}


def build_static_decode_buffers() -> Dict[str, Any]:
    """Prompts through ``put``, then three decode steps through captured static buffers."""
    torch.manual_seed(0)
    engine = _tiny_engine()
    engine.put([1, 2], [[3, 4], [5, 6, 7]])
    buffers = engine.capture_decode_buffers(batch_size=2)
    logits = [engine.decode_static(buffers, [1, 2], [8 + step, 11 + step]) for step in range(3)]
    return {"static": buffers, "rings": _layers(engine), "logits": torch.stack(logits)}
