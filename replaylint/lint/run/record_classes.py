"""The names of the project's classes that may be records (dataclasses, NamedTuples), found
with a byte search before the analysis.

A construction of a record of ring dtypes imported from another module
(``RingDtypes(delta=d, key=d, gate=torch.float16)``) is read through that module's summary. Most
calls of imported names construct no record, and summarising their modules only to learn that
costs a cold run more than the rest of the question: so the run first lists the classes defined
in files that mention ``dataclass`` or ``NamedTuple``, and the analysis resolves only calls of
those names. A run that did not read every file knows no such list and resolves every call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from replaylint.lint.gatecache.grep import files_containing

_CLASS = re.compile(rb"^[ \t]*class[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
_NEEDLES = [b"dataclass", b"namedtuple"]


def record_class_names(
    paths: Sequence[Path], jobs: int, read: Callable[[Path], bytes | None]
) -> frozenset[str]:
    """Every class name defined in a file of ``paths`` that mentions ``dataclass`` or
    ``NamedTuple`` (a superset of the record classes; ASCII case ignored in the search)."""
    hits = files_containing([str(path) for path in paths], _NEEDLES, jobs)
    names: set[str] = set()
    for path in paths:
        if str(path) not in hits:
            continue
        raw = read(path)
        if raw is not None:
            names.update(match.decode("ascii") for match in _CLASS.findall(raw))
    return frozenset(names)
