"""Names that look like a gate cache but are not a tensor, learned from how the module uses them.

``self.g_cache`` may be a compiled-graph cache: a dict filled with ``self.g_cache[batch] = graph``,
read with ``self.g_cache.get(batch)`` and emptied with ``self.g_cache.clear()``. A tensor has no
``get``, ``clear``, ``keys``, ``items``, ``setdefault`` or ``move_to_end``, so a singular gate-cache
name the module calls one of those on is a mapping, not a ring, and its bindings are not gate
caches. Plural names (``g_caches``) are collections of rings by name, and keep being checked.

The mapping is the class's own: a module whose ``GraphRunner`` keeps compiled graphs in
``self.g_cache`` may hold a ``KDAStatePool`` whose ``self.g_cache`` is a ring, so a binding in a
class is a mapping's only when that class (or code outside every class) uses the name as one.
A local is its function's own: ``g_cache = torch.zeros(...)`` in one function is a ring even when
a class of the module keeps graphs in ``self.g_cache``, unless that function calls
``g_cache.get(...)`` itself; and a key of a dict literal outside every class
(``{"g_cache": ring}``) names a ring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.index import ModuleIndex
from replaylint.lint.syntax.nodes import binding_name, literal_string, positional_args
from replaylint.lint.syntax.sites import Site

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance


@dataclass(frozen=True)
class MappingUses:
    """Where the module uses each of its mapping names."""

    attributes: dict[str, frozenset[int] | None]
    """Per name used as ``<x>.<name>.get(...)``, the ``id`` of each class that uses it so; None
    when code outside every class does."""
    locals: dict[str, frozenset[int]]
    """Per name used as ``<name>.get(...)``, the ``id`` of each scope (function, class body,
    module) that does."""


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
    """Where the module uses each of its mapping names (see :class:`MappingUses`)."""
    names = mapping_names(prov.index)
    if not names:
        return MappingUses({}, {})
    attributes: dict[str, set[int] | None] = {}
    locals_: dict[str, set[int]] = {}
    classes = prov.index.classes()
    sites = prov.index.call_sites()
    for method in sorted(MAPPING_METHODS):
        for call in prov.index.calls_named(method):
            func = call.func
            receiver = func.value if isinstance(func, cst.Attribute) else None
            name = binding_name(receiver) if receiver is not None else None
            if name not in names:
                continue
            if isinstance(receiver, cst.Name):
                site = sites.get(id(call))
                scope = site.scope if site is not None else prov.index.module
                locals_.setdefault(name, set()).add(id(scope))
                continue
            owners = {id(cls) for cls in classes if prov.within(call, cls)}
            known = attributes.setdefault(name, set())
            attributes[name] = None if not owners or known is None else known | owners
    return MappingUses(
        {name: None if found is None else frozenset(found) for name, found in attributes.items()},
        {name: frozenset(found) for name, found in locals_.items()},
    )


def used_as_mapping(
    uses: MappingUses, name: str, site: Site | None, display: str | None = None
) -> bool:
    """Whether a binding of ``name`` at ``site``, written ``display`` (``g_cache``,
    ``self.g_cache``, ``"g_cache"``), is one of a mapping (see the module docstring)."""
    if display is not None and display.isidentifier():  # a local (or global) of its scope
        scopes = uses.locals.get(name, frozenset())
        return site is not None and id(site.scope) in scopes
    if name not in uses.attributes:
        return False
    classes = uses.attributes[name]
    owners = (
        {id(scope) for scope in site.scopes if isinstance(scope, cst.ClassDef)} if site else set()
    )
    if not owners and display is not None and display[:1] in {"'", '"'}:
        return False  # a key of a dict outside every class: a dict of rings
    return classes is None or not owners or bool(owners & classes)
