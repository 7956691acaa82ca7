"""Engine configuration (vllm/config/*.py), reduced to what the Kimi Linear path reads."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar, Union

import torch

from vllm_v1_kda.utils import STR_DTYPE_TO_TORCH_DTYPE

T = TypeVar("T")


@dataclass
class KimiLinearConfig:
    """The fields of the HF ``KimiLinearConfig`` the model code reads."""

    model_type: str = "kimi_linear"
    architectures: list[str] = field(default_factory=lambda: ["KimiLinearForCausalLM"])
    vocab_size: int = 32
    hidden_size: int = 16
    intermediate_size: int = 32
    num_hidden_layers: int = 3
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int = 4
    rms_norm_eps: float = 1e-5
    torch_dtype: str = "bfloat16"
    num_nextn_predict_layers: int = 1
    linear_attn_config: dict[str, Any] = field(
        default_factory=lambda: {
            # 1-based, as in the released config.json
            "kda_layers": [1, 3],
            "full_attn_layers": [2],
            "num_heads": 2,
            "head_dim": 4,
            "short_conv_kernel_size": 4,
        }
    )

    def is_kda_layer(self, layer_idx: int) -> bool:
        return (layer_idx + 1) in self.linear_attn_config["kda_layers"]


def _get_and_verify_dtype(config: KimiLinearConfig, dtype: Union[str, torch.dtype]) -> torch.dtype:
    config_dtype = STR_DTYPE_TO_TORCH_DTYPE[config.torch_dtype]
    if isinstance(dtype, str):
        dtype = dtype.lower()
        if dtype == "auto":
            # fp32 checkpoints are served in bf16 unless asked otherwise
            torch_dtype = torch.bfloat16 if config_dtype == torch.float32 else config_dtype
        else:
            if dtype not in STR_DTYPE_TO_TORCH_DTYPE:
                raise ValueError(f"Unknown dtype: {dtype!r}")
            torch_dtype = STR_DTYPE_TO_TORCH_DTYPE[dtype]
    elif isinstance(dtype, torch.dtype):
        torch_dtype = dtype
    else:
        raise ValueError(f"Unknown dtype: {dtype}")
    return torch_dtype


@dataclass
class ModelConfig:
    model: str = "moonshotai/Kimi-Linear-48B-A3B-Instruct"
    dtype: Union[str, torch.dtype] = "auto"
    hf_config: KimiLinearConfig = field(default_factory=KimiLinearConfig)
    seed: int = 0
    max_model_len: int = 8
    enforce_eager: bool = False
    architecture: Optional[str] = None

    def __post_init__(self) -> None:
        if self.architecture is None:
            self.architecture = self.hf_config.architectures[0]
        self.dtype = _get_and_verify_dtype(self.hf_config, self.dtype)

    def get_hidden_size(self) -> int:
        return self.hf_config.hidden_size

    def get_head_size(self) -> int:
        return self.hf_config.head_dim

    def get_num_kv_heads(self, parallel_config: "ParallelConfig") -> int:
        return max(1, self.hf_config.num_key_value_heads // parallel_config.tensor_parallel_size)

    def get_num_layers(self, parallel_config: "ParallelConfig") -> int:
        return self.hf_config.num_hidden_layers


@dataclass
class CacheConfig:
    block_size: int = 8
    gpu_memory_utilization: float = 0.9
    cache_dtype: str = "auto"
    """Dtype of the KV caches ("auto" = model dtype); applies to attention layers."""
    mamba_cache_dtype: str = "auto"
    """Dtype of the recurrent layers' per-step caches (for KDA: the delta and key rings)."""
    mamba_ssm_cache_dtype: str = "auto"
    """Dtype of the recurrent checkpoint state."""
    kda_ring_len: int = 4
    """Ring length L of ReplaySSM decode: the state is written back every L steps."""
    num_gpu_blocks_override: Optional[int] = None
    enable_prefix_caching: bool = False
    enable_sleep_mode: bool = False
    cpu_offload_gb: float = 0.0


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    world_size: int = 1


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 3
    max_num_batched_tokens: int = 8
    max_model_len: int = 8


@dataclass
class DeviceConfig:
    device: Union[str, torch.device] = "cpu"

    def __post_init__(self) -> None:
        self.device_type = str(self.device)
        self.device = torch.device(self.device)


@dataclass
class LoadConfig:
    load_format: str = "dummy"
    download_dir: Optional[str] = None


@dataclass
class SpeculativeConfig:
    method: str = "mtp"
    num_speculative_tokens: int = 1
    draft_model_config: Optional[ModelConfig] = None
    draft_kv_cache: str = "shared"
    """"shared": the MTP block reuses the replay pool of the target's last KDA layer;
    "separate": the drafter keeps a pool of its own."""

    def __post_init__(self) -> None:
        if self.draft_kv_cache not in ("shared", "separate"):
            raise ValueError(f"draft_kv_cache must be 'shared' or 'separate', not {self.draft_kv_cache!r}")


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    kv_role: str = "kv_both"
    kv_buffer_device: str = "cpu"
    kv_buffer_dtype: str = "auto"
    """Dtype of host copies of the caches ("auto" = the dtype each cache has on the device)."""
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)


@dataclass
class CompilationConfig:
    level: int = 0
    cudagraph_capture_sizes: list[int] = field(default_factory=lambda: [1, 2])
    cudagraph_num_of_warmups: int = 1
    static_forward_context: dict[str, Any] = field(default_factory=dict, repr=False)
    """Per-layer state every attention-like layer registers itself in (name -> module)."""


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    load_config: LoadConfig = field(default_factory=LoadConfig)
    speculative_config: Optional[SpeculativeConfig] = None
    kv_transfer_config: Optional[KVTransferConfig] = None
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)

    def __post_init__(self) -> None:
        spec = self.speculative_config
        if spec is not None and spec.draft_model_config is None:
            spec.draft_model_config = dataclasses.replace(
                self.model_config, architecture="KimiMTPModel", dtype=self.model_config.dtype
            )
        self.scheduler_config.max_model_len = self.model_config.max_model_len


_current_vllm_config: Optional[VllmConfig] = None


@contextlib.contextmanager
def set_current_vllm_config(vllm_config: VllmConfig) -> Iterator[None]:
    """Makes ``vllm_config`` visible to layers while the model is built."""
    global _current_vllm_config
    old_vllm_config = _current_vllm_config
    try:
        _current_vllm_config = vllm_config
        yield
    finally:
        _current_vllm_config = old_vllm_config


def get_current_vllm_config() -> VllmConfig:
    if _current_vllm_config is None:
        # e.g. a layer built in a unit test
        return VllmConfig()
    return _current_vllm_config


def get_layers_from_vllm_config(
    vllm_config: VllmConfig, layer_type: type[T], layer_names: Optional[list[str]] = None
) -> dict[str, T]:
    forward_context = vllm_config.compilation_config.static_forward_context
    if layer_names is None:
        layer_names = list(forward_context.keys())
    return {
        layer_name: forward_context[layer_name]
        for layer_name in layer_names
        if isinstance(forward_context[layer_name], layer_type)
    }


def tiny_vllm_config(
    *,
    dtype: Union[str, torch.dtype] = "auto",
    cache_dtype: str = "auto",
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
    num_gpu_blocks: int = 3,
    speculative: bool = False,
    draft_dtype: Optional[Union[str, torch.dtype]] = None,
    draft_kv_cache: str = "shared",
    kv_transfer_config: Optional[KVTransferConfig] = None,
    load_format: str = "dummy",
    model: Optional[str] = None,
) -> VllmConfig:
    """A small Kimi Linear engine config (2 KDA layers, 1 full-attention layer), for
    examples and benchmarks that run without a checkpoint."""
    model_config = ModelConfig(dtype=dtype, **({"model": model} if model else {}))
    speculative_config = None
    if speculative:
        draft = None
        if draft_dtype is not None:
            draft = ModelConfig(dtype=draft_dtype, architecture="KimiMTPModel")
        speculative_config = SpeculativeConfig(
            draft_model_config=draft, draft_kv_cache=draft_kv_cache
        )
    return VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(
            cache_dtype=cache_dtype,
            mamba_cache_dtype=mamba_cache_dtype,
            mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
            num_gpu_blocks_override=num_gpu_blocks,
        ),
        load_config=LoadConfig(load_format=load_format),
        speculative_config=speculative_config,
        kv_transfer_config=kv_transfer_config,
    )
