# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Kimi Linear (Kimi Delta Attention) models for Composer-style training and serving.

The layout follows llm-foundry: :mod:`foundry_kda.registry` holds the builders,
:mod:`foundry_kda.models` the architectures and their Composer wrappers,
:mod:`foundry_kda.inference` the ReplaySSM decode caches and generation loops,
:mod:`foundry_kda.callbacks` the training-loop hooks and :mod:`foundry_kda.utils` the
configuration, distributed and checkpoint-conversion helpers.
"""

from foundry_kda import registry
from foundry_kda.precision import Precision, get_precision_context

__version__ = "0.3.1"

__all__ = ["Precision", "__version__", "get_precision_context", "registry"]
