"""GitLab Code Quality: a JSON array of issues, as GitLab's merge-request widget reads them.

Each issue has GitLab's required fields: ``description``, ``check_name``, ``fingerprint``,
``severity`` and ``location`` (``path`` relative to the project, ``lines.begin``). Paths are made
relative to ``$CI_PROJECT_DIR`` when GitLab sets it, else to the working directory. A fingerprint
is stable across runs and line moves: the file, the rule, the message and which occurrence of that
triple it is. A file that could not be linted is an issue too (``check_name``
``replaylint/could-not-lint``), so that the report does not look clean.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replaylint.lint.model import FileReport
from replaylint.lint.report.errors import parse_error
from replaylint.lint.rules.catalogue import RULE_NAMES

ERROR_CHECK = "replaylint/could-not-lint"


def _project_path(filename: str) -> str:
    base = Path(os.environ.get("CI_PROJECT_DIR") or Path.cwd()).absolute()
    path = Path(filename).absolute()
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return (
            Path(os.path.relpath(path, base)).as_posix() if path.anchor == base.anchor else filename
        )


def _issue(
    seen: Counter[tuple[str, str, str]],
    path: str,
    check: str,
    description: str,
    severity: str,
    begin: int,
    end: int,
) -> dict[str, Any]:
    key = (path, check, description)
    seen[key] += 1
    material = "\0".join([*key, str(seen[key])])
    return {
        "type": "issue",
        "check_name": check,
        "description": description,
        "categories": ["Bug Risk"],
        "severity": severity,
        "fingerprint": hashlib.sha256(material.encode("utf-8")).hexdigest(),
        "location": {"path": path, "lines": {"begin": begin, "end": end}},
    }


def render_gitlab(reports: Sequence[FileReport]) -> str:
    seen: Counter[tuple[str, str, str]] = Counter()
    issues = []
    for report in reports:
        for f in report.findings:
            name = RULE_NAMES.get(f.code)
            check = f"{f.code} {name}" if name else f.code
            issues.append(
                _issue(
                    seen,
                    _project_path(f.filename),
                    check,
                    f"{f.code}: {f.message}",
                    "major",
                    f.location.row,
                    f.end_location.row,
                )
            )
        error = parse_error(report)
        if error is not None:
            row = error.location.row
            issues.append(
                _issue(
                    seen,
                    _project_path(error.filename),
                    ERROR_CHECK,
                    error.message,
                    "critical",
                    row,
                    row,
                )
            )
    return json.dumps(issues, indent=2) + "\n"
