"""SARIF 2.1.0, for GitHub code scanning and other SARIF consumers.

Files that could not be linted are ``invocations[0].toolExecutionNotifications`` (with
``executionSuccessful: false``), not results: they are not findings of a rule.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from replaylint._project import PROJECT_URL
from replaylint._version import __version__
from replaylint.lint.model import FileReport, Finding, Location
from replaylint.lint.report.errors import FileError, file_errors

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _region(start: Location, end: Location) -> dict[str, int]:
    return {
        "startLine": start.row,
        "startColumn": start.column,
        "endLine": end.row,
        "endColumn": end.column,
    }


def _artifact(filename: str) -> dict[str, str]:
    path = Path(filename)
    if path.is_absolute():
        return {"uri": path.as_uri()}
    # A URI reference: spaces, `#`, `%` and non-ASCII characters must be percent-encoded.
    return {"uri": quote(path.as_posix()), "uriBaseId": "%SRCROOT%"}


def _result(finding: Finding, rule_index: dict[str, int]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": finding.code,
        "ruleIndex": rule_index[finding.code],
        "level": "error",
        "message": {"text": finding.message},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": _artifact(finding.filename),
                    "region": _region(finding.location, finding.end_location),
                }
            }
        ],
    }
    if finding.fix is not None:
        result["fixes"] = [
            {
                "description": {"text": finding.fix.message},
                "artifactChanges": [
                    {
                        "artifactLocation": _artifact(finding.filename),
                        "replacements": [
                            {
                                "deletedRegion": _region(edit.location, edit.end_location),
                                "insertedContent": {"text": edit.content},
                            }
                            for edit in finding.fix.edits
                        ],
                    }
                ],
            }
        ]
    return result


def _notification(error: FileError) -> dict[str, Any]:
    region: dict[str, int] = {}
    if error.has_position:
        region = {"startLine": error.location.row, "startColumn": error.location.column}
    physical: dict[str, Any] = {"artifactLocation": _artifact(error.filename)}
    if region:
        physical["region"] = region
    return {
        "level": "error",
        "message": {"text": error.message},
        "locations": [{"physicalLocation": physical}],
    }


def render_sarif(reports: Sequence[FileReport]) -> str:
    # The rules' full documentation is only here: import them (and libcst) only for this format.
    from replaylint.lint.rules.registry import ALL_RULES

    rules = [
        {
            "id": rule.CODE,
            "name": rule.NAME,
            "shortDescription": {"text": rule.SUMMARY},
            "fullDescription": {"text": rule.RATIONALE},
            "help": {"text": rule.FIX, "markdown": rule.FIX},
            "helpUri": rule.url(),
            "defaultConfiguration": {"level": "error"},
        }
        for rule in ALL_RULES
    ]
    rule_index = {rule.CODE: position for position, rule in enumerate(ALL_RULES)}
    notifications = [_notification(error) for error in file_errors(reports)]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "replaylint",
                        "version": __version__,
                        "informationUri": PROJECT_URL,
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri() + "/"}},
                # Our columns count characters; SARIF's default is UTF-16 code units.
                "columnKind": "unicodeCodePoints",
                "invocations": [
                    {
                        "executionSuccessful": not notifications,
                        "toolExecutionNotifications": notifications,
                    }
                ],
                "results": [_result(f, rule_index) for report in reports for f in report.findings],
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"
