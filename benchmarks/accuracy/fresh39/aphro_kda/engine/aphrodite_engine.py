"""An LLM engine that receives requests and generates texts (token ids, in this package)."""
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..common.config import CacheConfig, DeviceConfig, EngineConfig, LoadConfig, ModelConfig, ParallelConfig, SchedulerConfig
from ..common.logger import init_logger
from ..common.sequence import ExecuteModelRequest, SequenceGroupMetadata
from ..common.utils import get_kv_cache_torch_dtype
from ..modeling.sampler import SamplingParams
from ..processing.preemption import InMemorySnapshotter
from ..task_handler.cache_engine import CacheEngine
from ..task_handler.worker import Worker
from .args_tools import EngineArgs

logger = init_logger(__name__)


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: List[int]
    output_token_ids: List[int]
    finished: bool
    metrics: Dict[str, float] = field(default_factory=dict)


@dataclass
class _Request:
    request_id: str
    prompt_token_ids: List[int]
    sampling_params: SamplingParams
    slot: int
    arrival_time: float
    consumed: int = 0
    output_token_ids: List[int] = field(default_factory=list)

    @property
    def next_input(self) -> int:
        if self.consumed < len(self.prompt_token_ids):
            return self.prompt_token_ids[self.consumed]
        return self.output_token_ids[-1]

    @property
    def finished(self) -> bool:
        max_tokens = self.sampling_params.max_tokens or 16
        return len(self.output_token_ids) >= max_tokens


class PrefixStateCache:
    """Cache blocks saved at the end of prompts, keyed by the prompt's token ids, so that requests
    sharing a system prompt start from its state instead of replaying it."""

    def __init__(self, num_entries: int, cache_config: CacheConfig, model_config: ModelConfig, parallel_config: ParallelConfig) -> None:
        shapes = model_config.get_kda_shapes(cache_config)
        layers = model_config.get_num_layers(parallel_config)
        self.storage_dtype = get_kv_cache_torch_dtype(cache_config.cache_dtype, model_config.dtype)
        self.ssm_state = torch.zeros((layers, num_entries, *shapes.ssm_state), dtype=torch.float32)
        self.delta = torch.zeros((layers, num_entries, *shapes.delta_cache), dtype=self.storage_dtype)
        self.keys = torch.zeros((layers, num_entries, *shapes.key_cache), dtype=self.storage_dtype)
        self.alpha_log = torch.zeros((layers, num_entries, *shapes.alpha_log_cache), dtype=self.storage_dtype)  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(num_entries, dtype=torch.int32)
        self.index: Dict[Tuple[int, ...], int] = {}
        self.num_entries = num_entries

    def _columns(self) -> Dict[str, torch.Tensor]:
        return {"ssm_state": self.ssm_state, "delta_cache": self.delta, "key_cache": self.keys, "alpha_log_cache": self.alpha_log}

    def insert(self, prefix: Tuple[int, ...], cache_engine: CacheEngine, block: int) -> None:
        if prefix in self.index or len(self.index) >= self.num_entries:
            return
        entry = len(self.index)
        for i, layer in enumerate(cache_engine.gpu_cache):
            for name, column in self._columns().items():
                column[i, entry].copy_(getattr(layer, name)[block])
        self.write_pos[entry] = cache_engine.write_pos[block]
        self.index[prefix] = entry

    def restore(self, prefix: Tuple[int, ...], cache_engine: CacheEngine, block: int) -> bool:
        entry = self.index.get(prefix)
        if entry is None:
            return False
        for i, layer in enumerate(cache_engine.gpu_cache):
            for name, column in self._columns().items():
                getattr(layer, name)[block].copy_(column[i, entry])
        cache_engine.write_pos[block] = self.write_pos[entry]
        return True


class AphroditeEngine:
    def __init__(
        self,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        parallel_config: ParallelConfig,
        scheduler_config: SchedulerConfig,
        device_config: DeviceConfig,
        load_config: LoadConfig,
        prefix_state_cache_entries: int = 0,
        log_stats: bool = False,
        **kwargs: Any,
    ) -> None:
        logger.info("Initializing the Aphrodite engine with config: model=%r, dtype=%s, kv_cache_dtype=%s, ring_len=%d",
                    model_config.model, model_config.dtype, cache_config.cache_dtype, cache_config.replay_ring_len)
        self.model_config = model_config
        self.cache_config = cache_config
        self.parallel_config = parallel_config
        self.scheduler_config = scheduler_config
        self.log_stats = log_stats
        self.driver_worker = Worker(model_config, parallel_config, scheduler_config, device_config, cache_config, load_config, **kwargs)
        self.driver_worker.init_device()
        self.driver_worker.load_model()
        self.driver_worker.initialize_cache(*self.driver_worker.determine_num_available_blocks())
        self.free_slots = list(range(cache_config.num_gpu_blocks))
        self.requests: Dict[str, _Request] = {}
        self.preempted: Dict[str, _Request] = {}
        self.snapshotter = InMemorySnapshotter(scheduler_config, model_config)
        self.prefix_cache = (
            PrefixStateCache(prefix_state_cache_entries, cache_config, model_config, parallel_config) if prefix_state_cache_entries else None
        )

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "AphroditeEngine":
        config: EngineConfig = engine_args.create_engine_config()
        entries = engine_args.prefix_state_cache_entries if engine_args.enable_prefix_state_caching else 0
        return cls(**config.to_dict(), prefix_state_cache_entries=entries)

    @property
    def cache_engine(self) -> CacheEngine:
        return self.driver_worker.cache_engine

    def add_request(self, request_id: str, prompt_token_ids: List[int], sampling_params: Optional[SamplingParams] = None) -> None:
        if not self.free_slots:
            raise RuntimeError("no free KDA cache slot; preempt a request first")
        slot = self.free_slots.pop(0)
        request = _Request(request_id, list(prompt_token_ids), sampling_params or SamplingParams(), slot, time.monotonic())
        self.cache_engine.write_pos[slot] = 0
        for layer in self.cache_engine.gpu_cache:
            layer.ssm_state[slot].zero_()
        if self.prefix_cache is not None and self.prefix_cache.restore(tuple(prompt_token_ids[:-1]), self.cache_engine, slot):
            request.consumed = len(prompt_token_ids) - 1
        self.requests[request_id] = request

    def preempt(self, request_id: str) -> None:
        request = self.requests.pop(request_id)
        self.snapshotter.save(self.cache_engine, request.slot, request_id)
        self.free_slots.append(request.slot)
        self.preempted[request_id] = request

    def resume(self, request_id: str) -> None:
        request = self.preempted.pop(request_id)
        request.slot = self.free_slots.pop(0)
        self.snapshotter.restore(self.cache_engine, request.slot, request_id)
        self.requests[request_id] = request

    def step(self) -> List[RequestOutput]:
        running = list(self.requests.values())
        if not running:
            return []
        metas = [
            SequenceGroupMetadata(r.request_id, False, {r.slot: [r.next_input]}, r.sampling_params, {r.slot: [r.slot]})
            for r in running
        ]
        output = self.driver_worker.execute_model(ExecuteModelRequest(metas))
        results = []
        for request, token in zip(running, output.next_token_ids.tolist()):
            request.consumed += 1
            if request.consumed == len(request.prompt_token_ids) - 1 and self.prefix_cache is not None:
                self.prefix_cache.insert(tuple(request.prompt_token_ids[:-1]), self.cache_engine, request.slot)
            if request.consumed >= len(request.prompt_token_ids):
                request.output_token_ids.append(token)
            results.append(RequestOutput(request.request_id, request.prompt_token_ids, list(request.output_token_ids), request.finished))
            if request.finished:
                self.requests.pop(request.request_id)
                self.free_slots.append(request.slot)
        return results

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.free_slots.append(request.slot)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)


def _tiny_args(*extra: str) -> EngineArgs:
    return EngineArgs.parse(["--model", "kimi-linear-tiny", "--dtype", "bfloat16", "--load-format", "dummy", "--max-num-seqs", "3", *extra])


def build_engine_from_cli_args() -> Dict[str, Any]:
    engine = AphroditeEngine.from_engine_args(_tiny_args("--swap-space", "0"))
    engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=3))
    engine.add_request("b", [4, 5], SamplingParams(temperature=0.0, max_tokens=2))
    engine.step()
    engine.preempt("b")
    engine.step()
    engine.resume("b")
    while engine.has_unfinished_requests():
        engine.step()
    return {"gpu_cache": engine.cache_engine.gpu_cache, "write_pos": engine.cache_engine.write_pos}


def build_prefix_state_cache() -> Dict[str, Any]:
    engine = AphroditeEngine.from_engine_args(_tiny_args("--enable-prefix-state-caching", "--prefix-state-cache-entries", "2"))
    system = [7, 8, 9]
    engine.add_request("a", system + [1], SamplingParams(temperature=0.0, max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request("b", system + [1], SamplingParams(temperature=0.0, max_tokens=1))
    engine.step()
    return {"prefix_cache": engine.prefix_cache, "gpu_cache": engine.cache_engine.gpu_cache}
