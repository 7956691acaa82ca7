from .kda import (
    fused_recurrent_kda_replayssm_decode,
    gen_kda_decode_uri,
    get_kda_decode_module,
)
