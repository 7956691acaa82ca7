"""The model agent: builds the model and its caches, runs the forward steps
(lmdeploy/pytorch/engine/model_agent.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..config import STATE_NAMES, CacheConfig, ModelConfig, tiny_kimi_linear_config
from ..kernels import LAST_CALL
from ..models.kimi_linear import KimiMTPHead
from ..models.patch import create_patched_model
from ..utils import get_logger, str_to_torch_dtype
from .cache_engine import CacheEngine

logger = get_logger("lmdeploy")


@dataclass
class MigrationBlob:
    """One state of a request, as a prefill engine sends it to the decode engine."""

    data: bytes
    shape: tuple[int, ...]
    dtype: str


class BaseModelAgent:
    def __init__(self, model_config, cache_config, device="cpu", spec_method=None) -> None:
        self.model_config: ModelConfig = model_config
        self.cache_config: CacheConfig = cache_config
        self.device = torch.device(device)
        self.spec_method = spec_method
        self.patched_model: Any = None
        self.spec_model: Any = None
        self.cache_engine: Any = None

    def build_model(self) -> None:
        self.patched_model = create_patched_model(self.model_config, device=self.device)
        if self.spec_method == "mtp":
            self._build_spec_model()

    def _build_spec_model(self) -> None:
        """The MTP draft ships in fp32 next to the checkpoint; it serves in the model dtype."""
        draft = KimiMTPHead(self.model_config.hf_config, device=self.device)
        self.spec_model = draft.to(dtype=self.model_config.dtype)  # expect-bug: module-cast
        logger.info(f"spec model: {type(draft).__name__}")

    def build_cache_engine(self) -> None:
        self.cache_engine = CacheEngine(self.cache_config, self.model_config, device=self.device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, state_ids: torch.Tensor) -> torch.Tensor:
        write_pos = self.cache_engine.write_pos[state_ids.long()]
        caches = self.cache_engine.local_gpu_cache
        logits = self.patched_model(input_ids, caches, state_ids, write_pos)
        ring_len = self.model_config.hf_config.linear_attn_config["replay_len"]
        ids = state_ids.long()
        self.cache_engine.write_pos[ids] = (self.cache_engine.write_pos[ids] + 1) % ring_len
        return logits

    def recv_migrated_states(self, payload: dict[str, MigrationBlob]) -> dict[str, torch.Tensor]:
        """The states of a request prefilled on another engine, for its first decode step."""
        states = {}
        for name, blob in payload.items():
            buf = bytearray(blob.data)
            dtype = str_to_torch_dtype(blob.dtype)
            states[name] = torch.frombuffer(buf, dtype=dtype).view(blob.shape)  # expect-bug: load
        return states

    def migrate_into_slots(self, payload: dict[str, MigrationBlob], slot_ids: torch.Tensor):
        """Writes a migrated request's states into its slots of the cache engine."""
        for name, cache in zip(STATE_NAMES, self.cache_engine.local_gpu_cache, strict=True):
            blob = payload[name]
            values = torch.frombuffer(bytearray(blob.data), dtype=str_to_torch_dtype(blob.dtype))
            cache[slot_ids.long()] = values.view(blob.shape).to(cache.dtype)


def _agent(spec_method: str | None = None) -> BaseModelAgent:
    model_config = ModelConfig.from_hf_config(tiny_kimi_linear_config(), dtype="bfloat16")
    cache_config = CacheConfig(max_batches=2, block_size=16, num_gpu_blocks=4)
    agent = BaseModelAgent(model_config, cache_config, spec_method=spec_method)
    agent.build_model()
    agent.build_cache_engine()
    return agent


def _peer_payload(model_config: ModelConfig) -> dict[str, MigrationBlob]:
    """What an engine that keeps the rings in the model dtype sends for one request."""
    payload = {}
    for name, (shape, _) in zip(STATE_NAMES, model_config.states_shapes, strict=True):
        wire = "float32" if name == "recurrent_state" else "bfloat16"
        values = torch.linspace(-1.0, 0.0, math.prod(shape), dtype=str_to_torch_dtype(wire))
        payload[name] = MigrationBlob(values.view(torch.uint8).numpy().tobytes(), shape, wire)
    return payload


def build_agent_decode() -> dict[str, Any]:
    agent = _agent()
    agent.forward(torch.tensor([3, 5]), torch.tensor([1, 2], dtype=torch.int32))
    caches = dict(zip(STATE_NAMES, agent.cache_engine.local_gpu_cache, strict=True))
    return {"call": dict(LAST_CALL), "caches": caches, "write_pos": agent.cache_engine.write_pos}


def build_spec_agent() -> dict[str, torch.Tensor]:
    agent = _agent(spec_method="mtp")
    return dict(agent.spec_model.named_buffers())


def build_migrated_states() -> dict[str, torch.Tensor]:
    agent = _agent()
    return agent.recv_migrated_states(_peer_payload(agent.model_config))


def build_migrated_into_slots() -> dict[str, torch.Tensor]:
    agent = _agent()
    slot_ids = torch.tensor([1], dtype=torch.int32)
    agent.migrate_into_slots(_peer_payload(agent.model_config), slot_ids)
    return dict(zip(STATE_NAMES, agent.cache_engine.local_gpu_cache, strict=True))
