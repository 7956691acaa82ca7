"""A worker class that executes (a partition of) the model on one device."""
from typing import Any, Dict, List, Optional, Tuple, Type

import torch

from ..common.config import CacheConfig, DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, SchedulerConfig
from ..common.logger import init_logger
from ..common.sequence import ExecuteModelRequest, SamplerOutput, SequenceGroupMetadata
from ..common.utils import STR_DTYPE_TO_TORCH_DTYPE
from ..modeling.sampler import SamplingParams
from .cache_engine import CacheEngine, KDALayerCache
from .model_runner import ModelRunner

logger = init_logger(__name__)


class Worker:
    def __init__(
        self,
        model_config: ModelConfig,
        parallel_config: ParallelConfig,
        scheduler_config: SchedulerConfig,
        device_config: DeviceConfig,
        cache_config: CacheConfig,
        load_config: LoadConfig,
        local_rank: int = 0,
        rank: int = 0,
        distributed_init_method: Optional[str] = None,
        is_driver_worker: bool = True,
        model_runner_cls: Type[ModelRunner] = ModelRunner,
        **kwargs: Any,
    ) -> None:
        self.model_config = model_config
        self.parallel_config = parallel_config
        self.scheduler_config = scheduler_config
        self.device_config = device_config
        self.cache_config = cache_config
        self.load_config = load_config
        self.local_rank, self.rank = local_rank, rank
        self.distributed_init_method = distributed_init_method or "tcp://127.0.0.1:0"
        self.is_driver_worker = is_driver_worker
        self.model_runner = model_runner_cls(
            model_config, parallel_config, scheduler_config, device_config, cache_config, load_config,
            is_driver_worker=is_driver_worker, **kwargs,
        )
        self.cache_engine: Optional[CacheEngine] = None

    def init_device(self) -> None:
        if self.device_config.device == "cuda":
            torch.cuda.set_device(self.local_rank)
        torch.manual_seed(self.model_config.seed)

    def load_model(self) -> None:
        self.model_runner.load_model()

    @torch.inference_mode()
    def determine_num_available_blocks(self) -> Tuple[int, int]:
        self.model_runner.profile_run()
        block_size = CacheEngine.get_cache_block_size(self.cache_config, self.model_config, self.parallel_config)
        num_gpu_blocks = self.cache_config.num_gpu_blocks_override or self.scheduler_config.max_num_seqs
        num_cpu_blocks = self.cache_config.swap_space_bytes // block_size
        logger.info("KDA cache block: %d bytes", block_size)
        return num_gpu_blocks, num_cpu_blocks

    def initialize_cache(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        self.cache_config.num_gpu_blocks = num_gpu_blocks
        self.cache_config.num_cpu_blocks = num_cpu_blocks
        self.cache_engine = CacheEngine(self.cache_config, self.model_config, self.parallel_config, self.device_config)
        if self.cache_config.cache_dtype_override:
            self._apply_cache_dtype_override(self.cache_config.cache_dtype_override)

    def _apply_cache_dtype_override(self, override: str) -> None:
        """``--cache-dtype-override``: store the rings of the allocated cache in another dtype
        (A/B runs against kernels built for a single ring dtype); the checkpoint state is kept."""
        dtype = STR_DTYPE_TO_TORCH_DTYPE[override]
        logger.info("Overriding the KDA ring dtype with %s", dtype)
        self.cache_engine.gpu_cache = [
            KDALayerCache(**{name: t if name == "ssm_state" else t.to(dtype) for name, t in layer.tensors().items()})  # expect-bug: cast
            for layer in self.cache_engine.gpu_cache
        ]

    @property
    def gpu_cache(self) -> List[KDALayerCache]:
        return self.cache_engine.gpu_cache

    @torch.inference_mode()
    def execute_model(self, execute_model_req: ExecuteModelRequest) -> Optional[SamplerOutput]:
        if execute_model_req.blocks_to_swap_in:
            self.cache_engine.swap_in(execute_model_req.blocks_to_swap_in)
        if execute_model_req.blocks_to_swap_out:
            self.cache_engine.swap_out(execute_model_req.blocks_to_swap_out)
        if execute_model_req.blocks_to_copy:
            self.cache_engine.copy(execute_model_req.blocks_to_copy)
        if not execute_model_req.seq_group_metadata_list:
            return None
        write_pos = self.cache_engine.write_pos
        model_input = self.model_runner.prepare_model_input(execute_model_req.seq_group_metadata_list, self.gpu_cache, write_pos)
        return self.model_runner.execute_model(model_input, write_pos)


def _worker(**cache_kwargs: Any) -> Worker:
    worker = Worker(
        ModelConfig("kimi-linear-tiny", dtype="bfloat16"), ParallelConfig(), SchedulerConfig(max_num_seqs=3),
        DeviceConfig("cpu"), CacheConfig(**cache_kwargs), LoadConfig(load_format="dummy"),
    )
    worker.init_device()
    worker.load_model()
    worker.initialize_cache(*worker.determine_num_available_blocks())
    return worker


def _seq(request_id: str, slot: int, tokens: List[int]) -> SequenceGroupMetadata:
    return SequenceGroupMetadata(request_id, False, {slot: tokens}, SamplingParams(temperature=0.0), {slot: [slot]})


def build_worker_fork_step() -> Dict[str, Any]:
    worker = _worker()
    worker.execute_model(ExecuteModelRequest([_seq("a", 0, [5]), _seq("b", 2, [7])]))
    out = worker.execute_model(ExecuteModelRequest([_seq("a", 0, [5, 1])], blocks_to_copy={0: [1]}))
    return {"gpu_cache": worker.gpu_cache, "next": out.next_token_ids, "write_pos": worker.cache_engine.write_pos}


def build_worker_cache_override() -> Dict[str, Any]:
    worker = _worker(cache_dtype_override="float16")
    worker.execute_model(ExecuteModelRequest([_seq("a", 1, [4])]))
    return {"gpu_cache": worker.gpu_cache}
