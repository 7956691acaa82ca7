# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Kimi Linear (Kimi Delta Attention) inference components written in the torchtune style.

The package is organised like torchtune: ``modules`` holds the building blocks (attention,
decoder, decode caches), ``models`` the component and model builders, ``training`` the precision
and checkpointing utilities, ``generation`` the sampling loop and the serving-side cache
machinery, and ``recipes`` the end-to-end entry points driven by configs.
"""

__version__ = "0.3.0"
