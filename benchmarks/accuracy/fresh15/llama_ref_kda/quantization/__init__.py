# Copyright (c) the llama_ref_kda authors.
# This source code is licensed under the terms described in the LICENSE file in
# the root directory of this source tree.

from .loader import Fp8Linear, Int4Linear, convert_to_quantized_model

__all__ = ["Fp8Linear", "Int4Linear", "convert_to_quantized_model"]
