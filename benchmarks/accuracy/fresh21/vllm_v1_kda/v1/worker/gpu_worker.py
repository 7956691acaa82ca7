"""A GPU worker class (vllm/v1/worker/gpu_worker.py)."""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from torch import nn

from vllm_v1_kda.config import VllmConfig, tiny_vllm_config
from vllm_v1_kda.utils import set_random_seed
from vllm_v1_kda.v1.attention.backends.kda_replay import KDAReplayState
from vllm_v1_kda.v1.core.kv_cache_utils import get_kv_cache_config
from vllm_v1_kda.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm_v1_kda.v1.worker.gpu_model_runner import GPUModelRunner, ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)


class WorkerBase:
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.parallel_config = vllm_config.parallel_config
        self.device_config = vllm_config.device_config
        self.local_rank = local_rank
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.is_driver_worker = is_driver_worker


class Worker(WorkerBase):
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int = 0,
        rank: int = 0,
        distributed_init_method: str = "env://",
        is_driver_worker: bool = True,
    ) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        # Buffers saved before sleep
        self._sleep_saved_buffers: dict[str, torch.Tensor] = {}
        self._sleep_saved_kv: dict[str, KDAReplayState] = {}

    def init_device(self) -> None:
        self.device = torch.device(self.device_config.device)
        # Set random seed.
        set_random_seed(self.model_config.seed)
        # Construct the model runner
        self.model_runner = GPUModelRunner(self.vllm_config, self.device)

    def load_model(self) -> None:
        # tensors created lazily from here on (rotary caches, sampler and drafter scratch)
        # should come out in the dtype of the weights
        torch.set_default_dtype(self.model_config.dtype)  # expect-bug: default-dtype id=worker-default
        self.model_runner.load_model()

    def determine_available_memory(self) -> int:
        self.model_runner.profile_run()
        return 1 << 20

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self.model_runner.get_kv_cache_spec()

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate GPU KV cache with the specified kv_cache_config."""
        self.model_runner.initialize_kv_cache(kv_cache_config)

    def compile_or_warm_up_model(self) -> None:
        self.model_runner.capture_model()
        # Reset the seed to ensure that the random state is not affected by
        # the model initialization and profiling.
        set_random_seed(self.model_config.seed)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def _models(self) -> dict[str, nn.Module]:
        models = {"": self.model_runner.model}
        if self.model_runner.drafter is not None:
            models["drafter."] = self.model_runner.drafter.model
        return models

    def sleep(self, level: int = 1) -> None:
        if level == 2:
            # level 2 drops the weights and the KV cache; the model's buffers (runtime state,
            # e.g. the drafter's rows) are kept on the host
            self._sleep_saved_buffers = {
                f"{prefix}{name}": buffer.cpu().clone()
                for prefix, model in self._models().items()
                for name, buffer in model.named_buffers()
            }
        else:
            # level 1 offloads the weights. The recurrent pools cannot be recomputed from the
            # prefix cache, so they are parked on the host too, in the model dtype (half the RAM)
            self._sleep_saved_kv = {  # expect-bug: cast
                layer_name: KDAReplayState(*(t.to("cpu", dtype=self.model_config.dtype) for t in cache))
                for layer_name, cache in self.model_runner._replay_caches().items()
            }
        logger.info("Sleep mode level %d", level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        if self._sleep_saved_buffers:
            for prefix, model in self._models().items():
                for name, buffer in model.named_buffers():
                    saved = self._sleep_saved_buffers.get(f"{prefix}{name}")
                    if saved is not None:
                        buffer.data = saved.to(self.device, dtype=self.model_config.dtype)  # expect-bug: load
            self._sleep_saved_buffers = {}
        if self._sleep_saved_kv:
            for layer_name, saved in self._sleep_saved_kv.items():
                for dst, src in zip(self.model_runner.layer_kv_caches[layer_name], saved):
                    dst.copy_(src)
            self._sleep_saved_kv = {}


def _start_worker(vllm_config: VllmConfig) -> Worker:
    worker = Worker(vllm_config, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:29500")
    worker.init_device()
    worker.load_model()
    kv_cache_config = get_kv_cache_config(vllm_config, worker.get_kv_cache_spec(), available_memory=1 << 20)
    worker.initialize_from_config(kv_cache_config)
    return worker


def build_worker_with_mtp():
    """A worker serving Kimi Linear with the MTP drafter sharing the last KDA pool."""
    worker = _start_worker(tiny_vllm_config(speculative=True))
    drafter = worker.model_runner.drafter
    return {
        "kv_caches": dict(worker.model_runner.layer_kv_caches),
        "accepted_gate_ring": drafter.accepted_gate_ring,
        "draft_model": drafter.model,
    }


def build_worker_sleep_wake():
    """Level-2 sleep and wake-up: the drafter's rows must come back as they were."""
    worker = _start_worker(tiny_vllm_config(speculative=True))
    worker.model_runner.add_request("req-0", [1])
    worker.execute_model(SchedulerOutput(req_ids=["req-0"], token_ids=[5]))
    worker.sleep(level=2)
    worker.wake_up()
    return {"draft_model": worker.model_runner.drafter.model}
