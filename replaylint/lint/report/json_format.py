"""ruff-compatible JSON: one array, one object per finding."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from replaylint.lint.model import FileReport, Finding, Location
from replaylint.lint.rules.catalogue import RULE_NAMES, rule_url


def _location(location: Location) -> dict[str, int]:
    return {"row": location.row, "column": location.column}


def _filename(name: str) -> str:
    return name if name.startswith("<") or name == "-" else os.path.abspath(name)


def finding_to_json(finding: Finding) -> dict[str, Any]:
    fix = finding.fix
    return {
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
        "url": rule_url(finding.code) if finding.code in RULE_NAMES else None,
    }


def render_json(reports: Sequence[FileReport]) -> str:
    findings = [finding_to_json(f) for report in reports for f in report.findings]
    return json.dumps(findings, indent=2) + "\n"
