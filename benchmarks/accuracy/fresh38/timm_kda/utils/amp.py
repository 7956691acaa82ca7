""" AMP / dtype helpers

String dtype configs (``--amp-dtype bfloat16``, ``pretrained_cfg['cache_precision']``, ...) are
mapped to torch dtypes through the tables here.
"""
from contextlib import suppress
from functools import partial
from typing import Dict, Optional, Union

import torch

_DTYPE_MAP = {
    'float32': torch.float32,
    'fp32': torch.float32,
    'float': torch.float32,
    'bfloat16': torch.bfloat16,
    'bf16': torch.bfloat16,
    'float16': torch.float16,
    'fp16': torch.float16,
    'half': torch.float16,
}
_AMP_DTYPES = ('float16', 'bfloat16')

DtypeLike = Union[str, torch.dtype, None]


def resolve_dtype(dtype: DtypeLike) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPE_MAP[dtype.lower()]
    except KeyError:
        raise ValueError(f'Unknown dtype "{dtype}", expected one of {sorted(_DTYPE_MAP)}')


def resolve_amp_dtype(amp_dtype: DtypeLike = 'float16') -> torch.dtype:
    dtype = resolve_dtype(amp_dtype)
    assert dtype in (torch.float16, torch.bfloat16), f'AMP dtype must be one of {_AMP_DTYPES}'
    return dtype


def amp_autocast_factory(device_type: str = 'cuda', amp_dtype: DtypeLike = 'float16', enabled: bool = True):
    """ Returns a no-arg context factory, ``suppress`` when AMP is off. """
    if not enabled:
        return suppress
    return partial(torch.autocast, device_type=device_type, dtype=resolve_amp_dtype(amp_dtype))


def ring_dtypes_for_amp(amp_dtype: DtypeLike = 'bfloat16', low_memory: bool = False) -> Dict[str, torch.dtype]:
    """ ReplaySSM cache dtypes for a given AMP dtype.

    The d / k rings follow the autocast dtype; the checkpoint state and the log-decay ring are
    accumulated by the kernel and stay float32. ``low_memory`` shrinks the cache further for
    many-slot serving.
    """
    dtype = resolve_dtype(amp_dtype) or torch.float32
    dtypes = dict(ssm_state=torch.float32, delta_ring=dtype, key_ring=dtype, decay_log_ring=torch.float32)
    if low_memory:
        dtypes.update(decay_log_ring=dtype)  # expect-bug: imported-policy id=amp-low-mem
    return dtypes
