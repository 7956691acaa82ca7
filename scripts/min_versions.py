"""Print the oldest admitted version of each base dependency, one pip requirement a line.

``libcst>=1.5,<2`` becomes ``libcst==1.5``; an environment marker is kept
(``tomli==2.0; python_version < "3.11"``). A dependency without a ``>=`` floor is an error: the
minimum-versions job could not test it.

Usage: ``python scripts/min_versions.py pyproject.toml``
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*([^;]*?)\s*(?:;\s*(.+))?$")


def minimum_pins(dependencies: list[str]) -> list[str]:
    pins = []
    for dependency in dependencies:
        match = _REQUIREMENT.match(dependency)
        if match is None:
            raise SystemExit(f"cannot read the requirement {dependency!r}")
        name, specifiers, marker = match.groups()
        floors = [
            s.strip()[2:].strip() for s in specifiers.split(",") if s.strip().startswith(">=")
        ]
        if len(floors) != 1:
            raise SystemExit(f"{dependency!r}: give it one `>=` floor so that it can be tested")
        pins.append(f"{name}=={floors[0]}" + (f"; {marker}" if marker else ""))
    return pins


def main(argv: list[str]) -> int:
    path = Path(argv[1] if len(argv) > 1 else "pyproject.toml")
    with path.open("rb") as handle:
        project = tomllib.load(handle)["project"]
    print("\n".join(minimum_pins(list(project["dependencies"]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
