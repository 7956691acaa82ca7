"""Dtypes spelled as strings in configuration: ``"bf16"``, ``"bfloat16"``, ``"torch.float16"``,
Composer's ``"amp_bf16"``, and OmegaConf / Hydra interpolations (``"${dtype}"``,
``"${decode_cache.ring_dtype}"``, ``"${.ring_dtype}"``) resolved inside the dict literal that
holds them.

Config defaults are written as nested dict literals whose leaves are strings; the code that reads
them (``dtype_from_str(cfg.gate_dtype)``) is a table the analysis need not know, since the
spelling names the dtype. An interpolation is followed to the entry it names (absolute from the
outermost literal, or relative with leading dots, as OmegaConf resolves them), at most a few
steps; anything else (a resolver ``${oc.env:...}``, a key the literal does not hold) is unknown.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from replaylint.lint.syntax.nodes import literal_string

__all__ = ["ConfigEntry", "config_entries", "float32_spelling", "string_dtype"]

_MAX_STEPS = 8
_INTERPOLATION = re.compile(r"^\$\{(?P<path>\.*[A-Za-z_][\w.]*)\}$")
_NAMES: dict[str, str] = {
    **dict.fromkeys(("fp32", "f32", "float32", "float", "single"), "float32"),
    **dict.fromkeys(("bf16", "bfloat16"), "bfloat16"),
    **dict.fromkeys(("fp16", "f16", "float16", "half"), "float16"),
    **dict.fromkeys(("fp64", "f64", "float64", "double"), "float64"),
}


def string_dtype(text: str) -> str | None:
    """The floating dtype a string names (``"bf16"``, ``"torch.bfloat16"``, ``"amp_fp16"``);
    None for anything else (``"auto"``, ``"int8"``)."""
    name = text.strip().lower()
    for prefix in ("torch.", "amp_"):
        name = name.removeprefix(prefix)
    return _NAMES.get(name)


def float32_spelling(text: str) -> str:
    """float32 spelled like ``text``: ``"bf16"`` -> ``"fp32"``, ``"torch.half"`` ->
    ``"torch.float32"``, ``"bfloat16"`` -> ``"float32"``."""
    name = text.strip()
    prefix = "torch." if name.lower().startswith("torch.") else ""
    short = (
        re.fullmatch(r"(?:amp_)?(?:bf|fp|f)\d+", name.lower().removeprefix("torch.")) is not None
    )
    return prefix + ("fp32" if short and not prefix else "float32")


@dataclass(frozen=True)
class ConfigEntry:
    """An entry of a config literal: its key, its value, and the dtype a string value names."""

    key: str
    value: cst.BaseExpression
    dtype: str | None
    """The dtype the string names, through its interpolations; None when not a known string."""
    through: tuple[str, ...] = ()
    """The interpolations followed, in order (``"${dtype}"``)."""


def config_entries(root: cst.Dict) -> Iterator[ConfigEntry]:
    """Every string-keyed entry of ``root`` and of the dict literals nested in it."""
    for path, key, value in _entries(root, ()):
        dtype, through = _resolve(root, path, value, 0)
        yield ConfigEntry(key, value, dtype, through)


def _entries(
    mapping: cst.Dict, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], str, cst.BaseExpression]]:
    """(path of the mapping holding it, key, value) of every entry, depth first."""
    for element in mapping.elements:
        if not isinstance(element, cst.DictElement):
            continue
        key = literal_string(element.key)
        if key is None:
            continue
        yield path, key, element.value
        if isinstance(element.value, cst.Dict):
            yield from _entries(element.value, (*path, key))


def _resolve(
    root: cst.Dict, path: tuple[str, ...], value: cst.BaseExpression, steps: int
) -> tuple[str | None, tuple[str, ...]]:
    text = literal_string(value)
    if text is None or steps > _MAX_STEPS:
        return None, ()
    found = _INTERPOLATION.match(text)
    if found is None:
        return string_dtype(text), ()
    reference = found.group("path")
    dots = len(reference) - len(reference.lstrip("."))
    keys = reference[dots:].split(".")
    # `${a.b}` is absolute; `${.b}` is a sibling, each further dot one level up
    base = path[: max(len(path) - (dots - 1), 0)] if dots else ()
    if dots and dots - 1 > len(path):
        return None, ()
    target = _lookup(root, (*base, *keys))
    if target is None:
        return None, ()
    dtype, through = _resolve(root, (*base, *keys[:-1]), target, steps + 1)
    return (dtype, (text, *through)) if dtype is not None else (None, ())


def _lookup(root: cst.Dict, keys: tuple[str, ...]) -> cst.BaseExpression | None:
    """The value at ``keys`` in nested dict literals; None when a key is missing or repeated."""
    current: cst.BaseExpression = root
    for key in keys:
        if not isinstance(current, cst.Dict):
            return None
        values = [
            e.value
            for e in current.elements
            if isinstance(e, cst.DictElement) and literal_string(e.key) == key
        ]
        if len(values) != 1 or any(isinstance(e, cst.StarredDictElement) for e in current.elements):
            return None  # a repeated key, or a spread that may override it
        current = values[0]
    return current
