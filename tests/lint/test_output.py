"""The output formats: ``text``, ``concise``, ``json`` (ruff's fields), ``github`` annotations.

SARIF has its own module (test_sarif.py); ``--statistics`` is in test_cli_options.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replaylint.lint.context import FileContext
from replaylint.lint.model import Applicability, Edit, FileReport, Finding, Fix, Location
from replaylint.lint.report import RENDERERS
from replaylint.lint.report.github import render_github

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
# A multi-line statement: the finding points at the dtype expression on its own row.
MULTILINE = """\
import torch


class Pool:
    def __init__(self, slots):
        self.g_cache = torch.zeros(
            slots,
            16,
            dtype=torch.half,
        )
"""
FROM_IMPORT = "from torch import bfloat16, zeros\ng_cache = zeros(4, dtype=bfloat16)\n"


def json_findings(cli: RunCli, *args: str) -> list[dict[str, Any]]:
    done = cli("--output-format", "json", "--select", "RL001", *args)
    assert done.returncode == 1, done.stderr
    findings: list[dict[str, Any]] = json.loads(done.stdout)
    return findings


@pytest.fixture
def without_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Findings without a fix, whatever rule reports them."""
    original = FileContext.add_finding

    def add_finding(self: FileContext, code: str, node: Any, message: str, fix: Any) -> None:
        original(self, code, node, message, None)

    monkeypatch.setattr(FileContext, "add_finding", add_finding)


# json --------------------------------------------------------------------------------------------


def test_json_has_ruffs_fields(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    [finding] = json_findings(cli, "a.py")
    assert set(finding) == {
        "cell",
        "code",
        "message",
        "filename",
        "location",
        "end_location",
        "fix",
        "noqa_row",
        "url",
    }
    assert finding["cell"] is None
    assert finding["noqa_row"] == 2
    assert finding["code"] == "RL001"
    assert "`g_cache`" in finding["message"]
    assert "torch.bfloat16" in finding["message"]
    assert finding["filename"] == str(project / "a.py")  # absolute, like ruff
    # 1-based, pointing at the dtype expression `torch.bfloat16` inside the statement.
    assert finding["location"] == {"row": 2, "column": 36}
    assert finding["end_location"] == {"row": 2, "column": 50}
    assert BUGGY.splitlines()[1][35:49] == "torch.bfloat16"
    assert finding["fix"] == {
        "applicability": "safe",
        "message": "Allocate it as torch.float32",
        "edits": [
            {
                "content": "torch.float32",
                "location": {"row": 2, "column": 36},
                "end_location": {"row": 2, "column": 50},
            }
        ],
    }
    assert finding["url"].endswith("/docs/rules/RL001.md")
    assert finding["url"].startswith("https://")
    assert (REPO_ROOT / "docs" / "rules" / "RL001.md").is_file()


def test_json_location_inside_a_multiline_statement(cli: RunCli, project: Path) -> None:
    (project / "pool.py").write_text(MULTILINE)
    [finding] = json_findings(cli, "pool.py")
    assert finding["location"] == {"row": 9, "column": 19}
    assert finding["end_location"] == {"row": 9, "column": 29}
    assert MULTILINE.splitlines()[8][18:28] == "torch.half"


def test_json_fix_with_several_edits(cli: RunCli, project: Path) -> None:
    # No `torch` binding: the fix spells torch.float32 and adds `import torch` at the top.
    (project / "a.py").write_text(FROM_IMPORT)
    [finding] = json_findings(cli, "a.py")
    edits = sorted(finding["fix"]["edits"], key=lambda e: (e["location"]["row"], e["content"]))
    assert edits == [
        {
            "content": "import torch\n",
            "location": {"row": 1, "column": 1},
            "end_location": {"row": 1, "column": 1},
        },
        {
            "content": "torch.float32",
            "location": {"row": 2, "column": 26},
            "end_location": {"row": 2, "column": 34},
        },
    ]
    assert FROM_IMPORT.splitlines()[1][25:33] == "bfloat16"


@pytest.mark.usefixtures("without_fixes")
def test_json_fix_is_null_without_a_fix(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    [finding] = json_findings(cli, "a.py")
    assert finding["fix"] is None


def test_json_several_files_sorted_and_empty(cli: RunCli, project: Path) -> None:
    (project / "b.py").write_text(BUGGY)
    (project / "a.py").write_text(BUGGY + BUGGY.replace("g_cache", "gate_cache"))
    findings = json_findings(cli, ".")
    assert [(Path(f["filename"]).name, f["location"]["row"]) for f in findings] == [
        ("a.py", 2),
        ("a.py", 4),
        ("b.py", 2),
    ]
    (project / "c.py").write_text("x = 1\n")
    clean = cli("--output-format", "json", "c.py")
    assert (clean.returncode, clean.stdout) == (0, "[]\n")


# text and concise --------------------------------------------------------------------------------


def test_text_output(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    [finding] = json_findings(cli, "a.py")
    done = cli("--select", "RL001", "a.py")
    assert done.returncode == 1
    assert done.stdout == (
        f"a.py:2:36: RL001 [*] {finding['message']}\n"
        "  |\n"
        "2 | g_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
        "  |                                    ^^^^^^^^^^^^^^ RL001\n"
        "  |\n"
        "  = help: Allocate it as torch.float32\n"
        "\n"
        "Found 1 error.\n"
        "[*] 1 fixable with the `--fix` option.\n"
    )


def test_text_output_gutter_widens_with_the_row_number(cli: RunCli, project: Path) -> None:
    (project / "pool.py").write_text(MULTILINE.replace("import torch\n", "import torch\n" * 5))
    done = cli("--select", "RL001", "pool.py")
    lines = done.stdout.splitlines()
    assert lines[1:5] == [
        "   |",
        "13 |             dtype=torch.half,",
        "   |                   ^^^^^^^^^^ RL001",
        "   |",
    ]


def test_text_caret_lines_up_with_tabs(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(
        "import torch\nif True:\n\tg_cache = torch.zeros(4, dtype=torch.bfloat16)\n"
    )
    done = cli("--select", "RL001", "a.py")
    code, caret = done.stdout.splitlines()[2:4]
    assert caret.index("^") == code.index("torch.bfloat16")
    assert caret.count("^") == len("torch.bfloat16")


@pytest.mark.usefixtures("without_fixes")
def test_text_output_without_a_fix(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    done = cli("--select", "RL001", "a.py")
    assert done.stdout.startswith("a.py:2:36: RL001 gate cache")
    assert "help:" not in done.stdout
    assert done.stdout.endswith("\n\nFound 1 error.\n")


def test_text_output_several_findings(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY + BUGGY.replace("g_cache", "gate_cache"))
    done = cli("--select", "RL001", "a.py")
    blocks = done.stdout.split("\n\n")
    assert [block.split(":")[1] for block in blocks[:2]] == ["2", "4"]
    assert blocks[2] == "Found 2 errors.\n[*] 2 fixable with the `--fix` option.\n"


def test_concise_output(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    [finding] = json_findings(cli, "a.py")
    done = cli("--output-format", "concise", "--select", "RL001", "a.py")
    assert done.returncode == 1
    assert done.stdout == (
        f"a.py:2:36: RL001 [*] {finding['message']}\n"
        "Found 1 error.\n[*] 1 fixable with the `--fix` option.\n"
    )


# github ------------------------------------------------------------------------------------------


def test_github_annotation(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY)
    [finding] = json_findings(cli, "a.py")
    done = cli("--output-format", "github", "--select", "RL001", "a.py")
    assert done.returncode == 1
    assert done.stdout == (
        f"::error file=a.py,line=2,col=36,endLine=2,endColumn=50,title=RL001::"
        f"{finding['message']}\n"
    )


def test_github_escapes_properties_and_data() -> None:
    finding = Finding(
        code="RL001",
        message="100% wrong\nsecond line",
        filename="dir,x/a:b.py",
        location=Location(3, 4),
        end_location=Location(3, 9),
    )
    assert render_github([FileReport(finding.filename, findings=[finding])]) == (
        "::error file=dir%2Cx/a%3Ab.py,line=3,col=4,endLine=3,endColumn=9,title=RL001::"
        "100%25 wrong%0Asecond line\n"
    )


@pytest.mark.parametrize("output_format", ["github", "json", "sarif", "concise"])
def test_machine_formats_print_no_snippets_and_no_summary_noise(
    cli: RunCli, project: Path, output_format: str
) -> None:
    (project / "a.py").write_text(BUGGY)
    done = cli("--output-format", output_format, "--select", "RL001", "a.py")
    assert done.returncode == 1
    assert "^^^" not in done.stdout
    assert done.stderr == ""
    if output_format != "concise":
        assert "Found 1 error" not in done.stdout


def test_every_renderer_handles_an_empty_run() -> None:
    for name, render in RENDERERS.items():
        assert isinstance(render([]), str), name


def test_renderers_accept_findings_with_unsafe_fixes() -> None:
    fix = Fix(Applicability.UNSAFE, "Do it", (Edit(Location(1, 1), Location(1, 2), "y"),))
    finding = Finding("RL001", "message", "a.py", Location(1, 1), Location(1, 2), fix)
    report = FileReport("a.py", findings=[finding], source="x = 1\n")
    assert json.loads(RENDERERS["json"]([report]))[0]["fix"]["applicability"] == "unsafe"
    assert "[*]" not in RENDERERS["concise"]([report])
    report.unsafe_fixes = True
    assert "[*]" in RENDERERS["concise"]([report])
