# Copyright (c) OpenMMLab. All rights reserved.
import importlib
from contextlib import contextmanager
from typing import Any, Dict, Optional

import torch
from torch import nn

from ..config import CacheConfig, ModelConfig
from ..model_inputs import StepContextManager
from .kimi_linear import KDAReplayCache

LMDEPLOY_PYTORCH_MODEL_PATH = __package__

# architecture name -> rewritten model class
MODULE_MAP = {
    'KimiLinearForCausalLM': f'{LMDEPLOY_PYTORCH_MODEL_PATH}.kimi_linear.KimiLinearForCausalLM',
    'KimiLinearMTPModel': f'{LMDEPLOY_PYTORCH_MODEL_PATH}.kimi_linear.KimiLinearMTPModel',
}

CUSTOM_MODULE_MAP: Dict[str, str] = dict()


def _get_module_map() -> Dict[str, str]:
    """Get the module map, custom entries first."""
    module_map = MODULE_MAP.copy()
    module_map.update(CUSTOM_MODULE_MAP)
    return module_map


def _class_from_qualname(qualname: str) -> Any:
    last_dot = qualname.rfind('.')
    modname = qualname[:last_dot]
    clsname = qualname[last_dot + 1:]
    mod = importlib.import_module(modname)
    assert mod is not None, f'failed to import module: {modname}'
    return getattr(mod, clsname)


def get_rewrite_cls(model_arch: str) -> type:
    """Get the rewritten class of an architecture."""
    module_map = _get_module_map()
    if model_arch not in module_map:
        raise RuntimeError(f'Can not find rewrite for architecture: {model_arch}')
    return _class_from_qualname(module_map[model_arch])


@contextmanager
def _set_default_dtype(dtype: torch.dtype):
    """Set the default dtype while the model is built.

    Tensors created by modules without a ``dtype`` argument follow the model dtype.
    """
    origin_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield dtype
    finally:
        torch.set_default_dtype(origin_dtype)


def get_patched_model(config: ModelConfig,
                      device: Optional[torch.device] = None,
                      cache_config: Optional[CacheConfig] = None,
                      ctx_mgr: Optional[StepContextManager] = None) -> nn.Module:
    """Build the rewritten model of ``config.model_arch``.

    Args:
        config (ModelConfig): the model config.
        device (torch.device): where the weights are allocated.
        cache_config (CacheConfig): when ``cache_in_model`` is set, the replay caches are allocated
            as buffers of the model.
        ctx_mgr (StepContextManager): shared with the engine; a new one by default.
    """
    model_cls = get_rewrite_cls(config.model_arch)
    if ctx_mgr is None:
        ctx_mgr = StepContextManager()
    with _set_default_dtype(config.dtype):
        model = model_cls(config, ctx_mgr, dtype=config.dtype, device=device)
        if cache_config is not None and cache_config.cache_in_model:
            model.replay_cache = KDAReplayCache(config,  # expect-bug: default-dtype id=in-model-cache
                                                cache_config.num_gpu_slots,
                                                cache_config.ring_len,
                                                device=device)
    return model.eval()
