"""torch dtype spellings and what they mean.

``torch.float`` is float32, ``torch.half`` float16, ``torch.double`` float64 and so on: every
spelling maps to one canonical name so that rules compare meanings, not text.
"""

from __future__ import annotations

FLOAT32 = "float32"

# attribute of the ``torch`` module -> canonical dtype name
_TORCH_DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32",
    "float": "float32",
    "float64": "float64",
    "double": "float64",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "complex32": "complex32",
    "chalf": "complex32",
    "complex64": "complex64",
    "cfloat": "complex64",
    "complex128": "complex128",
    "cdouble": "complex128",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "int8": "int8",
    "int16": "int16",
    "short": "int16",
    "int32": "int32",
    "int": "int32",
    "int64": "int64",
    "long": "int64",
    "bool": "bool",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2": "float8_e5m2",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu",
    "float4_e2m1fn_x2": "float4_e2m1fn_x2",
    "qint8": "qint8",
    "quint8": "quint8",
    "qint32": "qint32",
}

# Tensor methods that cast to a fixed dtype, e.g. ``x.half()``.
CAST_METHODS: dict[str, str] = {
    "float": "float32",
    "half": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "int": "int32",
    "long": "int64",
    "short": "int16",
    "char": "int8",
    "byte": "uint8",
    "bool": "bool",
    "cfloat": "complex64",
    "cdouble": "complex128",
}


def dtype_from_qualified_name(qualified_name: str) -> str | None:
    """``"torch.half"`` -> ``"float16"``; ``None`` if the name is not a torch dtype."""
    module, _, attribute = qualified_name.rpartition(".")
    if module != "torch":
        return None
    return _TORCH_DTYPE_ALIASES.get(attribute)
