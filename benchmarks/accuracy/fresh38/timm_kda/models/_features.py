""" PyTorch Feature Extraction Helpers

``FeatureGetterNet`` wraps a model that implements ``forward_intermediates``; it can also tap
the decode cache of the selected blocks (``cache_state``) for probing / visualisation.
"""
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

__all__ = ['feature_take_indices', 'FeatureInfo', 'FeatureGetterNet']


def feature_take_indices(
        num_features: int,
        indices: Optional[Union[int, List[int]]] = None,
        as_set: bool = False,
) -> Tuple[List[int], int]:
    """ Determine the absolute feature indices to 'take' from. """
    if indices is None:
        indices = num_features  # all features if None

    if isinstance(indices, int):
        # convert int -> last n indices
        torch._assert(0 < indices <= num_features, f'last-n ({indices}) is out of range (1 to {num_features})')
        take_indices = [num_features - indices + i for i in range(indices)]
    else:
        take_indices: List[int] = []
        for i in indices:
            idx = num_features + i if i < 0 else i
            torch._assert(0 <= idx < num_features, f'feature index {idx} is out of range (0 to {num_features - 1})')
            take_indices.append(idx)

    if not torch.jit.is_scripting() and as_set:
        return set(take_indices), max(take_indices)

    return take_indices, max(take_indices)


class FeatureInfo:

    def __init__(self, feature_info: List[Dict], out_indices: Sequence[int]):
        self.out_indices = tuple(out_indices)
        self.info = feature_info

    def get(self, key: str, idx=None):
        if idx is None:
            return [self.info[i][key] for i in self.out_indices]
        return self.info[self.out_indices[idx]][key]

    def channels(self, idx=None):
        return self.get('num_chs', idx)


class FeatureGetterNet(nn.ModuleDict):
    """ FeatureGetterNet

    Wrap models with a feature getter method, like 'forward_intermediates'
    """

    def __init__(
            self,
            model: nn.Module,
            out_indices: Union[int, List[int]] = 4,
            out_map: Optional[Sequence[str]] = None,
            return_dict: bool = False,
            output_fmt: str = 'NLC',
            norm: bool = False,
            prune: bool = True,
            feature_dtype: Optional[torch.dtype] = None,
    ):
        super().__init__()
        if prune and hasattr(model, 'prune_intermediate_layers'):
            # replace out_indices with the absolute indices after pruning
            out_indices = model.prune_intermediate_layers(out_indices, prune_norm=not norm)
        elif isinstance(out_indices, int):
            out_indices, _ = feature_take_indices(len(model.feature_info), out_indices)
        self.feature_info = FeatureInfo(model.feature_info, out_indices)
        if out_map is not None:
            assert len(out_map) == len(out_indices)
        self.model = model
        self.out_indices = out_indices
        self.out_map = out_map
        self.return_dict = return_dict
        self.output_fmt = output_fmt
        self.norm = norm
        self.feature_dtype = feature_dtype  # features (and cache taps) handed out in this dtype

    def forward(self, input_ids, images=None):
        features = self.model.forward_intermediates(
            input_ids,
            images,
            indices=self.out_indices,
            norm=self.norm,
            output_fmt=self.output_fmt,
            intermediates_only=True,
        )
        if self.feature_dtype is not None:
            features = [f.to(self.feature_dtype) for f in features]
        if self.return_dict:
            names = self.out_map or [f'blocks.{i}' for i in self.out_indices]
            return OrderedDict(zip(names, features))
        return features

    @torch.no_grad()
    def cache_state(self) -> Dict[str, Dict[str, torch.Tensor]]:
        """ Detached copies of the decode cache of each selected block. """
        taps = OrderedDict()
        for idx in self.out_indices:
            attn = self.model.blocks[idx].attn
            if not attn.cache_slots:
                continue
            tap = {}
            for name, t in attn.ring_buffers().items():
                if name in ('ssm_state', 'ring_pos'):
                    tap[name] = t.detach().clone()
                else:
                    tap[name] = t.detach().to(dtype=self.feature_dtype or t.dtype, copy=True)  # expect-bug: cast
            taps[f'blocks.{idx}'] = tap
        return taps


def _getter(**kwargs):
    from ._factory import create_model
    torch.manual_seed(0)
    model = create_model('kda_vlm_tiny', features_only=True, out_indices=(0, 1), replay_cache='module', replay_cache_slots=2, **kwargs)
    ids = torch.tensor([[4, 8, 15, 16]])
    feats = model(ids)
    model.model.prefill(1, ids[0])
    return model, feats


def build_feature_getter():
    """ Block features of a text prompt, and the cache taps after a prefill. """
    model, feats = _getter()
    return {'features': feats, 'cache': model.cache_state()}


def build_feature_cache_tap_bf16():
    """ Same, with features handed out in bf16 for a bf16 probe head. """
    model, feats = _getter(feature_dtype=torch.bfloat16)
    return {'features': feats, 'cache': model.cache_state()}
