"""Checkpoint helpers: save/restore a generation cache between requests."""

import io

import torch

from .cache_utils import KimiReplayCache, StaticReplayCache
from .configuration_kimi_replay import KimiReplayConfig
from .modeling_kimi_replay import KimiReplayModel, KimiReplayModelFp32Gates


def cache_state_dict(cache: KimiReplayCache) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {"write_pos": cache.write_pos}
    for i in range(len(cache.g_cache)):
        state[f"layers.{i}.recurrent_state"] = cache.recurrent_states[i]
        state[f"layers.{i}.d_cache"] = cache.d_cache[i]
        state[f"layers.{i}.k_cache"] = cache.k_cache[i]
        state[f"layers.{i}.g_cache"] = cache.g_cache[i]
    return state


def load_cache_state_dict(cache: KimiReplayCache, path_or_buffer: io.BytesIO) -> KimiReplayCache:
    state = torch.load(path_or_buffer, map_location="cpu", weights_only=True)
    cache.write_pos = state["write_pos"]
    for i in range(len(cache.g_cache)):
        cache.recurrent_states[i] = state[f"layers.{i}.recurrent_state"]
        cache.d_cache[i] = state[f"layers.{i}.d_cache"]
        cache.k_cache[i] = state[f"layers.{i}.k_cache"]
        cache.g_cache[i] = state[f"layers.{i}.g_cache"]  # expect-bug: load
    return cache


def load_model_buffers(model: KimiReplayModelFp32Gates, buffer: io.BytesIO) -> KimiReplayModelFp32Gates:
    # load_state_dict copies into the existing buffers, so their dtypes are kept.
    state = torch.load(buffer, map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=False)
    return model


def _bf16_snapshot() -> io.BytesIO:
    """A cache snapshot as an older release wrote it: every tensor in the model dtype."""
    torch.manual_seed(0)
    config = KimiReplayConfig()
    state: dict[str, torch.Tensor] = {"write_pos": torch.zeros(2, dtype=torch.int32)}
    for i in range(config.num_hidden_layers):
        state[f"layers.{i}.recurrent_state"] = torch.randn(2, 2, 4, 4).to(torch.bfloat16)
        state[f"layers.{i}.d_cache"] = torch.randn(2, 2, 4, 4).to(torch.bfloat16)
        state[f"layers.{i}.k_cache"] = torch.randn(2, 1, 4, 4).to(torch.bfloat16)
        # The old format on purpose: this is what load_cache_state_dict must cope with.
        state[f"layers.{i}.g_cache"] = (-torch.rand(2, 2, 4, 4)).to(torch.bfloat16)  # noqa: RL004
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def build_restore_old_snapshot() -> dict[str, object]:
    cache = StaticReplayCache(KimiReplayConfig(), max_batch_size=2)
    load_cache_state_dict(cache, _bf16_snapshot())
    return {"d_cache": cache.d_cache, "g_cache": cache.g_cache}


def build_load_model_buffers() -> dict[str, torch.Tensor]:
    model = KimiReplayModelFp32Gates(KimiReplayConfig(torch_dtype="float32"))
    torch.manual_seed(1)
    state = {name: torch.randn_like(buf.float()).to(torch.bfloat16) for name, buf in model.named_buffers() if buf.is_floating_point()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return dict(load_model_buffers(model, buffer).named_buffers())


def prepare_for_fp16_inference(model: KimiReplayModel) -> KimiReplayModel:
    """Older GPUs without bf16: run the whole model in half precision."""
    model.half()  # expect-bug: module-cast
    return model.eval()


def build_fp16_inference() -> dict[str, torch.Tensor]:
    model = prepare_for_fp16_inference(KimiReplayModel(KimiReplayConfig(torch_dtype="float32")))
    return dict(model.named_buffers())
