"""The ``replaylint`` command line, following ruff's conventions.

Exit codes: 0 nothing left to report; 1 findings remain (or ``--diff`` has changes); 2 a usage or
configuration error, or a file that could not be read, parsed or written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from replaylint._version import __version__
from replaylint.lint.config.loading import ConfigError, load_settings, validate_selectors
from replaylint.lint.config.settings import Settings, apply_selection_layer
from replaylint.lint.model import FileReport, Mode
from replaylint.lint.report import RENDERERS
from replaylint.lint.report.summary import render_statistics, render_summary
from replaylint.lint.rules.catalogue import RULE_NAMES
from replaylint.lint.run.batch import lint_many
from replaylint.lint.run.cache import ResultCache
from replaylint.lint.run.files import FileProblem, decode_source
from replaylint.lint.run.one_file import lint_text
from replaylint.lint.run.projects import plan_projects
from replaylint.lint.run.workers import default_jobs

if TYPE_CHECKING:
    from replaylint.lint.engine import Linter

# The analysis (libcst and the rules) is imported only where a text is analysed or a rule
# explained: a run answered from the result cache never loads it.
EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
KNOWN_CODES = tuple(RULE_NAMES)


class UsageError(Exception):
    """Bad command-line arguments."""


def _selectors(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _check_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replaylint",
        description="Find and fix ReplaySSM gate caches that are not float32.",
        epilog="Subcommands: `replaylint check` (the default) and `replaylint rule CODE|--all`.",
    )
    parser.add_argument(
        "paths", nargs="*", type=Path, help="files or folders (default: .); - reads stdin"
    )
    parser.add_argument("--fix", action="store_true", help="apply fixes in place")
    parser.add_argument("--unsafe-fixes", action="store_true", help="also apply unsafe fixes")
    parser.add_argument(
        "--diff", action="store_true", help="print the diff --fix would make; write nothing"
    )
    parser.add_argument(
        "--select", action="append", metavar="CODES", help="rules to enable (codes or prefixes)"
    )
    parser.add_argument(
        "--extend-select", action="append", metavar="CODES", help="rules to enable in addition"
    )
    parser.add_argument("--ignore", action="append", metavar="CODES", help="rules to disable")
    parser.add_argument(
        "--output-format",
        choices=sorted(RENDERERS),
        default="text",
        help="output format (default: text)",
    )
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even when findings remain")
    parser.add_argument(
        "--statistics", action="store_true", help="print counts per rule instead of findings"
    )
    parser.add_argument(
        "--stdin-filename", metavar="PATH", help="the name of the file read from stdin"
    )
    parser.add_argument(
        "--config", type=Path, metavar="PATH", help="pyproject.toml or replaylint.toml to use"
    )
    parser.add_argument(
        "--force-exclude", action="store_true", help="apply `exclude` to paths named explicitly too"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        default=None,
        help="worker processes (default: the CPUs available to this process)",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="neither read nor write .replaylint_cache/"
    )
    parser.add_argument("--version", action="version", version=f"replaylint {__version__}")
    return parser


def _rule_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replaylint rule", description="Explain a rule.")
    parser.add_argument("code", nargs="?", help="a rule code such as RL001")
    parser.add_argument("--all", action="store_true", help="explain every rule")
    return parser


def _rule_command(argv: Sequence[str], out: TextIO) -> int:
    from replaylint.lint.rules.docs import rule_markdown
    from replaylint.lint.rules.registry import ALL_RULES, RULES_BY_CODE

    args = _rule_parser().parse_args(argv)
    if args.all:
        out.write("\n".join(rule_markdown(rule) for rule in ALL_RULES))
        return EXIT_OK
    if args.code is None:
        raise UsageError("give a rule code (e.g. `replaylint rule RL001`) or --all")
    rule = RULES_BY_CODE.get(args.code.upper())
    if rule is None:
        raise UsageError(f"unknown rule `{args.code}`; known rules: {', '.join(KNOWN_CODES)}")
    out.write(rule_markdown(rule))
    return EXIT_OK


def _settings(args: argparse.Namespace, start: Path) -> Settings:
    settings = load_settings(KNOWN_CODES, args.config, start)
    select, extend, ignore = (
        _selectors(args.select),
        _selectors(args.extend_select),
        _selectors(args.ignore),
    )
    if select is None and extend is None and ignore is None:
        return settings
    # The command line is a layer over the configuration (ruff's semantics): `--select` starts
    # afresh, `--extend-select` / `--ignore` adjust what the configuration enabled.
    enabled = apply_selection_layer(
        (code for code in KNOWN_CODES if settings.is_enabled(code)),
        KNOWN_CODES,
        None if select is None else validate_selectors(select, KNOWN_CODES, "--select"),
        validate_selectors(extend or (), KNOWN_CODES, "--extend-select"),
        validate_selectors(ignore or (), KNOWN_CODES, "--ignore"),
    )
    return replace(settings, select=enabled, extend_select=(), ignore=())


def _mode(args: argparse.Namespace) -> Mode:
    if args.diff:
        return Mode.DIFF
    return Mode.FIX if args.fix else Mode.CHECK


def _report(
    reports: Sequence[FileReport],
    args: argparse.Namespace,
    mode: Mode,
    out: TextIO,
    err: TextIO,
    unusable_paths: int = 0,
) -> int:
    for report in reports:
        for note in report.notes:
            err.write(f"warning: {note}\n")
        if report.error is not None:
            err.write(f"error: {report.error}\n")
    unreadable = unusable_paths + sum(r.error is not None for r in reports)
    if mode is Mode.DIFF:
        out.write("".join(r.diff for r in reports))
        if args.output_format == "text":
            err.write(render_summary(reports, mode, unreadable))
    elif args.statistics:
        out.write(render_statistics(reports, args.output_format))
    else:
        out.write(RENDERERS[args.output_format](reports))
        if args.output_format in {"text", "concise"}:
            out.write(render_summary(reports, mode, unreadable))
    if any(r.error is not None for r in reports):
        return EXIT_ERROR
    if args.exit_zero:
        return EXIT_OK
    if mode is Mode.DIFF:
        return EXIT_FINDINGS if any(r.changed for r in reports) else EXIT_OK
    return EXIT_FINDINGS if any(r.findings for r in reports) else EXIT_OK


def _echo_source(out: TextIO, data: bytes, text: str) -> None:
    """Write source to ``out`` as bytes, in the input's own encoding (cookie, BOM and line
    endings stay true); ``text`` serves streams without a byte buffer."""
    buffer = getattr(out, "buffer", None)
    if buffer is None:
        out.write(text)
        return
    out.flush()
    buffer.write(data)
    buffer.flush()


def _stdin(
    args: argparse.Namespace,
    settings: Settings,
    linter: Linter,
    mode: Mode,
    out: TextIO,
    err: TextIO,
) -> int:
    raw = sys.stdin.buffer.read()
    filename = args.stdin_filename or "-"
    try:
        text, encoding = decode_source(raw)
    except FileProblem as problem:
        err.write(f"error: {filename}: {problem}\n")
        if mode is Mode.FIX:  # an editor replaces its buffer with our stdout: hand it back
            _echo_source(out, raw, raw.decode("utf-8", "replace"))
        return EXIT_ERROR
    if args.stdin_filename and args.force_exclude and settings.is_excluded(Path(filename)):
        if mode is Mode.FIX:
            _echo_source(out, raw, text)
        return EXIT_OK
    linter.learn([(filename, text)])  # the only file of the run teaches its gate-cache names
    report, fixed = lint_text(linter, text, filename, mode, unsafe=args.unsafe_fixes)
    if mode is Mode.FIX:
        # The fixed source goes to stdout, so diagnostics go to stderr.
        _echo_source(out, raw if fixed == text else fixed.encode(encoding), fixed)
        return _report([report], args, mode, err, err)
    return _report([report], args, mode, out, err)


def _configuration_key(settings: Settings) -> str:
    """Everything besides a file's content that its results depend on."""
    return repr((settings, KNOWN_CODES))


def _check_command(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    args = _check_parser().parse_args(argv)
    paths: list[Path] = args.paths or [Path(".")]
    reading_stdin = any(str(p) == "-" for p in paths)
    if reading_stdin and len(paths) > 1:
        raise UsageError("`-` (stdin) cannot be combined with other paths")
    if args.stdin_filename and not reading_stdin:
        if args.paths:
            raise UsageError("--stdin-filename needs `-` as the only path")
        reading_stdin = True
    mode = _mode(args)
    if reading_stdin:
        from replaylint.lint.engine import Linter

        start = Path(args.stdin_filename).parent if args.stdin_filename else Path(".")
        settings = _settings(args, start)
        return _stdin(args, settings, Linter(settings), mode, out, err)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    # Each file follows its nearest configuration; each project learns from all its files.
    projects, errors = plan_projects(
        paths,
        lambda start: _settings(args, start),
        config=args.config,
        force_exclude=args.force_exclude,
    )
    reports = []
    for project in projects:
        cache = (
            None
            if args.no_cache
            else ResultCache(project.settings.root, _configuration_key(project.settings))
        )
        reports += lint_many(
            project.settings,
            project.files,
            mode,
            unsafe=args.unsafe_fixes,
            cache=cache,
            jobs=args.jobs or default_jobs(),
            # Only the text format shows source lines.
            keep_sources=args.output_format == "text"
            and not args.statistics
            and mode is not Mode.DIFF,
            learn_from=project.learning_files(),
        )
    reports.sort(key=lambda report: report.filename)
    for message in errors:
        err.write(f"error: {message}\n")
    status = _report(reports, args, mode, out, err, unusable_paths=len(errors))
    return EXIT_ERROR if errors else status


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    out, err = sys.stdout, sys.stderr
    try:
        if arguments[:1] == ["rule"]:
            return _rule_command(arguments[1:], out)
        if arguments[:1] == ["check"]:
            arguments = arguments[1:]
        return _check_command(arguments, out, err)
    except (UsageError, ConfigError) as error:
        err.write(f"replaylint: error: {error}\n")
        return EXIT_ERROR
    except SystemExit as exit_:  # argparse: --help/--version exit 0, bad usage exits 2
        return int(exit_.code or 0)
    except KeyboardInterrupt:
        err.write("replaylint: interrupted\n")
        return 130
