"""Engine configuration objects (model, cache, parallel, scheduler, device, load)."""
import copy
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional, Tuple, Union

import torch

from .logger import init_logger
from .utils import KDA_RING_NAMES, STR_DTYPE_TO_TORCH_DTYPE, get_kv_cache_torch_dtype

logger = init_logger(__name__)

_GB = 1 << 30

DEFAULT_KIMI_LINEAR_CONFIG: Dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"],
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "vocab_size": 32,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "linear_attn_config": {
        "num_heads": 2,
        "num_v_heads": 4,
        "head_dim": 4,
        "v_head_dim": 4,
        "gate_lower_bound": None,
    },
}


@dataclass(frozen=True)
class KDAShapes:
    """Per-sequence shapes of the ReplaySSM cache of one KDA layer."""

    num_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    ring_len: int

    @property
    def ssm_state(self) -> Tuple[int, ...]:
        return (self.num_v_heads, self.head_v_dim, self.head_k_dim)

    @property
    def delta_cache(self) -> Tuple[int, ...]:
        return (self.num_v_heads, self.ring_len, self.head_v_dim)

    @property
    def key_cache(self) -> Tuple[int, ...]:
        return (self.num_heads, self.ring_len, self.head_k_dim)

    @property
    def alpha_log_cache(self) -> Tuple[int, ...]:
        return (self.num_v_heads, self.ring_len, self.head_k_dim)

    def ring_shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {name: getattr(self, name) for name in KDA_RING_NAMES}


def _get_and_verify_dtype(hf_config: Dict[str, Any], dtype: Union[str, torch.dtype]) -> torch.dtype:
    config_dtype = STR_DTYPE_TO_TORCH_DTYPE[hf_config.get("torch_dtype", "float32")]
    if isinstance(dtype, torch.dtype):
        return dtype
    dtype = dtype.lower()
    if dtype == "auto":
        # Following the common practice, float32 checkpoints are served in float16.
        return torch.float16 if config_dtype == torch.float32 else config_dtype
    if dtype not in STR_DTYPE_TO_TORCH_DTYPE:
        raise ValueError(f"Unknown dtype: {dtype}")
    torch_dtype = STR_DTYPE_TO_TORCH_DTYPE[dtype]
    if torch_dtype != config_dtype:
        logger.info("Casting %s to %s.", config_dtype, torch_dtype)
    return torch_dtype


class ModelConfig:
    """Configuration of the model: checkpoint, dtype, architecture config."""

    def __init__(
        self,
        model: str,
        tokenizer: Optional[str] = None,
        dtype: Union[str, torch.dtype] = "auto",
        seed: int = 0,
        quantization: Optional[str] = None,
        max_model_len: Optional[int] = None,
        enforce_eager: bool = True,
        hf_config: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer or model
        self.seed = seed
        self.quantization = quantization
        self.enforce_eager = enforce_eager
        self.hf_config = copy.deepcopy(hf_config or DEFAULT_KIMI_LINEAR_CONFIG)
        self.hf_config.update(kwargs.pop("hf_overrides", {}))
        self.dtype = _get_and_verify_dtype(self.hf_config, dtype)
        self.max_model_len = max_model_len or 4096
        if kwargs:
            logger.debug("Ignoring model options %s", sorted(kwargs))

    @property
    def linear_attn_config(self) -> Dict[str, Any]:
        return self.hf_config["linear_attn_config"]

    def get_num_layers(self, parallel_config: "ParallelConfig") -> int:
        return self.hf_config["num_hidden_layers"] // parallel_config.pipeline_parallel_size

    def get_hidden_size(self) -> int:
        return self.hf_config["hidden_size"]

    def get_kda_shapes(self, cache_config: "CacheConfig") -> KDAShapes:
        la = self.linear_attn_config
        return KDAShapes(la["num_heads"], la["num_v_heads"], la["head_dim"], la["v_head_dim"], cache_config.replay_ring_len)


@dataclass
class CacheConfig:
    """KV/state cache settings. One block is one sequence slot (ReplaySSM state + rings)."""

    block_size: int = 1
    gpu_memory_utilization: float = 0.9
    swap_space: float = 0.0
    cache_dtype: str = "auto"
    num_gpu_blocks_override: Optional[int] = None
    replay_ring_len: int = 4
    in_model_cache: bool = False
    cache_dtype_override: Optional[str] = None
    num_gpu_blocks: Optional[int] = None
    num_cpu_blocks: Optional[int] = None

    def __post_init__(self) -> None:
        if self.cache_dtype not in ("auto", *STR_DTYPE_TO_TORCH_DTYPE):
            raise ValueError(f"Unknown kv cache dtype: {self.cache_dtype}")
        if self.replay_ring_len < 2:
            raise ValueError("replay_ring_len must be at least 2")

    @property
    def swap_space_bytes(self) -> int:
        return int(self.swap_space * _GB)

    def ring_dtypes(self, model_dtype: torch.dtype) -> Dict[str, torch.dtype]:
        """Storage dtype of each KDA cache tensor: delta/key rings follow ``cache_dtype``; the
        checkpoint state and the log-decay ring are float32 (the kernel prefix-sums the latter)."""
        ring = get_kv_cache_torch_dtype(self.cache_dtype, model_dtype)
        return {"ssm_state": torch.float32, "delta_cache": ring, "key_cache": ring, "alpha_log_cache": torch.float32}


@dataclass
class ParallelConfig:
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    worker_use_ray: bool = False
    disable_custom_all_reduce: bool = True

    @property
    def world_size(self) -> int:
        return self.pipeline_parallel_size * self.tensor_parallel_size


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    preemption_mode: str = "swap"
    snapshot_dir: Optional[str] = None
    snapshot_dtype: str = "auto"


@dataclass
class DeviceConfig:
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


@dataclass
class LoadConfig:
    load_format: str = "auto"
    download_dir: Optional[str] = None
    load_dtype: Optional[str] = None
    model_loader_extra_config: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig
    load_config: LoadConfig

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
