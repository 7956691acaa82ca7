"""Names that look like a gate cache but are not a tensor, learned from how the module uses them.

``self.g_cache`` may be a compiled-graph cache: a dict filled with ``self.g_cache[batch] = graph``,
read with ``self.g_cache.get(batch)`` and emptied with ``self.g_cache.clear()``. A tensor has no
``get``, ``clear``, ``keys``, ``items``, ``setdefault`` or ``move_to_end``, so a singular gate-cache
name the module calls one of those on is a mapping, not a ring, and its bindings are not gate
caches. Plural names (``g_caches``) are collections of rings by name, and keep being checked.

The mapping is the class's own: a module whose ``GraphRunner`` keeps compiled graphs in
``self.g_cache`` may hold a ``KDAStatePool`` whose ``self.g_cache`` is a ring, so a binding in a
class is a mapping's only when that class (or code outside every class) uses the name as one.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.syntax.nodes import binding_name, literal_string, positional_args
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

MappingUses = dict[str, frozenset[int] | None]
"""Per gate-cache name used as a mapping, the ``id`` of each class that uses it so; None when
code outside every class does."""

# methods of dicts (and ordered, default, weak dicts) that no tensor has (`values()` is also a
# sparse tensor's)
MAPPING_METHODS = frozenset(
    {"get", "clear", "keys", "items", "setdefault", "popitem", "move_to_end", "update"}
)


# `<name>.<method>(` and the string literal it may start with, read from the module's text
_MAPPING_USE = re.compile(
    r"\b([A-Za-z_]\w*)\s*\.\s*(" + "|".join(sorted(MAPPING_METHODS)) + r")\s*\(\s*"
    r"(?:[rbuRBU]?(['\"])(.*?)\3)?"
)


def mapping_names(index: ModuleIndex) -> frozenset[str]:
    """Singular gate-cache names that the module uses as a mapping."""
    if index.source is not None:
        return _mapping_names_in_text(index.source, index)
    names = index.gate_caches
    found: set[str] = set()
    for method in sorted(MAPPING_METHODS):
        for call in index.calls_named(method):
            func = call.func
            if not isinstance(func, cst.Attribute) or isinstance(func.value, cst.Call):
                continue
            name = binding_name(func.value)
            if name is None or not names.matches(name) or names.is_plural(name):
                continue
            args = positional_args(call)
            key = literal_string(args[0].value) if args else None
            # `caches.get("g_cache")` reads a gate cache out of a dict of rings
            if key is None or not names.matches(key):
                found.add(name)
    return frozenset(found)


def _mapping_names_in_text(source: str, index: ModuleIndex) -> frozenset[str]:
    """:func:`mapping_names` from the text (no walk of the tree): ``self.g_cache.get(bs)``."""
    names = index.gate_caches
    found: set[str] = set()
    for match in _MAPPING_USE.finditer(source):
        name, key = match.group(1), match.group(4)
        if not names.matches(name) or names.is_plural(name):
            continue
        if key is None or not names.matches(key):
            found.add(name)
    return frozenset(found)


def mapping_uses(prov: Provenance) -> MappingUses:
    """Where the module uses each of its mapping names (see :data:`MappingUses`)."""
    names = mapping_names(prov.index)
    if not names:
        return {}
    uses: dict[str, set[int] | None] = {name: set() for name in names}
    classes = prov.index.classes()
    for method in sorted(MAPPING_METHODS):
        for call in prov.index.calls_named(method):
            func = call.func
            name = binding_name(func.value) if isinstance(func, cst.Attribute) else None
            if name not in uses:
                continue
            owners = {id(cls) for cls in classes if prov.within(call, cls)}
            known = uses[name]
            uses[name] = None if not owners or known is None else known | owners
    return {name: None if found is None else frozenset(found) for name, found in uses.items()}


def used_as_mapping(uses: MappingUses, name: str, site: Site | None) -> bool:
    """Whether a binding of ``name`` at ``site`` is one of a mapping (see the module docstring)."""
    if name not in uses:
        return False
    classes = uses[name]
    owners = (
        {id(scope) for scope in site.scopes if isinstance(scope, cst.ClassDef)} if site else set()
    )
    return classes is None or not owners or bool(owners & classes)
