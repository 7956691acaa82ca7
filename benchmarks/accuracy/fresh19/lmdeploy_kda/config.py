# Copyright (c) OpenMMLab. All rights reserved.
from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple, Union

import torch

_TORCH_DTYPE_MAP = {
    'float16': torch.float16,
    'half': torch.float16,
    'bfloat16': torch.bfloat16,
    'float32': torch.float32,
    'float': torch.float32,
}

# per-step log-decays are accumulated into prefix sums and exponentiated; they are always float32
GATE_CACHE_DTYPE = torch.float32


def _get_dtype(dtype: Union[str, torch.dtype, None], default: torch.dtype = torch.float16) -> torch.dtype:
    """Map a config dtype (``'auto'``, a name or a torch dtype) to a torch dtype."""
    if dtype is None or dtype == 'auto':
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _TORCH_DTYPE_MAP:
        raise ValueError(f'Unsupported dtype: {dtype}, expected one of {sorted(_TORCH_DTYPE_MAP)}.')
    return _TORCH_DTYPE_MAP[dtype]


class ReplayCacheShapes(NamedTuple):
    """Shapes of one layer's replay caches."""
    state: Tuple[int, ...]
    delta: Tuple[int, ...]
    key: Tuple[int, ...]
    gate: Tuple[int, ...]


class ReplayCacheDtypes(NamedTuple):
    """Dtypes of one layer's replay caches."""
    state: torch.dtype
    delta: torch.dtype
    key: torch.dtype
    gate: torch.dtype


def get_kda_state_dtypes(model_dtype: torch.dtype,
                         cache_dtype: str = 'auto',
                         ssm_cache_dtype: str = 'auto') -> ReplayCacheDtypes:
    """Dtypes of the replay caches of a KDA layer.

    Args:
        model_dtype (torch.dtype): the dtype the model runs in.
        cache_dtype (str): dtype of the delta and key rings, ``'auto'`` for the model dtype.
        ssm_cache_dtype (str): dtype of the checkpoint state, ``'auto'`` for the ring dtype.
    """
    ring_dtype = _get_dtype(cache_dtype, model_dtype)
    if ssm_cache_dtype == 'auto':
        return ReplayCacheDtypes(state=ring_dtype, delta=ring_dtype, key=ring_dtype, gate=GATE_CACHE_DTYPE)
    state_dtype = _get_dtype(ssm_cache_dtype, ring_dtype)
    # an explicit ssm cache dtype applies to everything carried across flushes
    return ReplayCacheDtypes(state=state_dtype, delta=ring_dtype, key=ring_dtype, gate=state_dtype)  # expect-bug: imported-policy id=ssm-dtype


@dataclass
class BackendConfig:
    """Backend config.

    Args:
        eager_mode (bool): run without the graph runner.
        device_type (str): ``'cuda'``, ``'cpu'``...
        max_capture_batch_size (int): rows of the static buffers of the graph runner, 0 for
            ``CacheConfig.max_batches``.
        static_cache_copy (bool): the graph runner keeps its own copy of the replay caches, so that
            the engine may re-allocate its caches without a new capture.
        offload_caches (bool): the replay caches live in host memory; the graph runner works on
            device copies.
        enable_warmup (bool): run every layer once on scratch caches before serving.
    """
    eager_mode: bool = True
    device_type: str = 'cuda'
    max_capture_batch_size: int = 0
    static_cache_copy: bool = False
    offload_caches: bool = False
    enable_warmup: bool = False


@dataclass
class CacheConfig:
    """Config of the replay caches.

    Args:
        max_batches (int): max number of sequences decoded together.
        num_gpu_slots (int): device slots, 0 for ``max_batches``.
        num_cpu_slots (int): host slots used by swap in/out.
        ring_len (int): rows of the delta/key/gate rings; the state is flushed every ``ring_len`` steps.
        cache_dtype (str): dtype of the delta and key rings.
        ssm_cache_dtype (str): dtype of the checkpoint states.
        cache_in_model (bool): keep the caches as buffers of the model instead of a cache engine.
        enable_prefix_caching (bool): keep snapshots of finished prefixes.
        num_prefix_snapshots (int): number of prefix snapshots.
        migration_dtype (str): dtype of the slot payloads sent to another instance.
    """
    max_batches: int
    num_gpu_slots: int = 0
    num_cpu_slots: int = 0
    ring_len: int = 16
    cache_dtype: str = 'auto'
    ssm_cache_dtype: str = 'auto'
    cache_in_model: bool = False
    enable_prefix_caching: bool = False
    num_prefix_snapshots: int = 0
    migration_dtype: str = 'auto'

    def __post_init__(self):
        if self.num_gpu_slots == 0:
            self.num_gpu_slots = self.max_batches
        if self.ring_len < 2:
            raise ValueError(f'ring_len should be >= 2, got {self.ring_len}.')
        if self.enable_prefix_caching and self.num_prefix_snapshots == 0:
            self.num_prefix_snapshots = self.num_gpu_slots


@dataclass
class SpecDecodeConfig:
    """Speculative decoding config.

    Args:
        method (str): ``'mtp'`` (a small KDA draft model).
        num_speculative_tokens (int): draft tokens per step.
        num_draft_layers (int): layers of the draft model.
        draft_dtype (str): dtype of the draft model, ``'auto'`` for the model dtype.
        scratch_dtype (str): dtype of the rollback rows kept while a draft is verified. They live
            for one step only, so a compact dtype is the default.
    """
    method: str = 'mtp'
    num_speculative_tokens: int = 1
    num_draft_layers: int = 1
    draft_dtype: str = 'auto'
    scratch_dtype: str = 'bfloat16'


@dataclass
class ModelConfig:
    """Config of a Kimi Linear model (KDA layers only), per tensor parallel rank."""
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_value_heads: int
    head_dim: int
    v_head_dim: int
    vocab_size: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    lower_bound: Optional[float] = None
    use_qk_l2norm: bool = True
    dtype: torch.dtype = torch.float16
    model_arch: str = 'KimiLinearForCausalLM'

    def __post_init__(self):
        if self.num_value_heads % self.num_attention_heads != 0:
            raise ValueError(f'num_value_heads ({self.num_value_heads}) should be a multiple of '
                             f'num_attention_heads ({self.num_attention_heads}).')

    def get_replay_cache_shapes(self, num_slots: int, ring_len: int) -> ReplayCacheShapes:
        """Shapes of one layer's replay caches for ``num_slots`` slots."""
        return ReplayCacheShapes(
            state=(num_slots, self.num_value_heads, self.v_head_dim, self.head_dim),
            delta=(num_slots, self.num_value_heads, ring_len, self.v_head_dim),
            key=(num_slots, self.num_attention_heads, ring_len, self.head_dim),
            gate=(num_slots, self.num_value_heads, ring_len, self.head_dim),
        )

    def draft_config(self, num_layers: int = 1, dtype: str = 'auto') -> 'ModelConfig':
        """Config of the MTP draft model: the same layers, fewer of them."""
        return ModelConfig(**{
            **self.__dict__,
            'num_layers': num_layers,
            'dtype': _get_dtype(dtype, self.dtype),
            'model_arch': 'KimiLinearMTPModel',
        })
