"""Library calls that apply one function to every tensor of a nested container.

``torch.utils._pytree.tree_map(lambda t: t.to(dtype), rings)``, optree's and dm-tree's maps,
Lightning's ``apply_to_collection(rings, torch.Tensor, lambda t: t.half())`` and Accelerate's
``recursively_apply(fn, rings)`` give back a container of the same shape and keys, each tensor
passed through the function. The function never sees a key: whatever it does to one ring it
does to all of them, the gate ring included.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from replaylint.lint.dataflow.index import ModuleIndex

__all__ = ["TreeMap", "tree_map_of"]

# the libraries whose maps are known, by the first part of their dotted names
_LIBRARIES = frozenset(
    {"torch", "optree", "tree", "jax", "lightning_utilities", "lightning", "pytorch_lightning",
     "lightning_fabric", "accelerate"}
)  # fmt: skip
# a map's name -> the places of (the function, the container) among its positional arguments,
# and the keywords that may pass them instead
_MAPS: dict[str, tuple[int, int, frozenset[str], frozenset[str]]] = {
    "tree_map": (0, 1, frozenset({"func", "fn", "f"}), frozenset({"tree", "pytree"})),
    "tree_map_only": (1, 2, frozenset({"func", "fn", "f"}), frozenset({"tree", "pytree"})),
    "map_structure": (0, 1, frozenset({"func", "fn", "f"}), frozenset({"structure"})),
    "apply_to_collection": (2, 0, frozenset({"function"}), frozenset({"data"})),
    "recursively_apply": (0, 1, frozenset({"func"}), frozenset({"data"})),
}


@dataclass(frozen=True)
class TreeMap:
    """One call of a library map: its name, the one-parameter lambda it applies (its parameter
    and body) and the container it walks."""

    name: str
    parameter: str
    body: cst.BaseExpression
    tree: cst.BaseExpression


def tree_map_of(index: ModuleIndex, call: cst.Call) -> TreeMap | None:
    """``call`` as a library map of a one-parameter lambda over a container; None for anything
    else (a named function passed in is not read)."""
    found = _map_name(index, call.func)
    if found is None:
        return None
    function_at, tree_at, function_words, tree_words = _MAPS[found]
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    if any(arg.star for arg in call.args):
        return None
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    function = _argument(positional, keywords, function_at, function_words)
    tree = _argument(positional, keywords, tree_at, tree_words)
    if not isinstance(function, cst.Lambda) or tree is None:
        return None
    parameters = function.params
    plain = parameters.params
    if (
        len(plain) != 1
        or parameters.posonly_params
        or parameters.kwonly_params
        or not isinstance(parameters.star_arg, cst.MaybeSentinel)
        or parameters.star_kwarg is not None
    ):
        return None
    return TreeMap(found, plain[0].name.value, function.body, tree)


def _map_name(index: ModuleIndex, func: cst.BaseExpression) -> str | None:
    for qualified in index.imported_names(func):
        root, _, rest = qualified.partition(".")
        last = qualified.rpartition(".")[2]
        if root in _LIBRARIES and rest and last in _MAPS:
            return last
    return None


def _argument(
    positional: list[cst.BaseExpression],
    keywords: dict[str, cst.BaseExpression],
    place: int,
    words: frozenset[str],
) -> cst.BaseExpression | None:
    if place < len(positional):
        return positional[place]
    return next((keywords[word] for word in sorted(words) if word in keywords), None)
