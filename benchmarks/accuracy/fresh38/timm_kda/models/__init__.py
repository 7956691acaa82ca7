from .kda_vlm import *

from ._builder import build_model_with_cfg, load_pretrained, resolve_pretrained_cfg
from ._cache import LayerRings, ReplayCache
from ._factory import create_model, parse_model_name
from ._features import FeatureGetterNet, feature_take_indices
from ._helpers import clean_state_dict, load_checkpoint, load_replay_snapshot, load_state_dict, remap_state_dict, \
    save_replay_snapshot
from ._manipulate import adapt_input_conv, cast_model_dtype, checkpoint_seq, named_apply
from ._pretrained import CACHE_PRECISIONS, DefaultCfg, PretrainedCfg, cache_dtypes_for
from ._registry import get_pretrained_cfg, is_model, list_models, model_entrypoint, register_model, split_model_name_tag
