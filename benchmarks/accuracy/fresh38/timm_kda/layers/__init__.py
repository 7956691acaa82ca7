from .config import is_exportable, is_no_jit, is_scriptable, set_exportable, set_fused_attn, set_layer_config, use_fused_attn
from .create_act import create_act_layer, get_act_layer
from .create_norm import RmsNorm, get_norm_layer
from .kda import RING_BUFFER_NAMES, KimiDeltaAttention
from .mlp import SwiGLU
from .patch_embed import PatchEmbed, to_2tuple
