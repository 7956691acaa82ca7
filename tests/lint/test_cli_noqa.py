"""``# noqa`` suppression as the command line applies it: blanket and per-code, on any line of a
multi-line statement, a wrong code does not suppress, and a file-level ``# replaylint: noqa``;
warnings about misfiring comments."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replaylint.lint.rules.catalogue import RULE_NAMES
from replaylint.lint.syntax.noqa import may_misfire, parse_suppressions

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

ALLOCATION = "torch.zeros(4, dtype=torch.bfloat16)"


def rows(cli: RunCli, source: str, *args: str) -> list[int]:
    Path("a.py").write_text(source)
    done = cli("--output-format", "json", "--select", "RL001", *args, "a.py")
    assert done.returncode in (0, 1), done.stderr
    return [f["location"]["row"] for f in json.loads(done.stdout)]


@pytest.mark.usefixtures("project")
@pytest.mark.parametrize(
    ("comment", "suppressed"),
    [
        ("# noqa", True),
        ("# NOQA", True),
        ("#noqa", True),
        ("# noqa: RL001", True),
        ("# noqa:RL001", True),
        ("# noqa: rl001", True),
        ("# noqa: RL002,RL001", True),
        ("# noqa: RL002, RL001", True),
        ("# noqa: RL002 RL001", True),
        ("# explained  # noqa: RL001", True),
        ("# noqa: RL002", False),  # a different code
        ("# noqa: RL00", False),  # a prefix is not a code
        ("# noqa: RL0011", False),
        ("# no qa", False),
    ],
)
def test_noqa_on_the_line(cli: RunCli, comment: str, suppressed: bool) -> None:
    source = f"import torch\ng_cache = {ALLOCATION}  {comment}\n"
    assert rows(cli, source) == ([] if suppressed else [2])


@pytest.mark.usefixtures("project")
@pytest.mark.parametrize("line", [0, 1, 2, 3, 4])
def test_noqa_on_any_line_of_a_multiline_statement(cli: RunCli, line: int) -> None:
    statement = [
        "g_cache = torch.zeros(",
        "    4,",
        "    16,",
        "    dtype=torch.bfloat16,",
        ")",
    ]
    statement[line] += "  # noqa: RL001"
    source = "import torch\n" + "\n".join(statement) + "\n"
    assert rows(cli, source) == []
    assert rows(cli, source.replace("RL001", "RL002")) == [5]


@pytest.mark.usefixtures("project")
def test_noqa_on_a_neighbouring_statement_does_not_suppress(cli: RunCli) -> None:
    source = (
        "import torch  # noqa\n"
        f"g_cache = {ALLOCATION}\n"
        "x = 1  # noqa: RL001\n"
        "# noqa: RL001\n"
        f"gate_cache = {ALLOCATION}\n"
    )
    assert rows(cli, source) == [2, 5]


@pytest.mark.usefixtures("project")
def test_noqa_inside_a_string_is_not_a_comment(cli: RunCli) -> None:
    source = f'import torch\ng_cache = {ALLOCATION}; s = "# noqa"\n'
    assert rows(cli, source) == [2]


@pytest.mark.usefixtures("project")
def test_noqa_suppresses_only_its_statement_in_a_block(cli: RunCli) -> None:
    source = (
        "import torch\n"
        "class Pool:\n"
        "    def __init__(self):\n"
        f"        self.g_cache = {ALLOCATION}  # noqa: RL001\n"
        f"        self.gate_cache = {ALLOCATION}\n"
    )
    assert rows(cli, source) == [5]


@pytest.mark.usefixtures("project")
@pytest.mark.parametrize(
    ("directive", "suppressed"),
    [
        ("# replaylint: noqa", True),
        ("#replaylint:noqa", True),
        ("# replaylint: noqa: RL001", True),
        ("# replaylint: noqa: RL002, RL001", True),
        ("# replaylint: noqa: RL002", False),
    ],
)
def test_file_level_noqa(cli: RunCli, directive: str, suppressed: bool) -> None:
    for position in ("top", "bottom"):
        body = f"import torch\ng_cache = {ALLOCATION}\ngate_cache = {ALLOCATION}\n"
        source = f"{directive}\n{body}" if position == "top" else f"{body}{directive}\n"
        expected = [] if suppressed else ([3, 4] if position == "top" else [2, 3])
        assert rows(cli, source) == expected, position


@pytest.mark.usefixtures("project")
def test_file_level_noqa_must_be_on_its_own_line(cli: RunCli) -> None:
    # After code it is not a file-wide exemption (as in ruff): the other finding still shows.
    source = f"import torch\ng_cache = {ALLOCATION}\ny = 1  # replaylint: noqa\ngate_cache = {ALLOCATION}\n"
    assert rows(cli, source) == [2, 4]


@pytest.mark.usefixtures("project")
def test_suppressed_findings_are_not_fixed(cli: RunCli) -> None:
    source = f"import torch\ng_cache = {ALLOCATION}  # noqa: RL001\ngate_cache = {ALLOCATION}\n"
    Path("a.py").write_text(source)
    done = cli("--fix", "--select", "RL001", "a.py")
    assert done.returncode == 0
    assert Path("a.py").read_text() == (
        f"import torch\ng_cache = {ALLOCATION}  # noqa: RL001\n"
        "gate_cache = torch.zeros(4, dtype=torch.float32)\n"
    )


@pytest.mark.usefixtures("project")
@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n"], ids=["cr", "crlf", "lf"])
def test_noqa_is_read_whatever_the_line_endings(cli: RunCli, newline: str) -> None:
    source = newline.join(
        [
            "import torch",
            f"g_cache = {ALLOCATION}  # noqa: RL001",
            f"gate_cache = {ALLOCATION}",
            "",
        ]
    )
    Path("a.py").write_bytes(source.encode())
    done = cli("--output-format", "json", "--select", "RL001", "a.py")
    assert [f["location"]["row"] for f in json.loads(done.stdout)] == [3]
    file_wide = newline.join(["# replaylint: noqa", "import torch", f"g_cache = {ALLOCATION}", ""])
    Path("a.py").write_bytes(file_wide.encode())
    assert json.loads(cli("--output-format", "json", "a.py").stdout) == []


@pytest.mark.usefixtures("project")
@pytest.mark.parametrize(
    ("comment", "warning"),
    [
        ("# noqa RL001", "`# noqa RL001` is a blanket `# noqa`"),
        ("# noqa : RL001", "write `# noqa: RL001` to suppress only RL001"),
        ("# noqa: RL999", "names RL999, which is not a replaylint rule code"),
    ],
)
def test_misfiring_noqa_comments_are_warned_about(cli: RunCli, comment: str, warning: str) -> None:
    Path("a.py").write_text(f"import torch\ng_cache = {ALLOCATION}  {comment}\n")
    done = cli("a.py")
    assert "warning: a.py:2: " in done.stderr
    assert warning in done.stderr


@pytest.mark.usefixtures("project")
@pytest.mark.parametrize("comment", ["# noqa: RL001", "# noqa: E501, RL001", "# noqa"])
def test_well_formed_noqa_comments_draw_no_warning(cli: RunCli, comment: str) -> None:
    Path("a.py").write_text(f"import torch\ng_cache = {ALLOCATION}  {comment}\n")
    assert "warning" not in cli("a.py").stderr


_PIECES = [
    "# noqa",
    "# noqa RL001",
    "# noqa : RL002",
    "# noqa: RL999",
    "# NOQA: rl001",
    "# noqa: E501, RL001",
    "# replaylint: noqa",
    "# replaylint: noqa RL001",
    '"# noqa RL001"',
    "'#'",
    "x = 1",
    "  ",
    "\n",
    "\r\n",
    '"""',
    "\\",
    "#",
]


@given(st.lists(st.sampled_from(_PIECES), max_size=12))
def test_the_quick_misfire_check_misses_no_problem(pieces: list[str]) -> None:
    """`may_misfire` (a line scan) is true whenever tokenizing finds a misfiring comment."""
    source = "".join(pieces)
    found = parse_suppressions(source, "RL", RULE_NAMES).problems
    if found:
        assert may_misfire(source, "RL", RULE_NAMES)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1  # noqa RL001\n", True),
        ("x = 1  # noqa: RL999\n", True),
        ("x = 1  # noqa: RL001\n", False),
        ("x = 1  # noqa\n", False),
        ('x = "# noqa RL001"\n', True),  # a superset: the string's text looks like a comment
        ("# replaylint: noqa\n", False),
    ],
)
def test_the_quick_misfire_check(source: str, expected: bool) -> None:
    assert may_misfire(source, "RL", RULE_NAMES) is expected
