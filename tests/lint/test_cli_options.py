"""Every option of ``replaylint check``, run in-process through :func:`replaylint.cli.main`.

The exact finding set is pinned with ``--select RL001`` (or by reading only RL001 findings from
the JSON output) so that these tests stay valid as rules are added.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replaylint.lint.context import FileContext
from replaylint.lint.engine import Linter
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule
from replaylint.lint.rules.registry import ALL_RULES

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
FIXED = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.float32)\n"
CLEAN = "import torch\nd_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
HEADLINE = "a.py:2:36: RL001 [*] gate cache `g_cache` is allocated as torch.bfloat16"


@pytest.fixture
def buggy(project: Path) -> Path:
    path = project / "a.py"
    path.write_text(BUGGY)
    return path


def rl001_rows(cli: RunCli, *args: str) -> list[int]:
    """Rows of the RL001 findings in a JSON run over ``args``."""
    done = cli(*args, "--output-format", "json")
    assert done.returncode in (0, 1), done.stderr
    return [f["location"]["row"] for f in json.loads(done.stdout) if f["code"] == "RL001"]


# paths and the `check` subcommand ----------------------------------------------------------------


def test_check_subcommand_and_default_path(cli: RunCli, project: Path) -> None:
    (project / "pkg").mkdir()
    (project / "pkg" / "a.py").write_text(BUGGY)
    assert rl001_rows(cli) == [2]
    assert rl001_rows(cli, "check") == [2]
    assert rl001_rows(cli, "check", "pkg") == [2]
    assert rl001_rows(cli, "check", "pkg/a.py") == [2]


def test_clean_file(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(CLEAN)
    done = cli("a.py")
    assert (done.returncode, done.stdout, done.stderr) == (0, "All checks passed!\n", "")


def test_help(cli: RunCli) -> None:
    done = cli("--help")
    assert done.returncode == 0
    for option in (
        "--fix",
        "--unsafe-fixes",
        "--diff",
        "--select",
        "--extend-select",
        "--ignore",
        "--output-format",
        "--exit-zero",
        "--statistics",
        "--stdin-filename",
        "--config",
        "--force-exclude",
        "--version",
    ):
        assert option in done.stdout, option


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--output-format", "xml", "a.py"], "invalid choice: 'xml'"),
        (["-", "a.py"], "`-` (stdin) cannot be combined with other paths"),
        (["--stdin-filename", "x.py", "a.py"], "--stdin-filename needs `-` as the only path"),
        (["rule"], "give a rule code (e.g. `replaylint rule RL001`) or --all"),
        (["rule", "RL999"], "unknown rule `RL999`"),
        (["--config", "missing.toml", "a.py"], "missing.toml: configuration file not found"),
    ],
)
def test_usage_errors_exit_2(cli: RunCli, buggy: Path, args: list[str], message: str) -> None:
    done = cli(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""


def test_rule_command(cli: RunCli) -> None:
    one = cli("rule", "rl001")
    assert one.returncode == 0
    assert one.stdout.startswith("# RL001: explicit-non-fp32-dtype")
    every = cli("rule", "--all")
    assert every.returncode == 0
    for rule in ALL_RULES:
        assert f"# {rule.CODE}: {rule.NAME}" in every.stdout


# rule selection ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flagged"),
    [
        ([], True),
        (["--select", "RL001"], True),
        (["--select", "rl001"], True),  # codes are case-insensitive
        (["--select", "RL00"], True),  # a prefix
        (["--select", "RL"], True),
        (["--select", "ALL"], True),
        (["--ignore", "RL001"], False),
        (["--ignore", "RL0"], False),
        (["--select", "ALL", "--ignore", "RL001"], False),
        (["--select", "RL", "--ignore", "RL001"], False),
        (["--select", "RL001", "--ignore", "RL"], True),  # the more specific selector wins
        (["--select", "RL001", "--ignore", "RL001"], False),  # ignore wins a tie
        (["--ignore", "RL", "--extend-select", "RL001"], True),
        (["--select", "RL001,RL00", "--ignore", "ALL"], True),  # comma-separated
        (["--select", "RL001", "--select", "RL00"], True),  # repeated
    ],
)
def test_select_ignore_extend_select(
    cli: RunCli, buggy: Path, args: list[str], flagged: bool
) -> None:
    assert rl001_rows(cli, *args, "a.py") == ([2] if flagged else [])


@pytest.mark.parametrize("option", ["--select", "--ignore", "--extend-select"])
@pytest.mark.parametrize("selector", ["RL9", "E501", "RLX", "RL0011"])
def test_unknown_selector_is_a_usage_error(
    cli: RunCli, buggy: Path, option: str, selector: str
) -> None:
    done = cli(option, f"RL001,{selector}", "a.py")
    assert done.returncode == 2
    assert f"{option}: unknown rule selector `{selector}`" in done.stderr
    assert done.stdout == ""


# exit codes and summaries ------------------------------------------------------------------------


def test_exit_zero(cli: RunCli, buggy: Path) -> None:
    done = cli("--exit-zero", "--select", "RL001", "a.py")
    assert done.returncode == 0
    assert done.stdout.startswith(HEADLINE)


def test_exit_zero_does_not_hide_unreadable_files(cli: RunCli, buggy: Path) -> None:
    (buggy.parent / "broken.py").write_text("def (g_cache:\n")
    done = cli("--exit-zero", ".")
    assert done.returncode == 2
    assert "broken.py:1:5: syntax error" in done.stderr


def test_nonexistent_path(cli: RunCli, buggy: Path) -> None:
    done = cli("--select", "RL001", "missing.py", "a.py")
    assert done.returncode == 2
    assert done.stdout.startswith(HEADLINE)
    assert done.stderr == "error: missing.py: no such file or directory\n"


def test_a_clean_run_with_an_unreadable_file_does_not_claim_success(
    cli: RunCli, project: Path
) -> None:
    (project / "a.py").write_text(CLEAN)
    done = cli("a.py", "missing.py")
    assert done.returncode == 2
    assert "All checks passed!" not in done.stdout
    assert done.stdout == "No findings, but 1 file could not be checked (see the errors above).\n"


def test_statistics_text(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(BUGGY + BUGGY.replace("g_cache", "gate_cache"))
    (project / "b.py").write_text(BUGGY)
    done = cli("--statistics", "--select", "RL001", ".")
    assert done.returncode == 1
    assert done.stdout == "    3\tRL001\t[*] explicit-non-fp32-dtype\n"


def test_statistics_json(cli: RunCli, buggy: Path) -> None:
    done = cli("--statistics", "--output-format", "json", "--select", "RL001", "a.py")
    assert done.returncode == 1
    assert json.loads(done.stdout) == [
        {"code": "RL001", "name": "explicit-non-fp32-dtype", "count": 1, "fixable": True}
    ]


def test_statistics_clean(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(CLEAN)
    done = cli("--statistics", "a.py")
    assert (done.returncode, done.stdout) == (0, "")


# --fix and --diff --------------------------------------------------------------------------------


def test_fix_summary_and_rerun(cli: RunCli, buggy: Path) -> None:
    done = cli("--fix", "--select", "RL001", "a.py")
    assert (done.returncode, done.stdout) == (0, "Found 1 error (1 fixed, 0 remaining).\n")
    assert buggy.read_text() == FIXED
    again = cli("--fix", "--select", "RL001", "a.py")
    assert (again.returncode, again.stdout) == (0, "All checks passed!\n")
    assert buggy.read_text() == FIXED


def test_fix_leaves_ignored_rules_alone(cli: RunCli, buggy: Path) -> None:
    done = cli("--fix", "--ignore", "RL001", "a.py")
    assert done.returncode == 0
    assert buggy.read_text() == BUGGY


def test_diff_with_nothing_to_fix(cli: RunCli, project: Path) -> None:
    (project / "a.py").write_text(CLEAN)
    done = cli("--diff", "a.py")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "No fixes to apply.\n")


def test_diff_wins_over_fix(cli: RunCli, buggy: Path) -> None:
    done = cli("--diff", "--fix", "--select", "RL001", "a.py")
    assert done.returncode == 1
    assert "+g_cache = torch.zeros(4, 16, dtype=torch.float32)\n" in done.stdout
    assert buggy.read_text() == BUGGY


@pytest.mark.parametrize("output_format", ["json", "sarif", "github", "gitlab", "junit"])
def test_diff_refuses_a_machine_format(cli: RunCli, buggy: Path, output_format: str) -> None:
    done = cli("--diff", "--output-format", output_format, "--select", "RL001", "a.py")
    assert (done.returncode, done.stdout) == (2, "")
    assert f"--diff prints a unified diff, not `{output_format}`" in done.stderr
    assert buggy.read_text() == BUGGY


@pytest.mark.parametrize("output_format", ["concise", "full"])
def test_diff_with_a_text_format_prints_the_diff(
    cli: RunCli, buggy: Path, output_format: str
) -> None:
    done = cli("--diff", "--output-format", output_format, "--select", "RL001", "a.py")
    assert done.returncode == 1
    assert done.stdout.startswith("--- a/a.py\n+++ b/a.py\n")
    assert done.stderr == "Would fix 1 error in 1 file.\n"


def test_diff_over_several_files(cli: RunCli, project: Path) -> None:
    for name in ("a.py", "b.py"):
        (project / name).write_text(BUGGY)
    (project / "c.py").write_text(CLEAN)
    done = cli("--diff", "--select", "RL001", ".")
    assert done.returncode == 1
    assert done.stdout.count("+++ b/") == 2
    assert done.stderr == "Would fix 2 errors in 2 files.\n"
    assert (project / "a.py").read_text() == BUGGY


# --unsafe-fixes ----------------------------------------------------------------------------------


@pytest.fixture
def unsafe_rl001(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mark every fix as unsafe, whatever rule offers it: tests --unsafe-fixes' mechanism."""
    original = FileContext.add_finding

    def add_finding(self: FileContext, code: str, node: Any, message: str, fix: Any) -> None:
        if isinstance(fix, FixDraft):
            fix = FixDraft(fix.message, fix.edits, Applicability.UNSAFE)
        original(self, code, node, message, fix)

    monkeypatch.setattr(FileContext, "add_finding", add_finding)


@pytest.mark.usefixtures("unsafe_rl001")
def test_unsafe_fix_is_not_applied_without_the_option(cli: RunCli, buggy: Path) -> None:
    done = cli("--select", "RL001", "a.py")
    assert done.returncode == 1
    # No [*]: --fix alone would not fix it; the summary says how to enable it.
    assert done.stdout.startswith("a.py:2:36: RL001 gate cache")
    assert done.stdout.endswith(
        "Found 1 error.\nNo fixes available (1 hidden fix can be enabled with the "
        "`--unsafe-fixes` option).\n"
    )
    fixed = cli("--fix", "--select", "RL001", "a.py")
    assert fixed.returncode == 1
    assert buggy.read_text() == BUGGY
    diff = cli("--diff", "--select", "RL001", "a.py")
    assert (diff.returncode, diff.stdout) == (0, "")
    statistics = cli("--statistics", "--output-format", "json", "--select", "RL001", "a.py")
    assert json.loads(statistics.stdout)[0]["fixable"] is False


@pytest.mark.usefixtures("unsafe_rl001")
def test_unsafe_fix_in_json_is_marked_unsafe(cli: RunCli, buggy: Path) -> None:
    done = cli("--output-format", "json", "--select", "RL001", "a.py")
    [finding] = json.loads(done.stdout)
    assert finding["fix"]["applicability"] == "unsafe"


@pytest.mark.usefixtures("unsafe_rl001")
def test_unsafe_fix_is_applied_with_the_option(cli: RunCli, buggy: Path) -> None:
    check = cli("--unsafe-fixes", "--select", "RL001", "a.py")
    assert check.stdout.startswith(HEADLINE)  # [*]: fixable with this run's settings
    diff = cli("--diff", "--unsafe-fixes", "--select", "RL001", "a.py")
    assert diff.returncode == 1
    assert "+g_cache = torch.zeros(4, 16, dtype=torch.float32)\n" in diff.stdout
    done = cli("--fix", "--unsafe-fixes", "--select", "RL001", "a.py")
    assert done.returncode == 0
    assert buggy.read_text() == FIXED


def _unsafe_examples() -> list[Any]:
    """INVALID examples whose every fix is unsafe (an added `import torch` in a module that did
    not import torch, a cast through a shared local)."""
    cases = []
    for rule in ALL_RULES:
        for number, example in enumerate(rule.INVALID):
            if example.fixed_source is None:
                continue
            fixes = [f.fix for f in Linter().check(example.source, "example.py") if f.fix]
            if fixes and all(fix.applicability is Applicability.UNSAFE for fix in fixes):
                cases.append(pytest.param(rule, example, id=f"{rule.CODE}-{number}"))
    assert cases, "no example offers only unsafe fixes: this test would test nothing"
    return cases


@pytest.mark.parametrize(("rule", "example"), _unsafe_examples())
def test_real_unsafe_fixes_need_the_option(
    cli: RunCli, project: Path, rule: type[Rule], example: Invalid
) -> None:
    path = project / "example.py"
    path.write_text(example.source)
    cli("--fix", "--select", rule.CODE, "example.py")
    assert path.read_text() == example.source
    cli("--fix", "--unsafe-fixes", "--select", rule.CODE, "example.py")
    assert path.read_text() == example.fixed_source


# stdin -------------------------------------------------------------------------------------------


def test_stdin_with_filename(cli: RunCli) -> None:
    done = cli("-", "--stdin-filename", "a.py", "--select", "RL001", stdin=BUGGY.encode())
    assert done.returncode == 1
    assert done.stdout.startswith(HEADLINE)


def test_stdin_without_filename_is_called_dash(cli: RunCli) -> None:
    done = cli("-", "--select", "RL001", "--output-format", "concise", stdin=BUGGY.encode())
    assert done.returncode == 1
    assert done.stdout.startswith("-:2:36: RL001")


def test_stdin_filename_alone_reads_stdin(cli: RunCli) -> None:
    done = cli("--stdin-filename", "a.py", "--select", "RL001", stdin=BUGGY.encode())
    assert done.returncode == 1
    assert done.stdout.startswith(HEADLINE)


def test_stdin_fix(cli: RunCli) -> None:
    done = cli("-", "--fix", "--select", "RL001", stdin=BUGGY.encode())
    assert (done.returncode, done.stdout) == (0, FIXED)
    assert done.stderr == "Found 1 error (1 fixed, 0 remaining).\n"


def test_stdin_fix_clean_source_is_echoed(cli: RunCli) -> None:
    done = cli("-", "--fix", stdin=CLEAN.encode())
    assert (done.returncode, done.stdout) == (0, CLEAN)


def test_stdin_diff(cli: RunCli) -> None:
    done = cli("-", "--diff", "--stdin-filename", "a.py", "--select", "RL001", stdin=BUGGY.encode())
    assert done.returncode == 1
    assert done.stdout.startswith("--- a/a.py\n+++ b/a.py\n")


def test_stdin_json(cli: RunCli) -> None:
    done = cli("-", "--output-format", "json", "--select", "RL001", stdin=BUGGY.encode())
    [finding] = json.loads(done.stdout)
    assert finding["filename"] == "-"


def test_stdin_force_exclude(cli: RunCli, project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.replaylint]\nextend-exclude = ["gen"]\n')
    excluded = ("-", "--force-exclude", "--stdin-filename", "gen/a.py")
    checked = cli(*excluded, stdin=BUGGY.encode())
    assert (checked.returncode, checked.stdout) == (0, "")
    fixed = cli(*excluded, "--fix", stdin=BUGGY.encode())
    assert (fixed.returncode, fixed.stdout) == (0, BUGGY)
    # Without --force-exclude an excluded name given on stdin is linted like any other.
    linted = cli("-", "--stdin-filename", "gen/a.py", "--select", "RL001", stdin=BUGGY.encode())
    assert linted.returncode == 1


def test_stdin_uses_the_configuration_next_to_the_stdin_filename(
    cli: RunCli, project: Path
) -> None:
    (project / "sub").mkdir()
    (project / "sub" / "replaylint.toml").write_text('ignore = ["RL001"]\n')
    done = cli("-", "--stdin-filename", "sub/a.py", stdin=BUGGY.encode())
    assert (done.returncode, done.stdout) == (0, "All checks passed!\n")


# --force-exclude ---------------------------------------------------------------------------------


def test_force_exclude_applies_exclude_to_explicit_paths(cli: RunCli, project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.replaylint]\nextend-exclude = ["gen"]\n')
    (project / "gen").mkdir()
    (project / "gen" / "a.py").write_text(BUGGY)
    (project / "a.py").write_text(BUGGY)
    assert rl001_rows(cli, ".") == [2]  # gen/ is excluded when walking
    assert rl001_rows(cli, "gen/a.py") == [2]  # named explicitly: linted
    assert rl001_rows(cli, "gen") == [2]
    assert rl001_rows(cli, "--force-exclude", "gen/a.py") == []
    assert rl001_rows(cli, "--force-exclude", "gen") == []
    assert rl001_rows(cli, "--force-exclude", "gen/a.py", "a.py") == [2]


def test_force_exclude_applies_the_default_excludes(cli: RunCli, project: Path) -> None:
    (project / ".venv").mkdir()
    (project / ".venv" / "a.py").write_text(BUGGY)
    assert rl001_rows(cli, ".venv/a.py") == [2]
    assert rl001_rows(cli, "--force-exclude", ".venv/a.py") == []
