"""Property tests over Python programs hypothesmith generates, with gate-cache code spliced in.

hypothesmith derives programs from Python's grammar (``from_grammar``) and, more slowly, from
libcst's node types (``from_node``); :func:`fuzz_strategies.spliced_programs` inserts a few
gate-cache statements between their top-level statements, because the pre-filter would skip a
program that names no gate cache and nothing would be exercised. The plain programs are linted
too (never raising is a property of every program).

CI runs a small, derandomized budget (the same examples every run, no example database).
Deep mode: ``REPLAYLINT_FUZZ_EXAMPLES=<n>`` runs n randomized examples per test, e.g.
``REPLAYLINT_FUZZ_EXAMPLES=3000 python -m pytest tests/lint/test_fuzz_programs.py -q``.
A failure prints the minimal program; keep it in ``test_fuzz_regressions.py``.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import hypothesmith
import pytest
from fuzz_strategies import Program, grammar_programs, spliced_programs
from fuzz_support import (
    assert_check_properties,
    assert_fix_properties,
    assert_prefilter_hides_nothing,
    fuzz_settings,
    python_compiles,
    time_limit,
)
from hypothesis import given
from hypothesis import strategies as st

from replaylint.cli import main
from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding

# hypothesmith compiles what it generates; `1()` and friends are valid but warned about.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")


@fuzz_settings(40)
@given(grammar_programs())
def test_linting_grammar_programs_never_raises(source: str) -> None:
    assert_check_properties(source)


@fuzz_settings(40)
@given(spliced_programs())
def test_linting_spliced_programs_never_raises(program: Program) -> None:
    assert_check_properties(program.source)


@fuzz_settings(40)
@given(spliced_programs())
def test_fixes_of_spliced_programs_are_sound(program: Program) -> None:
    assert_fix_properties(program.source, unsafe=True)


@fuzz_settings(40)
@given(spliced_programs())
def test_prefilter_hides_no_finding_in_spliced_programs(program: Program) -> None:
    assert_prefilter_hides_nothing(program.source)


@fuzz_settings(8, deep_share=0.25)
@given(spliced_programs(hypothesmith.from_node()))
def test_programs_from_libcst_nodes(program: Program) -> None:
    """from_node is ~5x slower to generate than from_grammar, but reaches other layouts."""
    assert_check_properties(program.source)
    assert_fix_properties(program.source)
    assert_prefilter_hides_nothing(program.source)


@fuzz_settings(6, deep_share=0.1)
@given(st.lists(spliced_programs(), min_size=1, max_size=4), st.booleans())
def test_cli_fix_over_a_tree_of_generated_files(programs: list[Program], parallel: bool) -> None:
    """The whole command line in-process, over a folder of generated files (the learning pass,
    workers, the cache, writing): exit 0 or 1, no internal error, every fixed file compiles."""
    with tempfile.TemporaryDirectory() as folder, time_limit():
        root = Path(folder)
        paths = []
        for number, program in enumerate(programs):
            path = root / f"module_{number}.py"
            path.write_bytes(program.source.encode())
            paths.append(path)
        out, err = io.StringIO(), io.StringIO()
        jobs = "2" if parallel else "1"
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["--fix", "--unsafe-fixes", "--jobs", jobs, str(root)])
        assert code in (0, 1), (code, out.getvalue(), err.getvalue())
        assert "internal error" not in out.getvalue() + err.getvalue()
        for path, program in zip(paths, programs, strict=True):
            fixed = path.read_bytes().decode()
            assert python_compiles(fixed) or not python_compiles(program.source), fixed


@pytest.mark.parametrize(("fix", "jobs"), [(False, "2"), (True, "1"), (True, "2")])
def test_an_internal_error_is_reported_with_its_file_and_the_others_are_linted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: str, fix: bool
) -> None:
    """A bug in the analysis must not stop the run: the file is reported as an internal error
    that names it (exit 2), it is not modified, and every other file is linted and fixed as
    usual. Nine files, so that with two jobs worker processes (forked: they inherit the
    planted bug) lint them."""
    check = Linter.check

    def check_with_a_bug(self: Linter, source: str, filename: str = "<stdin>") -> list[Finding]:
        if "explode_here" in source:
            raise ZeroDivisionError("a planted bug")
        return check(self, source, filename)

    monkeypatch.setattr(Linter, "check", check_with_a_bug)
    good = "import torch\ng_cache = torch.zeros(3, dtype=torch.bfloat16)\n"
    bad = good + "explode_here = 1\n"
    paths = [tmp_path / f"m{number}.py" for number in range(9)]
    for number, path in enumerate(paths):
        path.write_text(bad if number == 4 else good)
    out, err = io.StringIO(), io.StringIO()
    arguments = ["--no-cache", "--jobs", jobs, "--output-format", "concise", str(tmp_path)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--fix", *arguments] if fix else arguments)
    output = out.getvalue() + err.getvalue()
    assert code == 2, output
    assert f"{paths[4]}: internal error" in output
    assert "ZeroDivisionError: a planted bug" in output
    assert paths[4].read_text() == bad
    for number, path in enumerate(paths):
        if number == 4:
            continue
        if fix:
            assert path.read_text() == good.replace("bfloat16", "float32")
        else:
            assert f"{path}:2:" in output
    if not fix:
        assert output.count("RL001") == 8
