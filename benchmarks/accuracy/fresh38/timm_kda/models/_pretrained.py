from collections import deque
from dataclasses import dataclass, field, asdict
from typing import Any, Deque, Dict, Tuple, Optional, Union

import torch

from ..utils.amp import resolve_dtype

__all__ = ['PretrainedCfg', 'filter_kwargs', 'DefaultCfg', 'CACHE_PRECISIONS', 'cache_dtypes_for']


@dataclass
class PretrainedCfg:
    """ Pretrained weight source, preprocessing and decode cache defaults of one model.tag """
    # weight source locations
    url: Optional[Union[str, Tuple[str, str]]] = None  # remote URL
    file: Optional[str] = None  # local / shared filesystem path
    state_dict: Optional[Dict[str, Any]] = None  # in-memory state dict

    source: Optional[str] = None  # source of cfg / weight location used (url, file, hf-hub)
    architecture: Optional[str] = None  # architecture variant can be set when not implicit
    tag: Optional[str] = None  # pretrained tag of source
    custom_load: bool = False  # use custom model specific model.load_pretrained() (ie for npz files)

    # input / data config
    input_size: Tuple[int, int, int] = (3, 16, 16)
    fixed_input_size: bool = False
    interpolation: str = 'bicubic'
    mean: Tuple[float, ...] = (0.485, 0.456, 0.406)
    std: Tuple[float, ...] = (0.229, 0.224, 0.225)

    # head / vocab config
    vocab_size: int = 64
    num_classes: int = 0
    label_offset: Optional[int] = None

    # decode cache config
    ring_len: int = 8
    cache_precision: str = 'bf16'  # key of CACHE_PRECISIONS

    # model attributes that vary with above or required for pretrained adaptation
    first_conv: Optional[str] = None
    classifier: Optional[str] = None

    # training / data config
    license: Optional[str] = None
    notes: Optional[Tuple[str]] = None

    @property
    def has_weights(self):
        return self.url or self.file or self.state_dict is not None

    def to_dict(self, remove_source=False, remove_null=True):
        return filter_kwargs(
            asdict(self),
            remove_source=remove_source,
            remove_null=remove_null
        )


def filter_kwargs(kwargs, remove_source=False, remove_null=True):
    filtered_cfg = {}
    keep_null = {'pool_size', 'first_conv', 'classifier'}  # always keep these keys, even if none
    for k, v in kwargs.items():
        if remove_source and k in {'url', 'file', 'state_dict', 'source'}:
            continue
        if remove_null and v is None and k not in keep_null:
            continue
        filtered_cfg[k] = v
    return filtered_cfg


@dataclass
class DefaultCfg:
    tags: Deque[str] = field(default_factory=deque)  # priority queue of tags (first is default)
    cfgs: Dict[str, PretrainedCfg] = field(default_factory=dict)  # pretrained cfgs by tag
    is_pretrained: bool = False  # at least one of the configs has a pretrained source set

    @property
    def default(self):
        return self.cfgs[self.tags[0]]

    @property
    def default_with_tag(self):
        tag = self.tags[0]
        return tag, self.cfgs[tag]


# ReplaySSM cache precisions, (d / k rings, checkpoint state, log-decay ring)
CACHE_PRECISIONS: Dict[str, Tuple[str, str, str]] = {
    'fp32': ('float32', 'float32', 'float32'),
    'bf16': ('bfloat16', 'float32', 'float32'),
    'fp16': ('float16', 'float32', 'float32'),
    'bf16-lean': ('bfloat16', 'float32', 'bfloat16'),  # expect-bug: imported-policy id=precision-table
}


def cache_dtypes_for(precision: str = 'bf16') -> Dict[str, torch.dtype]:
    """ Ring dtypes, by cache tensor name, for a ``pretrained_cfg['cache_precision']``. """
    ring, state, decay = (resolve_dtype(n) for n in CACHE_PRECISIONS[precision])
    return dict(ssm_state=state, delta_ring=ring, key_ring=ring, decay_log_ring=decay)
