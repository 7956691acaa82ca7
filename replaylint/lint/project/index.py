"""The modules of a project, their summaries, and what a dotted name of one of them denotes.

:class:`ProjectIndex` knows each file's module name (from the folders with ``__init__.py`` above
it: a file in a package is ``pkg.sub.mod``; a file outside any package is its stem, so the project
root and a ``src/`` folder are both roots) and loads a module's summary
(:mod:`.summaries`) on first use through a loader (the batch run reads it from the result cache
or from disk). Two files with one module name make that name ambiguous: it resolves to nothing.

:meth:`ProjectIndex.resolve` turns ``pkg.policy.WIRE_DTYPE`` (or ``.policy.X`` from an importer)
into what it denotes: a definition of a project module, a module of the project, or a name
outside it (``torch.bfloat16``), following imports and re-exports (``from .policy import X`` in a
package's ``__init__``) with a bound on the chain and a guard against cycles. A
:class:`ProjectView` is one importer's window: its own module name, for relative imports. The
index records which modules' summaries were read (:meth:`ProjectIndex.take_used`): the results of
an analysis depend on exactly those files, and the result cache keys them on their digests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replaylint.lint.project.summaries import Definition, Summary, Value

if TYPE_CHECKING:
    from replaylint.lint.project.gate_buffers import ImportedGateBuffer

MAX_CHAIN = 8
"""Imports and aliases followed to reach one definition."""

SummaryLoader = Callable[[str], "tuple[Summary | None, str]"]
"""Reads the summary of the file at a path (None when it cannot be read or parsed) and the
file's content digest."""

ContentReader = Callable[[str], "tuple[bytes, str] | None"]
"""Reads the bytes of the file at a path and their digest (None when it cannot be read)."""


_METHOD_CALL = re.compile(rb"\.\s*([A-Za-z_]\w*)\s*\(")


@dataclass(frozen=True)
class Origin:
    """Where a definition is: ``pkg/policy.py:4`` names ``WIRE_DTYPE``."""

    name: str
    path: str
    line: int

    def describe(self) -> str:
        return f"`{self.name}` at {self.path}:{self.line}"


@dataclass(frozen=True)
class Found:
    """A definition of a project module (a constant, function or class), reached through
    ``origins`` (the aliases and re-exports followed, nearest first; the definition last)."""

    module: str
    name: str
    definition: Definition
    origins: tuple[Origin, ...]


@dataclass(frozen=True)
class External:
    """A dotted name outside the project (``torch.bfloat16``)."""

    name: str
    origins: tuple[Origin, ...] = ()


@dataclass(frozen=True)
class ModuleRef:
    """A module of the project."""

    module: str


Target = Found | External | ModuleRef | None


def module_names(paths: Iterable[str]) -> dict[str, str]:
    """Module name -> path for every Python file of ``paths``; names two files share dropped."""
    packages: dict[str, tuple[str, ...]] = {}

    def package_of(folder: str) -> tuple[str, ...]:
        """The package a folder is (``("pkg", "sub")``), or ``()`` when it has no ``__init__``."""
        known = packages.get(folder)
        if known is None:
            parent, name = os.path.split(folder)
            is_package = bool(name) and os.path.isfile(os.path.join(folder, "__init__.py"))
            known = packages[folder] = (*package_of(parent), name) if is_package else ()
        return known

    absolute: dict[str, str] = {}
    found: dict[str, str] = {}
    ambiguous: set[str] = set()
    for path in paths:
        if not path.endswith(".py"):
            continue
        folder, file = os.path.split(path)
        where = absolute.get(folder)
        if where is None:
            where = absolute[folder] = os.path.abspath(folder or ".")
        parts = package_of(where) + (() if file == "__init__.py" else (file[:-3],))
        if not parts or not all(part.isidentifier() for part in parts):
            continue
        name = ".".join(parts)
        if name in found and found[name] != path:
            ambiguous.add(name)
        found[name] = path
    for name in ambiguous:
        del found[name]
    return found


_FORWARD_DEPTH = 3  # hand-offs of a module to a caster of another module followed


@dataclass
class ProjectIndex:
    """Module names and summaries of one project's files."""

    modules: Mapping[str, str]
    """Module name -> path."""
    loader: SummaryLoader
    holder_names: frozenset[str] | None = None
    """Names of the project's classes that hold a gate buffer, when a run has found them all
    (:mod:`replaylint.lint.run.model_classes`): other imported names need no summary to say
    they hold none."""
    holder_bases: frozenset[str] = frozenset()
    """Names of the project classes those classes derive from (a mixin whose methods cast
    ``self`` casts a holder), found with ``holder_names``."""
    holder_buffers: frozenset[str] = frozenset()
    """The names of the gate buffers those classes hold, as registered."""
    record_names: frozenset[str] | None = None
    """Names of the project's classes that may be records, when a run has read every file
    (:mod:`replaylint.lint.run.record_classes`): a call of another imported name constructs
    none."""
    name_tables: frozenset[str] = frozenset()
    """Module constants of the project that list a gate cache's name
    (:mod:`replaylint.lint.run.name_tables`): a file mentioning one may make the gate cache in a
    loop over it."""
    holder_example: ImportedGateBuffer | None = None
    """One gate buffer such a class holds: what a cast of a module of unknown class is
    reported against."""
    reader: ContentReader | None = None
    """Reads a module's bytes: a question about one name then skips the summary (a parse) of a
    module whose text never spells the name."""
    _summaries: dict[str, tuple[Summary | None, str]] = field(default_factory=dict)
    _by_path: dict[str, str] = field(default_factory=dict)
    _used: dict[str, str] = field(default_factory=dict)
    _contents: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    _imported: dict[str, list[str]] = field(default_factory=dict)

    def module_of(self, path: str) -> str | None:
        """The module name of the file at ``path``, when it is one of the project's."""
        absolute = os.path.abspath(path)
        known = self._by_path.get(absolute)
        if known is None:
            names = module_names([absolute])  # the same name the project's listing gives it
            name = next(iter(names), "")
            listed = self.modules.get(name)
            known = self._by_path[absolute] = (
                name if listed is not None and os.path.abspath(listed) == absolute else ""
            )
        return known or None

    def is_package(self, module: str) -> bool:
        return os.path.basename(self.modules.get(module, "")) == "__init__.py"

    def summary(self, module: str) -> Summary | None:
        """The module's summary, loaded on first use; every read is recorded (:meth:`take_used`)."""
        path = self.modules.get(module)
        if path is None:
            return None
        loaded = self._summaries.get(module)
        if loaded is None:
            loaded = self._summaries[module] = self.loader(path)
        self._used[os.path.abspath(path)] = loaded[1]
        return loaded[0]

    def imported_list(self, module: str, attribute: str) -> bool:
        """Whether a project module that ``module`` imports from makes ``attribute`` a list (a
        class defined there keeps its rings in a list)."""
        summary = self.summary(module)
        if summary is None:
            return False
        for spec, _ in summary["imports"]:
            absolute = self.absolute(module, str(spec))
            if absolute is None or not self._may_spell(absolute, attribute):
                continue
            imported = self.summary(absolute)
            if imported is not None and attribute in imported.get("lists", ()):
                return True
        return False

    def imported_casters(
        self, module: str, name: str, depth: int = 0
    ) -> list[tuple[str, str, list[Any]]]:
        """``(module, "Class.name", [position, parameter, line, dtype])`` for the functions and
        methods called ``name`` of the project modules ``module`` imports from that cast a
        module they are handed (:mod:`.module_casters`), also by handing it on to a method of a
        module they import (``Fabric.setup`` calling ``self._precision.convert_module(module)``
        of a plugin class): then ``module`` and ``line`` are where the cast is."""
        found: list[tuple[str, str, list[Any]]] = []
        for other in self._imported_through_packages(module):
            if not self._may_spell(other, f"def {name}"):
                continue
            summary = self.summary(other) or {}
            for qualname, casts in summary.get("module_casters", {}).items():
                if qualname.rpartition(".")[2] == name:
                    found.extend((other, qualname, cast) for cast in casts)
            if depth >= _FORWARD_DEPTH:
                continue
            for qualname, handed in summary.get("module_forwards", {}).items():
                if qualname.rpartition(".")[2] != name:
                    continue
                for position, parameter, callee, place in handed:
                    found.extend(
                        (inner, qualname, [position, parameter, cast[2], cast[3]])
                        for inner, inner_name, cast in self.imported_casters(
                            other, str(callee), depth + 1
                        )
                        if "." in inner_name and place in (cast[0], cast[1])
                    )
        return found

    def _imported_through_packages(self, module: str) -> list[str]:
        """The project modules ``module`` imports from, and those the packages among them import
        from (``from pkg.lite import Fabric`` of a class ``pkg/lite/__init__.py`` re-exports)."""
        direct = self.imported_modules(module)
        found = dict.fromkeys(direct)
        for other in direct:
            path = self.modules.get(other)
            if path is not None and os.path.basename(path) == "__init__.py":
                found.update(dict.fromkeys(m for m in self.imported_modules(other) if m != module))
        return list(found)

    def calls_a_caster(self, module: str, text: str) -> bool:
        """Whether ``text`` (of ``module``) calls, by name, a function or method of a project
        module it imports from that casts a module it is handed."""
        for imported in self._imported_through_packages(module):
            summary = self.summary(imported) or {}
            casting = {q.rpartition(".")[2] for q in summary.get("module_casters", {})}
            handing = {q.rpartition(".")[2] for q in summary.get("module_forwards", {})}
            for name in casting | handing:
                if re.search(rf"\b{re.escape(name)}\s*\(", text) and (
                    name in casting or self.imported_casters(module, name)
                ):
                    return True
        return False

    def calls_method(self, name: str) -> bool:
        """Whether some module of the project calls a method ``name`` (``x.name(``); False when
        a module's text cannot be read. Every module's text is read, so the answer depends on
        each of them (recorded as used)."""
        pattern = re.compile(rb"\.\s*" + re.escape(name.encode()) + rb"\s*\(")
        found = False
        for path in self.modules.values():
            read = self._text(path)
            if read is None:
                return False
            self._used[os.path.abspath(path)] = read[1]
            found = found or pattern.search(read[0]) is not None
        return found

    def methods_called_in(self, module: str) -> frozenset[str] | None:
        """The names ``module``'s text calls as methods (``x.attach_caches(``); None when its
        text cannot be read."""
        path = self.modules.get(module)
        read = self._text(path) if path is not None else None
        if path is None or read is None:
            return None
        self._used[os.path.abspath(path)] = read[1]
        return frozenset(m.decode() for m in _METHOD_CALL.findall(read[0]))

    def imported_modules(self, module: str) -> list[str]:
        """The project modules ``module`` imports from (``from pkg import utils``: ``pkg`` and
        ``pkg.utils``), itself left out."""
        known = self._imported.get(module)
        if known is not None:
            self.summary(module)  # still a read of the importer's summary
            return known
        summary = self.summary(module)
        imported: dict[str, None] = {}
        for spec, item in summary["imports"] if summary is not None else ():
            absolute = self.absolute(module, str(spec))
            if absolute is None:
                continue
            if item is not None and f"{absolute}.{item}" in self.modules:
                imported[f"{absolute}.{item}"] = None
            if absolute in self.modules:
                imported[absolute] = None
        imported.pop(module, None)
        self._imported[module] = list(imported)
        return self._imported[module]

    def _may_spell(self, module: str, name: str) -> bool:
        """Whether ``module``'s text may spell ``name``. A module read here and found without it
        is recorded as used, by its digest, as a summary read would be."""
        path = self.modules.get(module)
        if path is None or module in self._summaries or self.reader is None:
            return True
        if not name.isascii():
            return True  # the module's encoding decides how it is spelled
        read = self._text(path)
        if read is None:
            return True  # the summary's loader reports what it can
        raw, content = read
        if name.encode() in raw:
            return True
        self._used[os.path.abspath(path)] = content
        return False

    def _text(self, path: str) -> tuple[bytes, str] | None:
        """A module's bytes and digest, read once per run; None when there is no reader or
        the file cannot be read."""
        absolute = os.path.abspath(path)
        read = self._contents.get(absolute)
        if read is None and self.reader is not None:
            read = self.reader(path)
            if read is not None:
                self._contents[absolute] = read
        return read

    def path_of(self, module: str) -> str:
        return self.modules.get(module, module)

    # ------------------------------------------------------------------ name resolution
    def absolute(self, importer: str, spec: str) -> str | None:
        """``..cfg`` imported in ``pkg.sub.mod`` -> ``pkg.cfg``; absolute names unchanged."""
        level = len(spec) - len(spec.lstrip("."))
        if level == 0:
            return spec
        parts = importer.split(".")
        if not self.is_package(importer):
            parts = parts[:-1]  # a module's package; a package's __init__ is its own
        if level - 1 > len(parts) or (level - 1 == len(parts) and not spec[level:]):
            return None
        base = parts[: len(parts) - (level - 1)]
        rest = spec[level:]
        return ".".join([*base, rest] if rest else base) or None

    def resolve(self, importer: str, dotted: str) -> Target:
        """What ``dotted`` (as the importer wrote it, through its imports) denotes."""
        head = dotted.lstrip(".")
        dots = dotted[: len(dotted) - len(head)]
        parts = head.split(".") if head else []
        # the longest prefix that is a module of the project
        for cut in range(len(parts), -1, -1):
            spec = dots + ".".join(parts[:cut])
            module = self.absolute(importer, spec) if spec else None
            if module is not None and module in self.modules:
                if self._shadowed(module):
                    return None  # the package binds the name too: which one wins depends on order
                target: Target = ModuleRef(module)
                for attribute in parts[cut:]:
                    target = self.attribute(target, attribute, ())
                return target
        if dots:
            return None
        return External(dotted)

    def attribute(
        self,
        target: Target,
        name: str,
        origins: tuple[Origin, ...],
        depth: int = 0,
    ) -> Target:
        """``target.name``: a submodule, a name of a module, or an external dotted name."""
        if isinstance(target, External):
            return External(f"{target.name}.{name}", target.origins)
        if isinstance(target, Found) and target.definition[0] == "class":
            return _class_constant(self, target, name)  # `ReplayCache.float_buffers`
        if not isinstance(target, ModuleRef):
            return None
        submodule = f"{target.module}.{name}"
        if submodule in self.modules:
            if self._shadowed(submodule):
                return None  # the package binds the name too: which one wins depends on order
            return ModuleRef(submodule)
        return self.lookup(target.module, name, origins, depth)

    def _shadowed(self, module: str) -> bool:
        """Whether ``module``'s package binds its name to something else than the submodule
        (``policy = torch.float32`` in ``pkg/__init__.py`` beside ``pkg/policy.py``)."""
        package, _, last = module.rpartition(".")
        summary = self.summary(package) if package in self.modules else None
        definition = None if summary is None else summary["names"].get(last)
        if definition is None:
            return False
        value = definition[2] if definition[0] == "value" else None
        if value is not None and value[0] == "ref" and value[2] == last:
            return self.absolute(package, str(value[1])) != package  # `from . import policy`
        return not (value is not None and value[0] == "module" and value[1] == module)

    def lookup(
        self,
        module: str,
        name: str,
        origins: tuple[Origin, ...] = (),
        depth: int = 0,
    ) -> Target:
        """The top-level ``name`` of ``module``, aliases and imports followed."""
        if depth > MAX_CHAIN:
            return None
        summary = self.summary(module)
        if summary is None:
            return None
        definition = summary["names"].get(name)
        if definition is None or definition[0] == "unknown":
            return None
        if name in summary["assigned"] or summary.get("writes_names", True):
            return None  # `sys.modules[__name__].X = ...`, `setattr(module, ...)`: not certain
        here = (*origins, Origin(name, self.path_of(module), int(definition[1])))
        if definition[0] != "value":
            return Found(module, name, definition, here)
        value: Value = definition[2]
        if value[0] in {"ref", "module", "name", "attr"}:
            # `import torch` is no origin worth naming; `WIRE = torch.bfloat16` is
            through = origins if value[0] == "module" else here
            target = self.value_target(module, value, through, depth + 1)
            if target is not None or value[0] != "attr":
                return target  # an import or alias that leads nowhere (or in a cycle): nothing
        return Found(module, name, definition, here)

    def value_target(
        self,
        module: str,
        value: Value,
        origins: tuple[Origin, ...],
        depth: int,
    ) -> Target:
        """What a name-like summary value of ``module`` denotes (None for other values)."""
        if depth > MAX_CHAIN:
            return None
        kind = value[0]
        if kind == "name":
            return self.lookup(module, str(value[1]), origins, depth)
        if kind == "module":
            spec = str(value[1])
            return ModuleRef(spec) if spec in self.modules else External(spec, origins)
        if kind == "ref":
            spec, name = str(value[1]), str(value[2])
            absolute = self.absolute(module, spec)
            if absolute is None:
                return None
            if absolute in self.modules:
                return self.attribute(ModuleRef(absolute), name, origins, depth)
            if spec.startswith("."):
                return None  # a relative module the project does not have
            return External(f"{absolute}.{name}", origins)
        if kind == "attr":
            base = self.value_target(module, value[1], origins, depth + 1)
            return self.attribute(base, str(value[2]), origins, depth)
        return None

    def take_used(self) -> tuple[tuple[str, str], ...]:
        """(path, content digest) of every module whose summary was read since the last call:
        what the results of the analysis just done depend on."""
        used = tuple(sorted(self._used.items()))
        self._used.clear()
        return used


@dataclass(frozen=True)
class ProjectView:
    """One importer's view of the project: its module name and the modules it may read."""

    index: ProjectIndex
    module: str

    @classmethod
    def of(cls, index: ProjectIndex, path: str) -> ProjectView | None:
        module = index.module_of(path)
        return None if module is None else cls(index, module)

    def resolve(self, dotted: str) -> Target:
        return self.index.resolve(self.module, dotted)


def _class_constant(index: ProjectIndex, cls: Found, name: str) -> Target:
    """A constant of a project class's body (``float_buffers = ("state", ...)``), read as a
    module-level value would be."""
    member = cls.definition[2].get(name) if isinstance(cls.definition[2], dict) else None
    if not (isinstance(member, list) and member and member[0] == "const"):
        return None
    here = (*cls.origins, Origin(name, index.path_of(cls.module), int(member[1])))
    return Found(cls.module, f"{cls.name}.{name}", ["value", member[1], member[2]], here)
