"""``--output-format gitlab`` and ``junit``, checked against what their consumers read.

GitLab's Code Quality report: a JSON array whose issues each have ``description``,
``check_name``, ``fingerprint`` (unique in the report), ``severity`` (one of GitLab's five) and
``location.path`` (relative to the project) with ``location.lines.begin``; the schema below states
those rules. JUnit XML is read back with junitparser, as CI test-report readers do, and checked
for the counts they display.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
TWICE = BUGGY + "g_cache = torch.zeros(8, dtype=torch.bfloat16)\n"
BROKEN = "import torch\ndef (g_cache:\n"

GITLAB_CODE_QUALITY = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["description", "check_name", "fingerprint", "severity", "location"],
        "properties": {
            "description": {"type": "string", "minLength": 1},
            "check_name": {"type": "string", "minLength": 1},
            "fingerprint": {"type": "string", "minLength": 1},
            "severity": {"enum": ["info", "minor", "major", "critical", "blocker"]},
            "location": {
                "type": "object",
                "required": ["path", "lines"],
                "properties": {
                    "path": {"type": "string", "pattern": "^[^/]"},
                    "lines": {
                        "type": "object",
                        "required": ["begin"],
                        "properties": {"begin": {"type": "integer", "minimum": 1}},
                    },
                },
            },
        },
    },
}


def gitlab(run: RunCli, *args: str, cwd: Path | None = None) -> list[dict[str, Any]]:
    done = run("--output-format", "gitlab", "--select", "RL001", *args, cwd=cwd)
    assert done.returncode in (1, 2), done.stderr
    issues: list[dict[str, Any]] = json.loads(done.stdout)
    jsonschema.validate(issues, GITLAB_CODE_QUALITY)
    return issues


def test_gitlab_issues(run: RunCli, project: Path) -> None:
    (project / "pkg").mkdir()
    (project / "pkg" / "a.py").write_text(TWICE)
    issues = gitlab(run, "pkg")
    assert [(i["location"]["path"], i["location"]["lines"]["begin"]) for i in issues] == [
        ("pkg/a.py", 2),
        ("pkg/a.py", 3),
    ]
    assert issues[0]["check_name"] == "RL001 explicit-non-fp32-dtype"
    assert issues[0]["description"].startswith("RL001: gate cache `g_cache`")
    assert len({i["fingerprint"] for i in issues}) == 2  # same message twice: still unique


def test_gitlab_fingerprints_survive_moved_lines(run: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    before = gitlab(run, "a.py")
    (project / "a.py").write_text("# a comment above\n\n" + BUGGY)
    after = gitlab(run, "a.py")
    assert [i["fingerprint"] for i in before] == [i["fingerprint"] for i in after]
    assert after[0]["location"]["lines"]["begin"] == 4


def test_gitlab_paths_are_relative_to_the_gitlab_project(
    run: RunCli, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "src").mkdir()
    (project / "src" / "a.py").write_text(BUGGY)
    monkeypatch.setenv("CI_PROJECT_DIR", str(project))
    [issue] = gitlab(run, "a.py", cwd=project / "src")
    assert issue["location"]["path"] == "src/a.py"


def test_gitlab_reports_a_file_it_could_not_lint(run: RunCli, project: Path) -> None:
    (project / "broken.py").write_text(BROKEN)
    [issue] = gitlab(run, "broken.py")
    assert issue["check_name"] == "replaylint/could-not-lint"
    assert issue["severity"] == "critical"
    assert issue["location"] == {"path": "broken.py", "lines": {"begin": 2, "end": 2}}


def test_gitlab_clean_run_is_an_empty_report(run: RunCli, project: Path) -> None:
    (project / "a.py").write_text("x = 1\n")
    done = run("--output-format", "gitlab", "a.py")
    assert (done.returncode, done.stdout) == (0, "[]\n")


junitparser = pytest.importorskip("junitparser")


def junit(run: RunCli, project: Path, *args: str) -> Any:
    done = run("--output-format", "junit", "-o", "report.xml", "--select", "RL001", *args)
    assert done.stdout == ""
    return done.returncode, junitparser.JUnitXml.fromfile(str(project / "report.xml"))


def test_junit_failures_per_finding(run: RunCli, project: Path) -> None:
    (project / "a.py").write_text(TWICE)
    (project / "b.py").write_text("x = 1\n")
    code, xml = junit(run, project, ".")
    assert code == 1
    xml.update_statistics()
    assert (xml.tests, xml.failures, xml.errors) == (2, 2, 0)
    [suite] = list(xml)
    assert suite.name == "a.py"
    cases = list(suite)
    assert [case.name for case in cases] == ["RL001 at 2:36", "RL001 at 3:32"]
    [failure] = cases[0].result
    assert isinstance(failure, junitparser.Failure)
    assert failure.type == "RL001"
    assert "torch.bfloat16" in failure.message


def test_junit_error_for_a_file_it_could_not_lint(run: RunCli, project: Path) -> None:
    (project / "broken.py").write_text(BROKEN)
    code, xml = junit(run, project, "broken.py")
    assert code == 2
    [suite] = list(xml)
    [case] = list(suite)
    [error] = case.result
    assert isinstance(error, junitparser.Error)
    assert error.message.startswith("syntax error")
    assert (suite.tests, suite.errors) == (1, 1)


def test_junit_clean_run_is_one_passing_test(run: RunCli, project: Path) -> None:
    (project / "a.py").write_text("x = 1\n")
    code, xml = junit(run, project, "a.py")
    assert code == 0
    [suite] = list(xml)
    [case] = list(suite)
    assert case.is_passed
