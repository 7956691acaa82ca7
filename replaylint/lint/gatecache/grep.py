"""Which files contain any of a few needles, ASCII case ignored: the pre-filter's first stage for
a whole tree at once.

In Python, reading, lower-casing and searching a 1.8-million-line tree costs most of a second; a
``grep -F -i -l`` over the same files does it several times faster (a multi-needle search in C,
the reading included), and a few grep processes use every core. Answers are identical: the needles
are ASCII and grep runs in the C locale, where ``-i`` folds exactly the ASCII letters, as
``bytes.lower`` does. Where grep is missing or reports a problem, the files are searched in Python
instead (``tests/lint/test_prefilter.py`` checks that both agree).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["GrepSearch", "contains_needle", "files_containing"]

# Keep each command line well under ARG_MAX (at least 128 KiB on the systems we run on).
_ARGUMENT_BYTES = 96 * 1024


def contains_needle(raw: bytes, needles: Sequence[bytes]) -> bool:
    """``raw`` contains one of ``needles`` (lower-case ASCII), ASCII case ignored."""
    lowered = raw.lower()  # folds ASCII letters only, like grep -i in the C locale
    return any(needle in lowered for needle in needles)


def _python_contains(path: str, needles: Sequence[bytes]) -> bool:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError:
        return True  # unreadable here: let the caller read it and report the problem
    return contains_needle(raw, needles)


def _chunks(paths: Sequence[str], pieces: int) -> list[list[str]]:
    """Split ``paths`` into about ``pieces`` interleaved groups, each command line small enough."""
    total = sum(len(os.fsencode(p)) + 1 for p in paths)
    count = max(pieces, -(-total // _ARGUMENT_BYTES))
    return [list(paths[start::count]) for start in range(count) if paths[start::count]]


class GrepSearch:
    """grep processes searching groups of files, started at once and collected later, so that
    the caller can do other work (importing the analysis) while they run."""

    def __init__(
        self, grep: str, paths: Sequence[str], needles: Sequence[bytes], jobs: int
    ) -> None:
        self._needles = needles
        self._runs: list[tuple[list[str], subprocess.Popen[bytes] | None]] = []
        command = [grep, "-l", "-F", "-i", "-a", "-s", "--null"]
        for needle in needles:
            command += ["-e", os.fsdecode(needle)]
        environment = {**os.environ, "LC_ALL": "C"}
        for group in _chunks(paths, max(1, jobs)):
            try:
                process: subprocess.Popen[bytes] | None = subprocess.Popen(
                    [*command, "--", *group],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                    env=environment,
                )
            except OSError:
                process = None
            self._runs.append((group, process))

    def result(self) -> set[str]:
        """The paths (as given) of the files that contain a needle."""
        found: set[str] = set()
        for group, process in self._runs:
            if process is not None:
                output, _ = process.communicate()
                # 0: matches, 1: none; anything else (2: a file it could not read): redo in Python.
                if process.returncode in (0, 1):
                    found.update(os.fsdecode(name) for name in output.split(b"\0") if name)
                    continue
            found.update(p for p in group if _python_contains(p, self._needles))
        return found


def files_containing(paths: Sequence[str], needles: Sequence[bytes], jobs: int = 1) -> set[str]:
    """The paths of ``paths`` whose bytes contain one of ``needles`` (lower-case ASCII), ASCII
    case ignored. A file that cannot be read counts as containing one (its reader reports it)."""
    if not needles or not paths:
        return set()
    grep = shutil.which("grep")
    if grep is None:
        return {p for p in paths if _python_contains(p, needles)}
    return GrepSearch(grep, paths, needles, jobs).result()
