"""MII-style entry points: ``pipeline()`` for in-process generation, and the replica-side
operations a serving deployment needs (sequence migration, snapshot and restart)."""

import contextlib
import itertools
import logging
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ..accelerator import get_accelerator
from ..checkpoint.engines import SyntheticCheckpointEngine
from ..engine_factory import create_kda_engine
from ..engine_v2 import InferenceEngineV2
from ..config_v2 import DtypeEnum
from ..model_implementations.kimi_linear import KimiLinearConfig
from ..model_implementations.kimi_linear.policy import slot_tensor_dtype
from .config import ModelConfig

logger = logging.getLogger(__name__)

_SUPPORTED_MODELS = {"kimi-linear-tiny": KimiLinearConfig}


def _init_process(model_config: ModelConfig) -> None:
    """Per-process setup of a replica, before any model code runs."""
    torch.manual_seed(model_config.seed)
    torch.set_default_dtype(model_config.torch_dtype)  # expect-bug: default-dtype id=proc-default


def _load_engine(model_config: ModelConfig) -> InferenceEngineV2:
    if model_config.model_name_or_path not in _SUPPORTED_MODELS:
        raise ValueError(f"unknown model {model_config.model_name_or_path!r}")
    checkpoint_dtype = DtypeEnum(model_config.checkpoint_torch_dtype)
    hf_config = _SUPPORTED_MODELS[model_config.model_name_or_path](torch_dtype=checkpoint_dtype.name)
    checkpoint = SyntheticCheckpointEngine(hf_config, seed=model_config.seed)
    engine = create_kda_engine(checkpoint, model_config.inference_engine_config)
    if model_config.checkpoint_torch_dtype != model_config.torch_dtype:
        logger.info("casting %s weights to %s", checkpoint_dtype.name, model_config.dtype.name)
        engine.model.to(get_accelerator().current_device_name(), dtype=model_config.torch_dtype)  # expect-bug: module-cast
    return engine


class MIIPipeline:
    def __init__(self, model_config: ModelConfig, engine: InferenceEngineV2) -> None:
        self._config = model_config
        self.engine = engine
        self._uids = itertools.count()

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: Optional[int] = None, keep_alive: bool = False
    ) -> Tuple[List[int], List[List[int]]]:
        """Greedy generation; with ``keep_alive`` the sequences stay tracked (for a follow-up
        turn or a migration) and their uids are returned."""
        max_new_tokens = self._config.max_new_tokens if max_new_tokens is None else max_new_tokens
        uids = [next(self._uids) for _ in prompts]
        outputs: List[List[int]] = [[] for _ in prompts]
        logits = self.engine.put(uids, prompts)
        for _ in range(max_new_tokens):
            next_tokens = logits.argmax(dim=-1).tolist()
            for out, token in zip(outputs, next_tokens):
                out.append(int(token))
            logits = self.engine.put(uids, [[token] for token in next_tokens])
        if not keep_alive:
            for uid in uids:
                self.engine.flush(uid)
        return uids, outputs

    def __call__(self, prompts: Sequence[Sequence[int]], max_new_tokens: Optional[int] = None) -> List[List[int]]:
        return self.generate(prompts, max_new_tokens)[1]

    def export_sequence(self, uid: int, wire_dtype: Optional[torch.dtype] = None) -> Dict[str, Any]:
        """A tracked sequence's SSM slot, per layer, for another replica; ``wire_dtype`` narrows
        the tensors that follow the model dtype."""
        state_manager = self.engine.state_manager
        seq = state_manager.get_sequence(uid)
        cache = state_manager.ssm_cache
        narrow = wire_dtype or self.engine.model.model_dtype
        layers = [
            {name: t.to(slot_tensor_dtype(name, narrow), copy=True) for name, t in cache.slot_tensors(i, seq.slot).items()}
            for i in range(cache.num_layers)
        ]
        return {"seen_tokens": seq.seen_tokens, "layers": layers}

    def export_sequences(self, uids: Sequence[int], wire_dtype: torch.dtype) -> Dict[str, Any]:
        """Several sequences at once (draining a replica): one stacked tensor per layer and name,
        floating-point rings in ``wire_dtype``."""
        state_manager = self.engine.state_manager
        cache = state_manager.ssm_cache
        slots = torch.tensor([state_manager.get_sequence(uid).slot for uid in uids], dtype=torch.long)
        layers = []
        for i in range(cache.num_layers):
            tensors = cache.layer_tensors(i)
            layers.append({name: t[slots].to(wire_dtype) if t.is_floating_point() and name != "state" else t[slots] for name, t in tensors.items()})  # expect-bug: load
        seen = [state_manager.get_sequence(uid).seen_tokens for uid in uids]
        return {"seen_tokens": seen, "layers": layers}

    def import_sequence(self, payload: Dict[str, Any], row: Optional[int] = None) -> int:
        """Tracks a migrated sequence under a new uid; ``row`` picks one of ``export_sequences``."""
        uid = next(self._uids)
        seq = self.engine.state_manager.get_or_create_sequence(uid)
        cache = self.engine.state_manager.ssm_cache
        for i, tensors in enumerate(payload["layers"]):
            cache.load_slot(i, seq.slot, tensors if row is None else {n: t[row] for n, t in tensors.items()})
        seen = payload["seen_tokens"]
        seq.seen_tokens = seen if row is None else seen[row]
        return uid

    def serialize(self, save_path: str) -> str:
        return self.engine.serialize(save_path)

    def restore(self, save_path: str) -> None:
        self.engine.restore(save_path)
        tracked = self.engine.state_manager.tracked_sequences
        self._uids = itertools.count(max(tracked, default=-1) + 1)

    def rings(self) -> List[Any]:
        cache = self.engine.state_manager.ssm_cache
        return [cache.layer(i) for i in range(cache.num_layers)]


def pipeline(model_name_or_path: str = "kimi-linear-tiny", model_config: Optional[Dict[str, Any]] = None, **kwargs: Any) -> MIIPipeline:
    config = ModelConfig(**{"model_name_or_path": model_name_or_path, **(model_config or {}), **kwargs})
    _init_process(config)
    return MIIPipeline(config, _load_engine(config))


@contextlib.contextmanager
def _replica_process() -> Iterator[None]:
    """Undoes ``_init_process`` when an in-process replica (tests, notebooks) is done."""
    previous = torch.get_default_dtype()
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_pipeline_generate() -> Dict[str, Any]:
    """Greedy generation for two prompts on a bf16 ragged pipeline; one sequence is kept."""
    with _replica_process():
        pipe = pipeline(max_new_tokens=3)
        outputs = pipe([[1, 2, 3], [4, 5]])
        uids, kept = pipe.generate([[6, 7, 8, 9]], keep_alive=True)
        return {"rings": pipe.rings(), "tokens": torch.tensor(outputs), "kept": torch.tensor(kept)}


def build_pipeline_export_import() -> Dict[str, Any]:
    """A sequence moved from one bf16 replica to another over an fp16 wire, then continued."""
    with _replica_process():
        source, target = pipeline(max_new_tokens=2), pipeline(max_new_tokens=2)
        uids, _ = source.generate([[3, 1, 4, 1, 5]], keep_alive=True)
        payload = source.export_sequence(uids[0], wire_dtype=torch.float16)
        uid = target.import_sequence(payload)
        logits = target.engine.put([uid], [[9]])
        return {"payload": payload, "rings": target.rings(), "logits": logits}


def build_pipeline_drain() -> Dict[str, Any]:
    """A replica drained: two sequences exported together over an fp16 wire and imported."""
    with _replica_process():
        source, target = pipeline(max_new_tokens=2), pipeline(max_new_tokens=2)
        uids, _ = source.generate([[3, 1, 4], [1, 5, 9, 2]], keep_alive=True)
        payload = source.export_sequences(uids, torch.float16)
        moved = [target.import_sequence(payload, row=row) for row in range(len(uids))]
        logits = target.engine.put(moved, [[6], [5]])
        return {"payload": payload, "rings": target.rings(), "logits": logits}


def build_pipeline_compact_fp16() -> Dict[str, Any]:
    """A compact deployment serving an fp32 checkpoint in fp16."""
    with _replica_process():
        pipe = pipeline(dtype="fp16", checkpoint_dtype="fp32", deployment="compact", max_new_tokens=3)
        outputs = pipe([[2, 7, 1], [8, 2]])
        return {"rings": pipe.rings(), "tokens": torch.tensor(outputs), "buffers": pipe.engine.model.ring_buffers}


def build_pipeline_restart(tmp_dir: str) -> Dict[str, Any]:
    """A replica with fp16 rings snapshotted mid-conversation and restarted from the snapshot."""
    with _replica_process():
        first = pipeline(ring_dtype="fp16", max_new_tokens=2)
        uids, _ = first.generate([[1, 2, 3], [4, 5, 6, 7]], keep_alive=True)
        first.serialize(tmp_dir)
        restarted = pipeline(ring_dtype="fp16", max_new_tokens=2)
        restarted.restore(tmp_dir)
        logits = restarted.engine.put(uids, [[8], [9]])
        return {"before": first.rings(), "after": restarted.rings(), "logits": logits}
