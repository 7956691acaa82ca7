# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

"""Reference implementation of a Kimi Delta Attention (KDA) decoder with ReplaySSM caches."""

from .args import ModelArgs, QuantizationArgs
from .datatypes import CacheDtype, QuantizationMode, RingDtypes

__all__ = ["ModelArgs", "QuantizationArgs", "CacheDtype", "QuantizationMode", "RingDtypes"]
