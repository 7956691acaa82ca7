import os
from typing import Any, Dict, Optional, Union
from urllib.parse import urlsplit

import torch

from ..layers import set_layer_config
from ._helpers import load_checkpoint
from ._pretrained import PretrainedCfg
from ._registry import is_model, model_entrypoint, split_model_name_tag

__all__ = ['parse_model_name', 'create_model']


def parse_model_name(model_name: str):
    parsed = urlsplit(model_name)
    assert parsed.scheme in ('', 'hf-hub', 'local-dir')
    if parsed.scheme:
        return parsed.scheme, parsed.path
    return None, os.path.split(parsed.path)[-1]


def create_model(
        model_name: str,
        pretrained: bool = False,
        pretrained_cfg: Optional[Union[str, Dict[str, Any], PretrainedCfg]] = None,
        pretrained_cfg_overlay: Optional[Dict[str, Any]] = None,
        checkpoint_path: Optional[str] = None,
        scriptable: Optional[bool] = None,
        exportable: Optional[bool] = None,
        no_jit: Optional[bool] = None,
        init_dtype: Optional[Union[str, torch.dtype]] = None,
        **kwargs,
):
    """Create a model.

    Lookup model's entrypoint function and pass relevant args to create a new model.

    Args:
        model_name: Name of model to instantiate (``arch.tag`` selects a pretrained cfg).
        pretrained: If set to `True`, load pretrained weights.
        checkpoint_path: Path of checkpoint to load _after_ the model is initialized.
        init_dtype: Default dtype while the model is constructed (parameters are created in it).

    Keyword Args:
        replay_cache ('module' | 'external'), replay_cache_slots, cache_dtype: decode cache.
        dtype, device: passed to every layer.
        **: Other kwargs are model specific.
    """
    # Parameters that aren't supported by all models should default to None, drop them if not set
    kwargs = {k: v for k, v in kwargs.items() if v is not None}

    model_source, model_name = parse_model_name(model_name)
    if model_source:
        assert not pretrained_cfg, 'pretrained_cfg should not be set when sourcing model from Hugging Face Hub.'
        raise NotImplementedError(f'{model_source} models are not supported by this build')
    model_name, pretrained_tag = split_model_name_tag(model_name)
    if pretrained_tag and not pretrained_cfg:
        # a valid pretrained_cfg argument takes priority over tag in model name
        pretrained_cfg = pretrained_tag

    if not is_model(model_name):
        raise RuntimeError('Unknown model (%s)' % model_name)

    create_fn = model_entrypoint(model_name)
    with set_layer_config(scriptable=scriptable, exportable=exportable, no_jit=no_jit, default_dtype=init_dtype):  # expect-bug: default-dtype id=layer-cfg-dtype
        model = create_fn(
            pretrained=pretrained,
            pretrained_cfg=pretrained_cfg,
            pretrained_cfg_overlay=pretrained_cfg_overlay,
            **kwargs,
        )

    if checkpoint_path:
        load_checkpoint(model, checkpoint_path)

    return model


def build_create_model_module_cache():
    """ bf16 layers (``dtype=``) with a module cache; one prefill. """
    torch.manual_seed(0)
    model = create_model('kda_vlm_tiny', dtype=torch.bfloat16, replay_cache='module', replay_cache_slots=2)
    model.prefill(1, torch.tensor([5, 4, 3, 2]))
    return model


def build_create_model_init_dtype():
    """ Same model built under ``init_dtype='bfloat16'`` (low host memory init). """
    torch.manual_seed(0)
    model = create_model('kda_vlm_tiny', init_dtype='bfloat16', replay_cache='module', replay_cache_slots=2)
    model.prefill(1, torch.tensor([5, 4, 3, 2]))
    return model
