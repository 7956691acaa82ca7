__version__ = '0.3.0.dev0'

from .layers import is_exportable, is_no_jit, is_scriptable, set_layer_config
from .models import create_model, get_pretrained_cfg, is_model, list_models
