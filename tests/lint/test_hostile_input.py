"""Hostile and odd input, beyond tests/lint/test_files.py: Python 2 syntax, tabs, no
trailing newline, very deep nesting, a 10 MB file and two ``--fix`` runs racing on one tree.

Each case gets a clear one-line message naming the file, exit code 2 (or a correct fix where the
input is valid Python 3), no modified file, and the other files of the run still fixed. Cases that
once killed the process (libcst's native parser overflows its stack on deep nesting) run in a
subprocess, so a regression fails the test instead of the whole suite.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from replaylint.lint.run.cache import CACHE_DIRECTORY
from replaylint.lint.syntax.limits import (
    MAX_BRACKET_DEPTH,
    MAX_EXPRESSION_DEPTH,
    MAX_SOURCE_CHARS,
    ParseLimitError,
    check_parse_limits,
)

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUGGY = b"import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
FIXED = b"import torch\ng_cache = torch.zeros(4, 16, dtype=torch.float32)\n"
# A file that cannot hold a finding is never parsed (the pre-filter): hostile files name a gate
# cache so that replaylint has to parse them.
RELEVANT = b"import torch\ng_cache = None\n"


def files_in(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` except the result cache, by relative path."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not str(path.relative_to(folder)).startswith(CACHE_DIRECTORY)
    }


def replaylint(
    *args: str, cwd: Path, timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run replaylint in a subprocess: (result, seconds, peak resident memory in bytes)."""
    script = (
        "import resource, sys\n"
        "from replaylint.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "sys.stderr.write(f'PEAK_RSS_KB {peak}\\n')\n"
        "sys.exit(code)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    seconds = time.perf_counter() - start
    lines = done.stderr.splitlines(keepends=True)
    peak = [line for line in lines if line.startswith("PEAK_RSS_KB ")]
    assert peak, f"no memory report: the process died (exit {done.returncode})\n{done.stderr}"
    stderr = "".join(line for line in lines if not line.startswith("PEAK_RSS_KB "))
    result = subprocess.CompletedProcess(done.args, done.returncode, done.stdout, stderr)
    return result, seconds, int(peak[0].split()[1]) * 1024


# Python 2, tabs ----------------------------------------------------------------------------------

# (source after RELEVANT, the error replaylint prints; None: valid Python 3, linted normally)
PYTHON_2_AND_TABS = [
    pytest.param(
        b'exec "x = 1"\n', "3:1: syntax error: Missing parentheses in call to 'exec'", id="exec"
    ),
    pytest.param(b"x = `g_cache`\n", "3:5: syntax error: invalid syntax", id="backticks"),
    pytest.param(b"if 1 <> 2:\n    pass\n", "3:6: syntax error: invalid syntax", id="diamond"),
    pytest.param(
        b"mode = 0777\n",
        "3:8: syntax error: leading zeros in decimal integer literals are not permitted",
        id="octal",
    ),
    pytest.param(
        b'raise ValueError, "bad"\n', "3:17: syntax error: invalid syntax", id="raise-comma"
    ),
    pytest.param(b"s = ur'abc'\n", "3:7: syntax error: invalid syntax", id="ur-prefix"),
    pytest.param(b"n = 10L\n", "3:6: syntax error: invalid decimal literal", id="long-suffix"),
    pytest.param(
        b"if True:\n\tx = 1\n        y = 2\n",
        "5:1: syntax error: inconsistent use of tabs and spaces in indentation",
        id="tab-then-spaces",
    ),
    pytest.param(
        b"if True:\n        x = 1\n\ty = 2\n",
        "5:1: syntax error: inconsistent use of tabs and spaces in indentation",
        id="spaces-then-tab",
    ),
    # Valid Python 3: `except A, B:` is Python 3.14's unparenthesised except (PEP 758), and
    # `print >>f, x` is a tuple expression. They parse, so they are linted like any file.
    pytest.param(b"try:\n    pass\nexcept ValueError, e:\n    pass\n", None, id="except-comma"),
    pytest.param(b'import sys\nprint >>sys.stderr, "x"\n', None, id="print-chevron"),
    pytest.param(b"if True:\n\tif True:\n\t    x = 1\n", None, id="tab-and-spaces-consistent"),
]


@pytest.mark.parametrize(("tail", "error"), PYTHON_2_AND_TABS)
@pytest.mark.parametrize("fix", [False, True], ids=["check", "fix"])
def test_python_2_syntax_and_tabs(
    cli: RunCli, project: Path, tail: bytes, error: str | None, fix: bool
) -> None:
    (project / "old.py").write_bytes(RELEVANT + tail)
    (project / "good.py").write_bytes(BUGGY)
    done = cli(*(["--fix"] if fix else []), "--select", "RL001", ".")
    after = files_in(project)
    assert after["old.py"] == RELEVANT + tail  # never modified
    assert after["good.py"] == (FIXED if fix else BUGGY)
    if error is None:
        assert (done.returncode, done.stderr) == (0 if fix else 1, "")
        return
    assert done.returncode == 2
    [line] = done.stderr.splitlines()  # one line, Python's own wording and position
    assert line.startswith(f"error: old.py:{error}"), line


def test_findings_in_valid_python_3_with_python_2_lookalikes_are_fixed(
    cli: RunCli, project: Path
) -> None:
    source = (
        b"import sys\nimport torch\ntry:\n\tg_cache = torch.zeros(4, dtype=torch.bfloat16)\n"
        b"except ValueError, e:\n\tpass\nprint >>sys.stderr, g_cache\n"
    )
    path = project / "a.py"
    path.write_bytes(source)
    done = cli("--fix", "--select", "RL001", "a.py")
    assert (done.returncode, done.stderr) == (0, "")
    assert path.read_bytes() == source.replace(b"torch.bfloat16", b"torch.float32")


# no trailing newline -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            b"import torch\ng_cache = torch.zeros(4, dtype=torch.bfloat16)\r\nx = 1",
            b"import torch\ng_cache = torch.zeros(4, dtype=torch.float32)\r\nx = 1",
            id="fix-before-an-unterminated-last-line",
        ),
        pytest.param(
            b"import torch\r\ng_cache = torch.zeros(4, dtype=torch.bfloat16)\r\n# end",
            b"import torch\r\ng_cache = torch.zeros(4, dtype=torch.float32)\r\n# end",
            id="unterminated-comment-last",
        ),
        pytest.param(
            b"import torch\r\ng_cache = torch.zeros(4, dtype=torch.bfloat16)",
            b"import torch\r\ng_cache = torch.zeros(4, dtype=torch.float32)",
            id="fix-on-the-last-line-crlf",
        ),
        pytest.param(
            b"import torch\ng_cache = torch.zeros(\n    4, dtype=torch.bfloat16)",
            b"import torch\ng_cache = torch.zeros(\n    4, dtype=torch.float32)",
            id="fix-on-a-continued-last-line",
        ),
        pytest.param(
            b"from torch import bfloat16, zeros\ng_cache = zeros(4, dtype=bfloat16)",
            b"import torch\nfrom torch import bfloat16, zeros\n"
            b"g_cache = zeros(4, dtype=torch.float32)",
            id="fix-that-adds-an-import",
        ),
        pytest.param(
            b"import torch\nif True:\n\tg_cache = torch.zeros(4, dtype=torch.bfloat16)",
            b"import torch\nif True:\n\tg_cache = torch.zeros(4, dtype=torch.float32)",
            id="fix-on-a-tab-indented-last-line",
        ),
    ],
)
def test_no_trailing_newline(cli: RunCli, project: Path, source: bytes, expected: bytes) -> None:
    path = project / "a.py"
    path.write_bytes(source)
    done = cli("--fix", "--select", "RL001", "a.py")
    assert (done.returncode, done.stderr) == (0, "")
    assert path.read_bytes() == expected  # no newline added, none lost
    ast.parse(expected)
    again = cli("--fix", "--select", "RL001", "a.py")
    assert again.returncode == 0
    assert path.read_bytes() == expected


def test_no_trailing_newline_without_a_fix_is_left_alone(cli: RunCli, project: Path) -> None:
    source = b"import torch\ng_cache = torch.zeros(4, dtype=torch.float32)"
    path = project / "a.py"
    path.write_bytes(source)
    for args in (["a.py"], ["--fix", "a.py"], ["--diff", "a.py"]):
        done = cli(*args)
        assert (done.returncode, done.stderr) == (0, "No fixes to apply.\n" * (args[0] == "--diff"))
    assert path.read_bytes() == source


# deep nesting ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Nested:
    name: str
    source: str
    error: str | None
    """The message after ``error: <file>: ``; None: at the limit, linted normally."""


def _chain(operator: str, terms: int) -> str:
    return operator.join(["x"] * terms)


LIMIT, DEPTH = MAX_BRACKET_DEPTH, MAX_EXPRESSION_DEPTH
# Past a depth that CPython's own parser may refuse (RecursionError, MemoryError; it depends on
# the Python version), the message gives no number.
TOO_DEEP = "is too deeply nested for the parser ("
_NESTED_RAW = [
    # Each of these killed the process (SIGSEGV in libcst's native parser) before parse_limits.
    Nested(
        "parens_2000",
        "y = " + "(" * 2000 + "1" + ")" * 2000,
        f"bracket depth 2000 > limit {LIMIT}, line 3",
    ),
    Nested(
        "lists_1500",
        "y = " + "[" * 1500 + "]" * 1500,
        f"bracket depth 1500 > limit {LIMIT}, line 3",
    ),
    Nested(
        "calls_1300",
        "y = " + "f(" * 1300 + ")" * 1300,
        f"bracket depth 1300 > limit {LIMIT}, line 3",
    ),
    Nested("plus_8000", "y = " + _chain(" + ", 8000), TOO_DEEP),
    Nested(
        "and_10000",
        "y = " + _chain(" and ", 10000),
        f"expression depth 10003 > limit {DEPTH}, line 3",
    ),
    # Slow or memory-hungry in libcst (seconds to minutes, gigabytes), refused quickly now.
    Nested(
        "parens_201",
        "y = " + "(" * 201 + "1" + ")" * 201,
        f"bracket depth 201 > limit {LIMIT}, line 3",
    ),
    Nested(
        "calls_1000",
        "y = " + "f(" * 1000 + ")" * 1000,
        f"bracket depth 1000 > limit {LIMIT}, line 3",
    ),
    Nested(
        "subscripts_1500", "y = x" + "[0]" * 1500, f"expression depth 1503 > limit {DEPTH}, line 3"
    ),
    Nested(
        "unary_2000", "y = " + "-" * 2000 + "1", f"expression depth 2002 > limit {DEPTH}, line 3"
    ),
    Nested("unary_100000", "y = " + "-" * 100_000 + "1", TOO_DEEP),
    Nested(
        "continued_chain",
        "y = (\n" + " +\n".join(["x"] * 3000) + "\n)",
        TOO_DEEP,
    ),
    Nested(
        "chain_with_syntax_error",
        "y = " + _chain(" + ", 3000) + " +",
        "has a logical line too long for the parser to check safely",
    ),
    # The learning pass (ast) walks the callee of every decode call: it once recursed here.
    Nested(
        "decode_call_attribute_chain",
        "y = a" + ".b" * 1500 + ".kda_replayssm_decode(g_cache=ring_gates)",
        f"expression depth 1505 > limit {DEPTH}, line 3",
    ),
    # Deep blocks: CPython's and libcst's tokenizers both stop at 100 levels, with a message.
    Nested(
        "blocks_150",
        "".join(" " * i + "if x:\n" for i in range(150)) + " " * 150 + "pass",
        "103:1: syntax error: too many levels of indentation",
    ),
    # At the limits: valid Python 3, linted (the RL001 finding below them is reported and fixed).
    Nested("parens_200", "y = " + "(" * LIMIT + "1" + ")" * LIMIT, None),
    Nested("plus_390", "y = " + _chain(" + ", 390), None),
    Nested("brackets_in_strings_and_comments", "y = '" + "(" * 5000 + "'  # " + "[" * 5000, None),
]
NESTED = {case.name: case for case in _NESTED_RAW}


@dataclass(frozen=True)
class TreeRun:
    done: subprocess.CompletedProcess[str]
    before: dict[str, bytes]
    after: dict[str, bytes]


@pytest.fixture(scope="module")
def nested_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TreeRun]:
    """One check run and one fix run over a tree holding every nesting case (subprocesses)."""
    results: dict[str, TreeRun] = {}
    for mode in ("check", "fix"):
        tree = tmp_path_factory.mktemp(f"nested-{mode}")
        for case in NESTED.values():
            (tree / f"{case.name}.py").write_bytes(
                RELEVANT
                + case.source.encode()
                + b"\ng_cache = torch.zeros(4, dtype=torch.bfloat16)\n"
            )
        (tree / "good.py").write_bytes(BUGGY)
        before = files_in(tree)
        args = ["--fix"] if mode == "fix" else []
        done, _, _ = replaylint(*args, "--no-cache", "--select", "RL001", ".", cwd=tree)
        results[mode] = TreeRun(done, before, files_in(tree))
    return results


@pytest.mark.parametrize("name", list(NESTED))
@pytest.mark.parametrize("mode", ["check", "fix"])
def test_deep_nesting_is_refused_with_a_message_never_a_crash(
    nested_runs: dict[str, TreeRun], name: str, mode: str
) -> None:
    case = NESTED[name]
    run = nested_runs[mode]
    done, before, after = run.done, run.before, run.after
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith(f"error: {name}.py")]
    file = f"{name}.py"
    if case.error is None:
        assert errors == []
        if mode == "fix":
            assert after[file] == before[file].replace(b"torch.bfloat16", b"torch.float32")
        else:
            assert f"{file}:" in done.stdout
        return
    [error] = errors
    if case.error[0].isdigit():  # a syntax error with Python's position
        assert error.startswith(f"error: {file}:{case.error}"), error
    else:
        assert error.startswith(f"error: {file}: "), error
        assert case.error in error, error
        assert error.endswith("; replaylint skipped it"), error
    assert after[file] == before[file]  # never modified
    assert after["good.py"] == (FIXED if mode == "fix" else BUGGY)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("'''" + "(" * 500 + "'''", id="triple-quoted"),
        pytest.param('"' + "[" * 500 + '\\"' + "(" * 500 + '"', id="escaped-quote"),
        pytest.param("'" + "\\\n" + "(" * 500 + "'", id="escaped-newline-in-string"),
        pytest.param("# " + "{" * 500, id="comment"),
        pytest.param("x = (\\\r\n" + "+".join(["1"] * 150) + ")", id="crlf-continuation"),
        pytest.param("'''" + "(" * 500, id="unterminated-triple-quote"),  # libcst reports it
    ],
)
def test_brackets_inside_strings_and_comments_do_not_count(source: str) -> None:
    check_parse_limits(source)


def test_limits_are_checked_exactly_at_the_boundary() -> None:
    check_parse_limits("y = " + "(" * MAX_BRACKET_DEPTH + ")" * MAX_BRACKET_DEPTH)
    with pytest.raises(ParseLimitError, match=r"bracket depth 201 > limit 200, line 2"):
        check_parse_limits("\n" + "{" * 201 + "}" * 201)
    # Module > Assign > UnaryOp * n > Constant: depth n + 2.
    check_parse_limits("y = " + "-" * (MAX_EXPRESSION_DEPTH - 2) + "1")
    with pytest.raises(ParseLimitError, match=rf"expression depth {MAX_EXPRESSION_DEPTH + 1} > "):
        check_parse_limits("y = " + "-" * (MAX_EXPRESSION_DEPTH - 1) + "1")
    # Statements nest too: a shorter chain inside 99 blocks reaches the limit.
    blocks = "".join(" " * i + "if x:\n" for i in range(99))
    with pytest.raises(ParseLimitError, match=r"expression depth \d+ > limit"):
        check_parse_limits(blocks + " " * 99 + "y = " + "-" * 300 + "1\n")
    check_parse_limits(blocks + " " * 99 + "y = " + "-" * 150 + "1\n")
    too_big = "x = 1\n" * (MAX_SOURCE_CHARS // 6 + 1)
    with pytest.raises(
        ParseLimitError, match=r"is too large for the parser \(1\.0 MB > limit 1 MB\)"
    ):
        check_parse_limits(too_big)


# a 10 MB file ------------------------------------------------------------------------------------


def _generated(megabytes: int, *, mentions_a_gate_cache: bool) -> bytes:
    lines = [b"import torch"]
    if mentions_a_gate_cache:  # a finding, and a decode call that the learning pass parses
        lines += [
            b"g_cache = torch.zeros(4, 16, dtype=torch.bfloat16)",
            b"out = kda_replayssm_decode(q, k, v, g_cache=ring_gates)",
        ]
    size, i = 0, 0
    while size < megabytes * 2**20:
        line = f"d_cache_{i} = torch.zeros({i % 7 + 1}, 16, dtype=torch.bfloat16)  # ring {i}"
        lines.append(line.encode())
        size += len(line) + 1
        i += 1
    return b"\n".join(lines) + b"\n"


# Generous bounds for a loaded 2-core CI machine; measured: 10 MB refused in ~1 s at ~0.1 GB peak
# (libcst itself would need minutes and 5+ GB).
TIME_BOUND_S = 60.0
MEMORY_BOUND = 1 << 30


@pytest.mark.parametrize("fix", [False, True], ids=["check", "fix"])
def test_ten_megabyte_file_is_refused_in_bounded_time_and_memory(tmp_path: Path, fix: bool) -> None:
    big = _generated(10, mentions_a_gate_cache=True)
    assert len(big) > 10 * 2**20 > MAX_SOURCE_CHARS
    (tmp_path / "big.py").write_bytes(big)
    (tmp_path / "good.py").write_bytes(BUGGY)
    args = ["--fix"] if fix else []
    done, seconds, peak = replaylint(*args, "--no-cache", "--select", "RL001", ".", cwd=tmp_path)
    print(f"10 MB file, {'fix' if fix else 'check'}: {seconds:.2f} s, peak {peak / 2**20:.0f} MiB")
    assert done.returncode == 2
    assert done.stderr == (
        f"error: big.py: is too large for the parser ({len(big) / 1e6:.1f} MB > limit "
        f"{MAX_SOURCE_CHARS / 1e6:.0f} MB); replaylint skipped it\n"
    )
    assert (tmp_path / "big.py").read_bytes() == big
    assert (tmp_path / "good.py").read_bytes() == (FIXED if fix else BUGGY)
    assert seconds < TIME_BOUND_S
    assert peak < MEMORY_BOUND


def test_ten_megabyte_file_without_a_gate_cache_is_never_parsed(tmp_path: Path) -> None:
    big = _generated(10, mentions_a_gate_cache=False).replace(b"d_cache", b"ring")
    (tmp_path / "big.py").write_bytes(big)
    done, seconds, peak = replaylint("--fix", "--no-cache", ".", cwd=tmp_path)
    print(f"10 MB file without a gate cache: {seconds:.2f} s, peak {peak / 2**20:.0f} MiB")
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "big.py").read_bytes() == big
    assert seconds < TIME_BOUND_S
    assert peak < MEMORY_BOUND


# two --fix runs at once --------------------------------------------------------------------------


def _racing_tree(root: Path) -> None:
    for i in range(24):
        body = (
            BUGGY
            if i % 3
            else b"from torch import bfloat16, zeros\ng_cache = zeros(4, dtype=bfloat16)\n"
        )
        (root / f"pkg{i % 4}").mkdir(exist_ok=True)
        (root / f"pkg{i % 4}" / f"m{i}.py").write_bytes(body * 1 + f"# file {i}\n".encode())
    (root / "clean.py").write_bytes(b"import torch\nd_cache = torch.zeros(2)\n")


@pytest.mark.parametrize("cache", [True, False], ids=["with-cache", "no-cache"])
def test_two_fix_runs_at_once_never_corrupt_a_file(tmp_path: Path, cache: bool) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    _racing_tree(reference)
    done, _, _ = replaylint("--fix", "--no-cache", "--jobs", "1", ".", cwd=reference)
    assert done.returncode == 0, done.stderr
    expected = files_in(reference)
    assert expected != {}

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    for round_ in range(3):
        tree = tmp_path / f"race{round_}"
        tree.mkdir()
        _racing_tree(tree)
        command = [sys.executable, "-m", "replaylint", "--fix", "."]
        if not cache:
            command.append("--no-cache")
        racers = [
            subprocess.Popen(
                command,
                cwd=tree,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [racer.communicate(timeout=300) for racer in racers]
        for racer, (_, stderr) in zip(racers, outputs, strict=True):
            # A run may find a file already fixed by the other (changed on disk: not overwritten).
            assert racer.returncode in (0, 2), stderr
            assert "Traceback" not in stderr
            for line in stderr.splitlines():
                assert line.endswith(
                    "changed on disk while replaylint was fixing it; not overwritten"
                ), line
        assert files_in(tree) == expected, f"round {round_}"  # no temporary file left either
        after, _, _ = replaylint(".", cwd=tree)
        assert (after.returncode, after.stderr) == (0, ""), after.stdout
