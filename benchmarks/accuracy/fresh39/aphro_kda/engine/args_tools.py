"""EngineArgs: command-line and programmatic engine options."""
import argparse
import dataclasses
from dataclasses import dataclass
from typing import List, Optional

from ..common.config import CacheConfig, DeviceConfig, EngineConfig, LoadConfig, ModelConfig, ParallelConfig, SchedulerConfig


@dataclass
class EngineArgs:
    """Arguments for the Aphrodite engine."""

    model: str = "kimi-linear-tiny"
    tokenizer: Optional[str] = None
    dtype: str = "auto"
    seed: int = 0
    quantization: Optional[str] = None
    max_model_len: Optional[int] = None
    enforce_eager: bool = True
    kv_cache_dtype: str = "auto"
    block_size: int = 1
    gpu_memory_utilization: float = 0.90
    swap_space: float = 0.0
    num_gpu_blocks_override: Optional[int] = None
    replay_ring_len: int = 4
    in_model_cache: bool = False
    cache_dtype_override: Optional[str] = None
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    preemption_mode: str = "swap"
    snapshot_dir: Optional[str] = None
    snapshot_dtype: str = "auto"
    enable_prefix_state_caching: bool = False
    prefix_state_cache_entries: int = 4
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    worker_use_ray: bool = False
    device: str = "auto"
    load_format: str = "auto"
    load_dtype: Optional[str] = None
    download_dir: Optional[str] = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        defaults = EngineArgs()
        parser.add_argument("--model", type=str, default=defaults.model, help="name or path of the model")
        parser.add_argument("--tokenizer", type=str, default=None)
        parser.add_argument("--dtype", type=str, default=defaults.dtype, choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
        parser.add_argument("--seed", type=int, default=defaults.seed)
        parser.add_argument("--quantization", "-q", type=str, default=None, choices=[None, "fp8", "int8_kv"])
        parser.add_argument("--max-model-len", type=int, default=None)
        parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=defaults.enforce_eager)
        parser.add_argument("--kv-cache-dtype", type=str, default=defaults.kv_cache_dtype, choices=["auto", "fp8", "fp8_e5m2", "bfloat16", "float16"])
        parser.add_argument("--block-size", type=int, default=defaults.block_size)
        parser.add_argument("--gpu-memory-utilization", type=float, default=defaults.gpu_memory_utilization)
        parser.add_argument("--swap-space", type=float, default=defaults.swap_space, help="CPU swap space per GPU (GiB)")
        parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
        parser.add_argument("--replay-ring-len", type=int, default=defaults.replay_ring_len)
        parser.add_argument("--in-model-cache", action="store_true")
        parser.add_argument("--cache-dtype-override", type=str, default=None)
        parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
        parser.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
        parser.add_argument("--preemption-mode", type=str, default=defaults.preemption_mode, choices=["swap", "snapshot", "recompute"])
        parser.add_argument("--snapshot-dir", type=str, default=None)
        parser.add_argument("--snapshot-dtype", type=str, default=defaults.snapshot_dtype)
        parser.add_argument("--enable-prefix-state-caching", action="store_true")
        parser.add_argument("--prefix-state-cache-entries", type=int, default=defaults.prefix_state_cache_entries)
        parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
        parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        parser.add_argument("--worker-use-ray", action="store_true")
        parser.add_argument("--device", type=str, default=defaults.device, choices=["auto", "cuda", "cpu"])
        parser.add_argument("--load-format", type=str, default=defaults.load_format, choices=["auto", "pt", "safetensors", "npcache", "dummy"])
        parser.add_argument("--load-dtype", type=str, default=None)
        parser.add_argument("--download-dir", type=str, default=None)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        attrs = [attr.name for attr in dataclasses.fields(cls)]
        return cls(**{attr: getattr(args, attr) for attr in attrs})

    @classmethod
    def parse(cls, argv: List[str]) -> "EngineArgs":
        return cls.from_cli_args(cls.add_cli_args(argparse.ArgumentParser()).parse_args(argv))

    def create_engine_config(self) -> EngineConfig:
        model_config = ModelConfig(
            self.model, self.tokenizer, self.dtype, self.seed, self.quantization, self.max_model_len, self.enforce_eager,
        )
        cache_config = CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            swap_space=self.swap_space,
            cache_dtype=self.kv_cache_dtype,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            replay_ring_len=self.replay_ring_len,
            in_model_cache=self.in_model_cache,
            cache_dtype_override=self.cache_dtype_override,
        )
        return EngineConfig(
            model_config=model_config,
            cache_config=cache_config,
            parallel_config=ParallelConfig(self.pipeline_parallel_size, self.tensor_parallel_size, self.worker_use_ray),
            scheduler_config=SchedulerConfig(
                self.max_num_seqs, self.max_num_batched_tokens, self.preemption_mode, self.snapshot_dir, self.snapshot_dtype
            ),
            device_config=DeviceConfig(self.device),
            load_config=LoadConfig(self.load_format, self.download_dir, self.load_dtype),
        )
