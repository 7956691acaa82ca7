""" Model Registry
"""
import fnmatch
import sys
import warnings
from collections import defaultdict, deque
from copy import deepcopy
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Set, Union, Tuple

from ._pretrained import PretrainedCfg, DefaultCfg

__all__ = [
    'split_model_name_tag', 'register_model', 'generate_default_cfgs',
    'list_models', 'is_model', 'model_entrypoint', 'get_pretrained_cfg',
]

_model_entrypoints: Dict[str, Callable[..., Any]] = {}  # mapping of model names to architecture entrypoint fns
_model_has_pretrained: Set[str] = set()  # set of model names that have pretrained weight url present
_model_default_cfgs: Dict[str, DefaultCfg] = {}  # central repo for model arch -> default cfg objects
_model_pretrained_cfgs: Dict[str, PretrainedCfg] = {}  # central repo for model arch.tag -> pretrained cfgs
_model_with_tags: Dict[str, List[str]] = defaultdict(list)  # shortcut to map each model arch to all model + tag names


def split_model_name_tag(model_name: str, no_tag: str = '') -> Tuple[str, str]:
    model_name, *tag_list = model_name.split('.', 1)
    tag = tag_list[0] if tag_list else no_tag
    return model_name, tag


def generate_default_cfgs(cfgs: Dict[str, Union[Dict[str, Any], PretrainedCfg]]):
    out = defaultdict(DefaultCfg)
    tags_per_arch = defaultdict(set)  # used to check for duplicate tags

    for k, v in cfgs.items():
        if isinstance(v, dict):
            v = PretrainedCfg(**v)
        has_weights = v.has_weights

        model, tag = split_model_name_tag(k)
        is_default_set = model in out
        priority = (has_weights and not tag) or (tag.endswith('*') and not is_default_set)
        tag = tag.strip('*')

        default_cfg = out[model]

        if priority:
            default_cfg.tags.appendleft(tag)
        else:
            default_cfg.tags.append(tag)

        if has_weights:
            default_cfg.is_pretrained = True

        default_cfg.cfgs[tag] = v
        assert tag not in tags_per_arch[model], f'Duplicate tag {tag} for {model}'
        tags_per_arch[model].add(tag)

    return out


def register_model(fn: Callable[..., Any]) -> Callable[..., Any]:
    # lookup containing module
    mod = sys.modules[fn.__module__]

    # add model to __all__ in module
    model_name = fn.__name__
    if hasattr(mod, '__all__'):
        mod.__all__.append(model_name)
    else:
        mod.__all__ = [model_name]  # type: ignore

    # add entries to registry dict/sets
    if model_name in _model_entrypoints:
        warnings.warn(f'Overwriting {model_name} in registry with {fn.__module__}.{model_name}.', stacklevel=2)
    _model_entrypoints[model_name] = fn
    if hasattr(mod, 'default_cfgs') and model_name in mod.default_cfgs:
        # this will catch all models that have entrypoint matching cfg key, but miss any aliasing
        # entrypoints or non-matching combos
        default_cfg = mod.default_cfgs[model_name]
        if not isinstance(default_cfg, DefaultCfg):
            # old style cfg dict per model-arch
            default_cfg = DefaultCfg(tags=deque(['']), cfgs={'': PretrainedCfg(**default_cfg)})

        for tag_idx, tag in enumerate(default_cfg.tags):
            is_default = tag_idx == 0
            pretrained_cfg = default_cfg.cfgs[tag]
            model_name_tag = '.'.join([model_name, tag]) if tag else model_name
            replace_items = dict(architecture=model_name, tag=tag if tag else None)
            pretrained_cfg = replace(pretrained_cfg, **replace_items)

            for name in {model_name_tag, model_name} if is_default else {model_name_tag}:
                _model_pretrained_cfgs[name] = pretrained_cfg
                if pretrained_cfg.has_weights:
                    _model_has_pretrained.add(name)
            _model_with_tags[model_name].append(model_name_tag)

        _model_default_cfgs[model_name] = default_cfg

    return fn


def list_models(filter: Union[str, List[str]] = '', pretrained: bool = False, include_tags: Optional[bool] = None) -> List[str]:
    include_tags = pretrained if include_tags is None else include_tags
    all_models: Set[str] = set(_model_entrypoints.keys())
    if include_tags:
        # expand model names to include names w/ pretrained tags
        all_models = {t for m in all_models for t in _model_with_tags[m]}
    if filter:
        include_filters = filter if isinstance(filter, (tuple, list)) else [filter]
        all_models = {m for f in include_filters for m in fnmatch.filter(all_models, f)}
    if pretrained:
        all_models = _model_has_pretrained.intersection(all_models)
    return sorted(all_models)


def is_model(model_name: str) -> bool:
    arch_name = split_model_name_tag(model_name)[0]
    return arch_name in _model_entrypoints


def model_entrypoint(model_name: str) -> Callable[..., Any]:
    return _model_entrypoints[split_model_name_tag(model_name)[0]]


def get_pretrained_cfg(model_name: str, allow_unregistered: bool = True) -> Optional[PretrainedCfg]:
    if model_name in _model_pretrained_cfgs:
        return deepcopy(_model_pretrained_cfgs[model_name])
    arch_name, tag = split_model_name_tag(model_name)
    if arch_name in _model_default_cfgs:
        # if model arch exists, but the tag is wrong, error out
        raise RuntimeError(f'Invalid pretrained tag ({tag}) for {arch_name}.')
    if allow_unregistered:
        # if model arch doesn't exist, it has no pretrained_cfg registered, allow a default to be created
        return None
    raise RuntimeError(f'Model architecture ({arch_name}) has no pretrained cfg registered.')


