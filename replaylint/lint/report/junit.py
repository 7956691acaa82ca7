"""JUnit XML, as CI systems (GitLab, Jenkins, Azure Pipelines) read test reports.

One ``<testsuite>`` per file with findings; each finding is a ``<testcase>`` with a ``<failure>``,
and a file that could not be linted is a test case with an ``<error>``. A run with neither is one
passing test case, so the report always holds a test. Counts on ``<testsuites>`` and
``<testsuite>`` add up, as the consumers check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from xml.etree import ElementTree

from replaylint.lint.model import FileReport
from replaylint.lint.report.errors import parse_error

# Characters XML 1.0 cannot hold, even escaped.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    return _NOT_XML.sub("\ufffd", value)


def _suite(report: FileReport) -> ElementTree.Element | None:
    if not report.findings and report.error is None:
        return None
    name = _text(report.filename)
    suite = ElementTree.Element("testsuite", name=name)
    failures = errors = 0
    for f in report.findings:
        where = f"{f.location.row}:{f.location.column}"
        case = ElementTree.SubElement(
            suite,
            "testcase",
            name=f"{f.code} at {where}",
            classname=name,
            file=name,
            line=str(f.location.row),
        )
        failure = ElementTree.SubElement(case, "failure", message=_text(f.message), type=f.code)
        failure.text = f"{name}:{where}: {f.code} {_text(f.message)}"
        failures += 1
    error = parse_error(report)
    if error is not None:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            name="replaylint",
            classname=name,
            file=name,
            line=str(error.location.row),
        )
        element = ElementTree.SubElement(case, "error", message=_text(error.message), type="error")
        element.text = _text(report.error or "")
        errors += 1
    suite.attrib.update(
        tests=str(failures + errors), failures=str(failures), errors=str(errors), skipped="0"
    )
    return suite


def render_junit(reports: Sequence[FileReport]) -> str:
    root = ElementTree.Element("testsuites", name="replaylint")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    suites = [suite for suite in map(_suite, reports) if suite is not None]
    if not suites:
        clean = ElementTree.Element("testsuite", name="replaylint")
        ElementTree.SubElement(clean, "testcase", name="no findings", classname="replaylint")
        clean.attrib.update(tests="1", failures="0", errors="0", skipped="0")
        suites.append(clean)
    for suite in suites:
        root.append(suite)
        for key in totals:
            totals[key] += int(suite.attrib[key])
    root.attrib.update({key: str(value) for key, value in totals.items()})
    ElementTree.indent(root)
    body = ElementTree.tostring(root, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'
