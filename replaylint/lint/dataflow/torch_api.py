"""Everything the analysis knows about torch (and numpy, safetensors) APIs, in one place.

Dtype spellings and what they mean (``torch.float`` is float32, ``torch.half`` float16, ...: every
spelling maps to one canonical name so that rules compare meanings, not text), the factories that
allocate, the methods that cast or keep a dtype, the loaders that read tensors from disk. Teaching
the linter a torch function means adding it to one table here.
"""

from __future__ import annotations

FLOAT32 = "float32"
FLOAT64 = "float64"

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

# Dtypes that are not floating point: a tensor of one of them (an index, a mask, a complex
# buffer) is not a log-decay ring, whatever its name.
NON_FLOATING_DTYPES: frozenset[str] = frozenset(
    canonical
    for canonical in _TORCH_DTYPE_ALIASES.values()
    if canonical.startswith(("int", "uint", "bool", "complex", "qint", "quint"))
)

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


# torch factories that create a tensor whose dtype is given by ``dtype=`` or the default dtype.
TORCH_FACTORIES: frozenset[str] = frozenset(
    f"torch.{name}"
    for name in (
        "empty",
        "zeros",
        "ones",
        "full",
        "rand",
        "randn",
        "empty_strided",
        "tensor",
        "as_tensor",
        "linspace",
        "logspace",
        "eye",
    )
)
# Factories whose dtype follows their arguments unless ``dtype=`` is given (integers make int64):
# allocations only with ``dtype=``.
TORCH_RANGE_FACTORIES: frozenset[str] = frozenset({"torch.arange", "torch.range"})
# torch factories that follow their first argument's dtype unless ``dtype=`` is given.
TORCH_LIKE_FACTORIES: frozenset[str] = frozenset(
    f"torch.{name}_like" for name in ("empty", "zeros", "ones", "full", "rand", "randn")
)
# Tensor methods that allocate with the receiver's dtype unless ``dtype=`` is given.
NEW_METHODS: frozenset[str] = frozenset(
    {"new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"}
)
# Positional index of ``dtype`` where the factory accepts it positionally.
POSITIONAL_DTYPE: dict[str, int] = {"torch.as_tensor": 1}

# Wrappers and methods whose result has the dtype of the tensor they are given.
DTYPE_PRESERVING_WRAPPERS = frozenset(
    {"torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Buffer"}
    # einops' rearrangements move elements, they keep the tensor's dtype
    | {"einops.rearrange", "einops.repeat", "einops.einops.rearrange", "einops.einops.repeat"}
)
DTYPE_PRESERVING_METHODS = frozenset(
    {
        "contiguous", "cpu", "cuda", "detach", "detach_", "expand", "expand_as", "fill_",
        "flatten", "narrow", "permute", "pin_memory", "repeat", "requires_grad_", "reshape",
        "share_memory_", "squeeze", "t", "transpose", "unsqueeze", "view", "view_as", "zero_",
        "normal_", "uniform_", "copy_", "unflatten", "movedim", "select", "index_select",
        "split", "chunk", "unbind", "roll", "flip", "masked_fill", "masked_fill_", "index_fill_",
        "numpy",
    }
)  # fmt: skip
DTYPE_PRESERVING_ATTRIBUTES = frozenset({"data", "T", "mT", "H", "mH"})
# Copies and moves that keep a tensor's dtype and values: `buf.detach().cpu().to(dtype)` casts
# `buf`, `tensor.detach().clone()` is `tensor` as far as dtypes go.
DTYPE_KEEPING_COPIES = frozenset({"detach", "cpu", "cuda", "clone", "contiguous", "pin_memory"})

# Functions that read tensors from a file, with the dtype they were saved in.
TORCH_LOADERS = frozenset(
    {
        "torch.load",
        "torch.serialization.load",
        "pickle.load",
        "pickle.loads",
        "safetensors.torch.load_file",
        "safetensors.torch.load",
        # a tensor handed over by another library, engine or process keeps its maker's dtype
        *("torch.utils.dlpack.from_dlpack", "torch.from_dlpack"),
    }
)
# safetensors' loaders always return a dict of tensors, never one tensor.
SAFETENSORS_DICT_LOADERS = frozenset({"safetensors.torch.load_file", "safetensors.torch.load"})
# Calls that write a tensor or a mapping of them to a file, with the place of the file among their
# positional arguments: what they write is a snapshot's storage format.
SAVERS: dict[str, int] = {
    "torch.save": 1,
    "numpy.save": 0,
    "numpy.savez": 0,
    "numpy.savez_compressed": 0,
    "safetensors.torch.save_file": 1,
    "pickle.dump": 1,
}
NUMPY_LOADERS = frozenset(
    {
        "numpy.load",
        "numpy.fromfile",
        "numpy.frombuffer",
        "numpy.memmap",
        "numpy.lib.format.open_memmap",
    }
)
# numpy functions that make an array from another, keeping its dtype unless ``dtype=`` is given.
NUMPY_ARRAY_WRAPPERS = frozenset(
    {"numpy.array", "numpy.asarray", "numpy.ascontiguousarray", "numpy.copy", "numpy.asanyarray"}
)
# ``torch.frombuffer(raw, dtype=...)``: the bytes of a buffer (a file read, a socket, shared
# memory) read as ``dtype``.
TORCH_BUFFER_READERS = frozenset({"torch.frombuffer", "torch.from_file"})
NUMPY_FLOAT32_NAMES = frozenset({"numpy.float32", "numpy.single"})
NUMPY_FLOAT32_STRINGS = frozenset({"float32", "f4", "<f4"})
# numpy methods whose result keeps the array's origin (a file read stays a file read).
NUMPY_ORIGIN_PRESERVING_METHODS = frozenset({"copy", "reshape", "squeeze", "transpose"})
# Names of parameters and attributes that hold a checkpoint's contents.
CHECKPOINT_SUFFIXES = ("state_dict", "checkpoint", "ckpt")

# Legacy tensor type names (``x.type("torch.cuda.HalfTensor")``) and the dtype they mean.
TENSOR_TYPE_DTYPES = {
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "DoubleTensor": "float64",
    "ByteTensor": "uint8",
    "CharTensor": "int8",
    "ShortTensor": "int16",
    "IntTensor": "int32",
    "LongTensor": "int64",
    "BoolTensor": "bool",
}
FLOAT32_TENSOR_TYPE = "FloatTensor"

# Annotations that say what a parameter holds (for ``x.to(param)``).
TENSOR_ANNOTATIONS = frozenset({"torch.Tensor", "Tensor", "torch.nn.Parameter", "nn.Parameter"})
DEVICE_ANNOTATIONS = frozenset({"torch.device", "device", "str", "int"})
DTYPE_ANNOTATIONS = frozenset({"torch.dtype", "dtype"})

# Elementwise torch functions whose result has their first argument's dtype (``dtype=``, where a
# function takes one, casts instead).
TORCH_ELEMENTWISE_FUNCTIONS = frozenset(
    f"torch.{name}"
    for name in (
        "exp", "log", "log1p", "expm1", "neg", "negative", "abs", "sqrt", "rsqrt", "sigmoid",
        "tanh", "clamp", "clip", "clamp_min", "clamp_max", "cumsum", "cumprod", "logcumsumexp",
        "flip", "roll", "narrow", "squeeze", "unsqueeze", "reshape", "flatten", "transpose",
        "permute", "movedim", "softmax", "log_softmax", "nan_to_num", "contiguous",
        "nn.functional.logsigmoid", "nn.functional.softplus", "nn.functional.silu",
        "nn.functional.relu", "nn.functional.sigmoid", "nn.functional.elu",
        "nn.functional.pad", "nn.functional.softmax", "nn.functional.log_softmax",
        "nn.functional.normalize",
    )
)  # fmt: skip
# Elementwise tensor methods of the same kind (``g.exp()``, ``g.cumsum(-1)``).
ELEMENTWISE_METHODS = frozenset(
    {
        "exp", "log", "log1p", "expm1", "neg", "negative", "abs", "sqrt", "rsqrt", "sigmoid",
        "tanh", "clamp", "clip", "clamp_min", "clamp_max", "cumsum", "cumprod", "softmax",
        "log_softmax", "nan_to_num", "exp_", "log_", "neg_", "abs_", "sigmoid_", "clamp_",
        "clamp_min_", "clamp_max_", "mul_", "add_", "sub_", "div_", "masked_scatter_",
    }
)  # fmt: skip
# torch functions and tensor methods that combine tensors elementwise: the result has the
# promoted dtype of the tensor operands (Python numbers do not change a floating dtype).
TORCH_BINARY_FUNCTIONS: dict[str, tuple[int, ...]] = {
    **{
        f"torch.{name}": (0, 1)
        for name in (
            "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide",
            "maximum", "minimum", "fmax", "fmin", "pow", "logaddexp", "lerp",
        )
    },
    "torch.where": (1, 2),
}  # fmt: skip
BINARY_METHODS = frozenset(
    {"add", "sub", "subtract", "mul", "multiply", "div", "divide", "maximum", "minimum", "pow"}
)
# torch functions that join a sequence of tensors into one, with the promoted dtype of the parts.
TORCH_CONCATENATIONS = frozenset(
    f"torch.{name}"
    for name in (
        "cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "row_stack",
        "column_stack",
    )
)  # fmt: skip
# Floating dtypes by promotion rank: two different ones of the lower ranks meet at float32.
FLOATING_RANK = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
# ``functools.partial``: a callable with some arguments fixed (``partial(torch.zeros, dtype=t)``).
PARTIALS = frozenset({"functools.partial"})
