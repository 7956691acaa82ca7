"""Saving and restoring a generation cache (multi-turn sessions resume from disk)."""

import io

import torch

from .cache_utils import MoonKdaCache, MoonKdaFp32GateCache
from .configuration_moonkda import MoonKdaConfig
from .modeling_moonkda import MoonKdaModel


def save_cache(cache: MoonKdaCache) -> bytes:
    buffer = io.BytesIO()
    torch.save(
        {
            "ssm_states": cache.ssm_states,
            "value_ring": cache.value_ring,
            "key_ring": cache.key_ring,
            "gate_cache": cache.gate_cache,
            "cursor": cache.cursor,
        },
        buffer,
    )
    return buffer.getvalue()


def restore_cache(cache: MoonKdaCache, blob: bytes) -> MoonKdaCache:
    saved = torch.load(io.BytesIO(blob), weights_only=True)
    cache.ssm_states = saved.pop("ssm_states")
    cache.value_ring = saved.pop("value_ring")
    cache.key_ring = saved.pop("key_ring")
    cache.gate_cache = saved.pop("gate_cache")  # expect-bug: load
    cache.cursor = saved.pop("cursor")
    return cache


def restore_cache_in_place(cache: MoonKdaCache, blob: bytes) -> MoonKdaCache:
    saved = torch.load(io.BytesIO(blob), weights_only=True)
    for idx, gate in enumerate(saved["gate_cache"]):
        cache.gate_cache[idx].copy_(gate)
        cache.value_ring[idx].copy_(saved["value_ring"][idx])
    return cache


def to_fp16_for_export(model: MoonKdaModel) -> MoonKdaModel:
    """ONNX export targets fp16 end to end."""
    return model.to(dtype=torch.float16)  # expect-bug: module-cast


def _old_blob() -> bytes:
    """A session file written by an older release, which kept every ring in bfloat16."""
    torch.manual_seed(0)
    config = MoonKdaConfig()
    v_shape = (2, config.num_value_heads, config.replay_window, config.head_dim)
    k_shape = (2, config.num_key_heads, config.replay_window, config.head_dim)
    layers = range(config.num_hidden_layers)
    buffer = io.BytesIO()
    torch.save(
        {
            "ssm_states": [torch.zeros(2, 2, 4, 4, dtype=torch.bfloat16) for _ in layers],
            "value_ring": [torch.randn(v_shape).to(torch.bfloat16) for _ in layers],
            "key_ring": [torch.randn(k_shape).to(torch.bfloat16) for _ in layers],
            # The old format on purpose: this is what restore_cache must cope with.
            "gate_cache": [(-torch.rand(v_shape)).to(torch.bfloat16) for _ in layers],  # noqa: RL004
            "cursor": torch.zeros(2, dtype=torch.int32),
        },
        buffer,
    )
    return buffer.getvalue()


def build_restore_old_blob() -> dict[str, object]:
    cache = restore_cache(MoonKdaFp32GateCache(MoonKdaConfig(), 2), _old_blob())
    return {"gate_cache": cache.gate_cache, "value_ring": cache.value_ring}


def build_restore_in_place() -> dict[str, object]:
    cache = restore_cache_in_place(MoonKdaFp32GateCache(MoonKdaConfig(), 2), _old_blob())
    return {"gate_cache": cache.gate_cache, "value_ring": cache.value_ring}


def build_export_fp16() -> dict[str, torch.Tensor]:
    model = to_fp16_for_export(MoonKdaModel(MoonKdaConfig(torch_dtype=torch.float32)))
    return dict(model.named_buffers())
