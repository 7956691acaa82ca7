"""``--output-format sarif``: SARIF 2.1.0 validated against the official OASIS schema
(tests/lint/data/sarif-schema-2.1.0.json), including its ``uri``/``uri-reference`` formats, and
consistent with the JSON output."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlparse

import jsonschema
import pytest

from replaylint import __version__
from replaylint.lint.context import FileContext
from replaylint.lint.rules.registry import ALL_RULES

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

SCHEMA_PATH = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"
BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
FROM_IMPORT = "from torch import bfloat16, zeros\ng_cache = zeros(4, dtype=bfloat16)\n"

# RFC 3986: a URI reference may hold only these characters, and `%` only as `%XX`.
_URI_CHARACTERS = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")

FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("uri-reference")
def _is_uri_reference(value: object) -> bool:
    return not isinstance(value, str) or _URI_CHARACTERS.fullmatch(value) is not None


@FORMATS.checks("uri")
def _is_uri(value: object) -> bool:
    return not isinstance(value, str) or (
        _is_uri_reference(value) and _SCHEME.match(value) is not None
    )


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=FORMATS)


def sarif(cli: RunCli, *args: str, expected_exit: int = 1) -> dict[str, Any]:
    done = cli("--output-format", "sarif", "--select", "RL001", *args)
    assert done.returncode == expected_exit, done.stderr
    log: dict[str, Any] = json.loads(done.stdout)
    return log


def assert_valid(validator: jsonschema.protocols.Validator, log: dict[str, Any]) -> None:
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_schema_is_the_official_one() -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["title"] == "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"


def test_the_format_checks_can_fail(validator: jsonschema.protocols.Validator) -> None:
    assert not _is_uri_reference("has space.py")
    assert not _is_uri("relative/only.py")
    assert _is_uri("file:///tmp/a%20b.py")
    bad = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": "no"}]}
    assert list(validator.iter_errors(bad))
    location = {"physicalLocation": {"artifactLocation": {"uri": "a b.py"}}}
    result = {"message": {"text": "m"}, "locations": [location]}
    unencoded = {
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "x"}}, "results": [result]}],
    }
    [error] = validator.iter_errors(unencoded)
    assert "uri-reference" in error.message


@pytest.mark.parametrize(
    ("filename", "source"),
    [
        ("a.py", BUGGY),
        ("imports.py", FROM_IMPORT),
        ("with space #1 é%.py", BUGGY),
        ("stub.pyi", BUGGY),
    ],
)
def test_findings_validate(
    cli: RunCli,
    project: Path,
    validator: jsonschema.protocols.Validator,
    filename: str,
    source: str,
) -> None:
    (project / "sub").mkdir()
    (project / "sub" / filename).write_text(source)
    log = sarif(cli, ".")
    assert_valid(validator, log)
    [result] = log["runs"][0]["results"]
    assert resolve(log, result["locations"][0]) == project / "sub" / filename


def test_no_findings_validate(
    cli: RunCli, project: Path, validator: jsonschema.protocols.Validator
) -> None:
    (project / "a.py").write_text("x = 1\n")
    log = sarif(cli, "a.py", expected_exit=0)
    assert_valid(validator, log)
    assert log["runs"][0]["results"] == []


def test_files_that_could_not_be_linted_validate(
    cli: RunCli, project: Path, validator: jsonschema.protocols.Validator
) -> None:
    (project / "a.py").write_text(BUGGY)
    (project / "broken.py").write_text("import torch\ndef (g_cache:\n")
    (project / "latin.py").write_bytes(b"g_cache = '\xff'\n")
    log = sarif(cli, "a.py", "broken.py", "latin.py", "missing.py", expected_exit=2)
    assert_valid(validator, log)
    [invocation] = log["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    notes = invocation["toolExecutionNotifications"]
    uris = [n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for n in notes]
    assert uris == ["broken.py", "latin.py", "missing.py"]
    assert "region" in notes[0]["locations"][0]["physicalLocation"]
    assert len(log["runs"][0]["results"]) == 1


def test_absolute_paths_validate(
    cli: RunCli, project: Path, validator: jsonschema.protocols.Validator
) -> None:
    (project / "a b.py").write_text(BUGGY)
    log = sarif(cli, str(project / "a b.py"))
    assert_valid(validator, log)
    location = log["runs"][0]["results"][0]["locations"][0]
    assert "uriBaseId" not in location["physicalLocation"]["artifactLocation"]
    assert resolve(log, location) == project / "a b.py"


def test_stdin_validates(cli: RunCli, validator: jsonschema.protocols.Validator) -> None:
    done = cli("-", "--output-format", "sarif", "--select", "RL001", stdin=BUGGY.encode())
    assert done.returncode == 1
    assert_valid(validator, json.loads(done.stdout))


def test_findings_without_fixes_validate(
    cli: RunCli,
    project: Path,
    validator: jsonschema.protocols.Validator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = FileContext.add_finding

    def add_finding(self: FileContext, code: str, node: Any, message: str, fix: Any) -> None:
        original(self, code, node, message, None)

    monkeypatch.setattr(FileContext, "add_finding", add_finding)
    (project / "a.py").write_text(BUGGY)
    log = sarif(cli, "a.py")
    assert_valid(validator, log)
    assert "fixes" not in log["runs"][0]["results"][0]


def test_sarif_agrees_with_json(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(FROM_IMPORT)
    log = sarif(cli, "a.py")
    [finding] = json.loads(cli("--output-format", "json", "--select", "RL001", "a.py").stdout)
    run = log["runs"][0]
    assert log["version"] == "2.1.0"
    driver = run["tool"]["driver"]
    assert (driver["name"], driver["version"]) == ("replaylint", __version__)
    assert [rule["id"] for rule in driver["rules"]] == [rule.CODE for rule in ALL_RULES]
    assert run["columnKind"] == "unicodeCodePoints"
    [result] = run["results"]
    assert result["ruleId"] == finding["code"]
    assert driver["rules"][result["ruleIndex"]]["id"] == finding["code"]
    assert driver["rules"][result["ruleIndex"]]["helpUri"] == finding["url"]
    assert result["message"]["text"] == finding["message"]
    assert result["locations"][0]["physicalLocation"]["region"] == region(
        finding["location"], finding["end_location"]
    )
    [fix] = result["fixes"]
    assert fix["description"]["text"] == finding["fix"]["message"]
    [change] = fix["artifactChanges"]
    assert resolve(log, change) == project / "a.py"
    replacements = [
        (r["deletedRegion"], r["insertedContent"]["text"]) for r in change["replacements"]
    ]
    expected = [
        (region(e["location"], e["end_location"]), e["content"]) for e in finding["fix"]["edits"]
    ]
    assert sorted(replacements, key=repr) == sorted(expected, key=repr)


def region(start: dict[str, int], end: dict[str, int]) -> dict[str, int]:
    return {
        "startLine": start["row"],
        "startColumn": start["column"],
        "endLine": end["row"],
        "endColumn": end["column"],
    }


def resolve(log: dict[str, Any], holder: dict[str, Any]) -> Path:
    """The file an artifactLocation (inside ``holder``) names, resolving ``uriBaseId``."""
    artifact = holder.get("physicalLocation", holder)["artifactLocation"]
    uri = artifact["uri"]
    if "uriBaseId" in artifact:
        base = log["runs"][0]["originalUriBaseIds"][artifact["uriBaseId"]]["uri"]
        uri = urljoin(base, uri)
    parsed = urlparse(uri)
    assert parsed.scheme == "file"
    return Path(unquote(parsed.path))
