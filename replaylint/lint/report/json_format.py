"""ruff-compatible JSON: one array, one object per finding, with ruff's fields.

A file that could not be linted is an entry too, as ruff reports a syntax error: ``code`` and
``url`` are null and ``message`` says what went wrong (docs/output-formats.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from replaylint.lint.model import FileReport, Finding, Location
from replaylint.lint.report.errors import FileError, file_errors
from replaylint.lint.rules.catalogue import RULE_NAMES, rule_url


def _location(location: Location) -> dict[str, int]:
    return {"row": location.row, "column": location.column}


def _filename(name: str) -> str:
    return name if name.startswith("<") or name == "-" else os.path.abspath(name)


def finding_to_json(finding: Finding) -> dict[str, Any]:
    fix = finding.fix
    return {
        "cell": None,  # notebooks are not linted
        "code": finding.code,
        "message": finding.message,
        "filename": _filename(finding.filename),
        "location": _location(finding.location),
        "end_location": _location(finding.end_location),
        "fix": None
        if fix is None
        else {
            "applicability": fix.applicability.value,
            "message": fix.message,
            "edits": [
                {
                    "content": edit.content,
                    "location": _location(edit.location),
                    "end_location": _location(edit.end_location),
                }
                for edit in fix.edits
            ],
        },
        # The row a suppression comment goes on (any row of the statement works).
        "noqa_row": finding.location.row,
        "url": rule_url(finding.code) if finding.code in RULE_NAMES else None,
    }


def error_to_json(error: FileError) -> dict[str, Any]:
    return {
        "cell": None,
        "code": None,
        "message": error.message,
        "filename": _filename(error.filename),
        "location": _location(error.location),
        "end_location": _location(error.location),
        "fix": None,
        "noqa_row": None,
        "url": None,
    }


def render_json(reports: Sequence[FileReport]) -> str:
    entries: list[dict[str, Any]] = []
    for report in reports:  # in path order, a file's error where its findings would be
        entries.extend(finding_to_json(f) for f in report.findings)
        entries.extend(error_to_json(error) for error in file_errors([report]))
    return json.dumps(entries, indent=2) + "\n"
