import dataclasses
import logging
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn as nn

from ..utils.amp import resolve_dtype
from ._cache import RING_NAMES, ReplayCache
from ._features import FeatureGetterNet
from ._pretrained import PretrainedCfg, cache_dtypes_for
from ._registry import get_pretrained_cfg

_logger = logging.getLogger(__name__)

__all__ = ['build_model_with_cfg', 'load_pretrained', 'resolve_pretrained_cfg']

_CACHE_KWARGS = ('replay_cache', 'replay_cache_slots', 'cache_dtype')


def load_pretrained(
        model: nn.Module,
        pretrained_cfg: Optional[Dict] = None,
        filter_fn: Optional[Callable] = None,
        strict: bool = True,
):
    pretrained_cfg = pretrained_cfg or getattr(model, 'pretrained_cfg', None)
    if not pretrained_cfg:
        raise RuntimeError("Invalid pretrained config, cannot load weights. Use `pretrained=False` for random init.")
    if pretrained_cfg.get('state_dict') is not None:
        state_dict = dict(pretrained_cfg['state_dict'])
    elif pretrained_cfg.get('file'):
        _logger.info(f'Loading pretrained weights from file ({pretrained_cfg["file"]})')
        state_dict = torch.load(pretrained_cfg['file'], map_location='cpu', weights_only=True)
    elif pretrained_cfg.get('url'):
        state_dict = torch.hub.load_state_dict_from_url(pretrained_cfg['url'], map_location='cpu', progress=False)
    else:
        model_name = pretrained_cfg.get('architecture', 'this model')
        raise RuntimeError(f"No pretrained weights exist for {model_name}. Use `pretrained=False` for random init.")
    if filter_fn is not None:
        state_dict = filter_fn(state_dict, model)
    load_result = model.load_state_dict(state_dict, strict=strict)
    if load_result.missing_keys:
        _logger.info(f'Missing keys ({", ".join(load_result.missing_keys)}) discovered while loading pretrained weights.')


def _update_default_model_kwargs(pretrained_cfg, kwargs, kwargs_filter):
    """ Update the default_cfg and kwargs before passing to model """
    if pretrained_cfg.get('input_size') is not None:
        kwargs.setdefault('in_chans', pretrained_cfg['input_size'][0])
    for n in ('vocab_size', 'ring_len'):
        if pretrained_cfg.get(n) is not None:
            kwargs.setdefault(n, pretrained_cfg[n])
    # Filter keyword args for task specific model variants (some 'features only' models, etc.)
    if kwargs_filter:
        for n in kwargs_filter:
            kwargs.pop(n, None)


def resolve_pretrained_cfg(
        variant: str,
        pretrained_cfg: Optional[Union[str, Dict[str, Any]]] = None,
        pretrained_cfg_overlay: Optional[Dict[str, Any]] = None,
) -> PretrainedCfg:
    model_with_tag = variant
    pretrained_tag = None
    if pretrained_cfg:
        if isinstance(pretrained_cfg, dict):
            # pretrained_cfg dict passed as arg, validate by converting to PretrainedCfg
            pretrained_cfg = PretrainedCfg(**pretrained_cfg)
        elif isinstance(pretrained_cfg, str):
            pretrained_tag = pretrained_cfg
            pretrained_cfg = None

    # fallback to looking up pretrained cfg in model registry by variant identifier
    if not pretrained_cfg:
        if pretrained_tag:
            model_with_tag = '.'.join([variant, pretrained_tag])
        pretrained_cfg = get_pretrained_cfg(model_with_tag)

    if not pretrained_cfg:
        _logger.warning(f"No pretrained configuration specified for {model_with_tag} model. Using a default.")
        pretrained_cfg = PretrainedCfg()  # instance with defaults

    pretrained_cfg_overlay = pretrained_cfg_overlay or {}
    if not pretrained_cfg.architecture:
        pretrained_cfg_overlay.setdefault('architecture', variant)
    pretrained_cfg = dataclasses.replace(pretrained_cfg, **pretrained_cfg_overlay)
    return pretrained_cfg


def _attach_replay_cache(model: nn.Module, mode: Optional[str], num_slots: int, pretrained_cfg: Dict[str, Any], cache_dtype=None):
    """ ``mode='module'``: cache buffers in the blocks; ``'external'``: a ``ReplayCache`` on ``model.replay_cache``. """
    if not mode:
        return
    ring_len = pretrained_cfg.get('ring_len', 8)
    if mode == 'module':
        model.set_replay_cache(num_slots, ring_len=ring_len, dtype=resolve_dtype(cache_dtype))
        return
    assert mode == 'external', f'Unknown replay cache mode {mode}'
    if cache_dtype is not None:
        ring_dtypes = dict.fromkeys(RING_NAMES, resolve_dtype(cache_dtype))  # expect-bug: container
    else:
        ring_dtypes = cache_dtypes_for(pretrained_cfg.get('cache_precision', 'bf16'))  # expect-bug: imported-policy id=precision-table
    model.replay_cache = ReplayCache.from_model(model, num_slots, ring_len=ring_len, ring_dtypes=ring_dtypes, device=next(model.parameters()).device)


def _build_model_with_cfg(
        model_cls: Callable,
        variant: str,
        pretrained: bool,
        pretrained_cfg: Optional[Dict] = None,
        pretrained_cfg_overlay: Optional[Dict] = None,
        model_cfg: Optional[Any] = None,
        feature_cfg: Optional[Dict] = None,
        pretrained_strict: bool = True,
        pretrained_filter_fn: Optional[Callable] = None,
        kwargs_filter: Optional[Tuple[str]] = None,
        **kwargs,
):
    """ Build model with specified default_cfg and optional model_cfg

    This helper fn aids in the construction of a model including:
      * handling default_cfg and associated pretrained weight loading
      * passing through optional model_cfg for models with config based arch spec
      * features_only model adaptation
      * replay cache attachment (``replay_cache``, ``replay_cache_slots``, ``cache_dtype``)
    """
    features = False
    feature_cfg = feature_cfg or {}
    cache_args = {k: kwargs.pop(k) for k in _CACHE_KWARGS if k in kwargs}

    # resolve and update model pretrained config and model kwargs
    pretrained_cfg = resolve_pretrained_cfg(
        variant,
        pretrained_cfg=pretrained_cfg,
        pretrained_cfg_overlay=pretrained_cfg_overlay
    )
    pretrained_cfg = pretrained_cfg.to_dict()
    _update_default_model_kwargs(pretrained_cfg, kwargs, kwargs_filter)

    # Setup for feature extraction wrapper done at end of this fn
    if kwargs.pop('features_only', False):
        features = True
        feature_cfg.setdefault('out_indices', (0, 1, 2, 3))
        for k in ('out_indices', 'feature_cls', 'output_fmt', 'feature_dtype'):
            if k in kwargs:
                feature_cfg[k] = kwargs.pop(k)

    # Instantiate the model
    if model_cfg is None:
        model = model_cls(**kwargs)
    else:
        model = model_cls(cfg=model_cfg, **kwargs)
    model.pretrained_cfg = pretrained_cfg
    model.default_cfg = model.pretrained_cfg  # alias for backwards compat

    if pretrained:
        load_pretrained(model, pretrained_cfg=pretrained_cfg, filter_fn=pretrained_filter_fn, strict=pretrained_strict)

    if cache_args.get('replay_cache'):
        _attach_replay_cache(
            model,
            cache_args['replay_cache'],
            cache_args.get('replay_cache_slots', 1),
            pretrained_cfg,
            cache_dtype=cache_args.get('cache_dtype'),
        )

    # Wrap the model in a feature extraction module if enabled
    if features:
        feature_cls = feature_cfg.pop('feature_cls', 'getter')
        assert feature_cls == 'getter', f'Unknown feature class {feature_cls}'
        model = FeatureGetterNet(model, **feature_cfg)
        model.pretrained_cfg = pretrained_cfg
        model.default_cfg = pretrained_cfg

    return model


build_model_with_cfg = _build_model_with_cfg


def _external(model_name: str, **kwargs):
    from ._factory import create_model
    torch.manual_seed(0)
    model = create_model(model_name, dtype=torch.bfloat16, replay_cache='external', replay_cache_slots=2, **kwargs).eval()
    model.prefill(0, torch.tensor([6, 2, 8]))
    model.forward_decode(torch.tensor([1, 5]), torch.tensor([0, 1], dtype=torch.int32))
    return {'model': model, 'cache': model.replay_cache}


def build_external_cache_edge():
    """ ``kda_vlm_tiny.edge``: the edge deployment cache precision. """
    return _external('kda_vlm_tiny.edge')


def build_external_cache_dtype_override():
    """ ``cache_dtype='bfloat16'`` overriding the pretrained cfg's cache precision. """
    return _external('kda_vlm_tiny', cache_dtype='bfloat16')
