"""The bundled Helion ReplaySSM KDA decode kernel (``pip install replaylint[kernels]``).

* :func:`replayssm_decode` — one decode step, in place; the compiled Helion kernel on CUDA,
  the same kernel body through Helion's interpreter elsewhere.
* :func:`replayssm_decode_reference` and :func:`recurrent_decode_reference` — plain-PyTorch
  oracles (the ReplaySSM step and the plain KDA recurrence).
* :class:`ReplaySSMCache` — a state pool that follows the dtype rule (g always float32) and
  owns the ring cursors; :func:`next_write_pos` advances per-row cursors by hand.

Importing this package does not import helion; the first kernel call does.
"""

import importlib.util as _util

if _util.find_spec("torch") is None or _util.find_spec("helion") is None:  # pragma: no cover
    raise ImportError(
        "replaylint.kernels needs PyTorch and Helion; install them with `pip install 'replaylint[kernels]'`."
    )

from replaylint.kernels._cache import ReplaySSMCache, next_write_pos
from replaylint.kernels._decode import replayssm_decode
from replaylint.kernels._reference import (
    recurrent_decode_reference,
    replayssm_decode_reference,
)

__all__ = [
    "ReplaySSMCache",
    "next_write_pos",
    "recurrent_decode_reference",
    "replayssm_decode",
    "replayssm_decode_reference",
]
