"""Decode entry points: the calls whose gate-cache argument is checked and teaches names."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True)
class EntryPoint:
    """A ReplaySSM decode entry point and where its gate-cache argument goes.

    ``function`` is a glob matched against the called name: its last part (``ops.foo_decode`` ->
    ``foo_decode``), or the whole dotted name when the pattern contains a dot.
    """

    function: str
    parameter: str = "g_cache"
    index: int | None = 9

    def matches(self, dotted_name: str) -> bool:
        subject = dotted_name if "." in self.function else dotted_name.rpartition(".")[2]
        return fnmatch.fnmatchcase(subject, self.function)


DEFAULT_ENTRY_POINTS: tuple[EntryPoint, ...] = (EntryPoint("*replayssm_decode", "g_cache", 9),)
