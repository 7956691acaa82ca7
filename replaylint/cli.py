"""The ``replaylint`` command line, following ruff's conventions.

Exit codes: 0 nothing left to report; 1 findings remain (or ``--diff`` has changes); 2 a usage or
configuration error, or a file that could not be read, parsed or written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from replaylint._version import __version__
from replaylint.lint.config.loading import ConfigError, load_settings, validate_selectors
from replaylint.lint.config.settings import Settings, apply_selection_layer
from replaylint.lint.model import FileReport, Mode
from replaylint.lint.report import HUMAN_FORMATS, RENDERERS
from replaylint.lint.report.summary import (
    render_fix_only_summary,
    render_statistics,
    render_summary,
)
from replaylint.lint.report.text import render_concise, render_text
from replaylint.lint.rules.catalogue import RULE_NAMES
from replaylint.lint.run.batch import lint_many
from replaylint.lint.run.cache import ResultCache
from replaylint.lint.run.discovery import discover
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


STATISTICS_FORMATS = ("text", "full", "concise", "json")


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
        epilog="Subcommands: `replaylint check` (the default), `replaylint rule CODE|--all` and "
        "`replaylint server` (the language server for editors).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "paths", nargs="*", type=Path, help="files or folders (default: .); - reads stdin"
    )
    parser.add_argument("--fix", action="store_true", help="apply fixes in place")
    parser.add_argument(
        "--fix-only",
        action="store_true",
        help="apply fixes in place and report nothing else; exit 0 unless a file could not be "
        "linted (implies --fix)",
    )
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
        "--extend-exclude",
        action="append",
        metavar="PATTERNS",
        help="path patterns to exclude in addition to the configured ones (comma-separated)",
    )
    parser.add_argument(
        "--per-file-ignores",
        action="append",
        metavar="PATTERN:CODES",
        help="rules to disable in files matching PATTERN, e.g. `tests/*:RL003,RL001`; "
        "replaces the configured per-file-ignores (repeatable)",
    )
    parser.add_argument(
        "--output-format",
        choices=sorted(RENDERERS),
        default="text",
        help="output format (default: text; full is an alias of text)",
    )
    parser.add_argument(
        "-o", "--output-file", type=Path, metavar="PATH", help="write the report to PATH"
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the text formats: auto (default) on a terminal unless NO_COLOR is set",
    )
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument(
        "-q", "--quiet", action="store_true", help="print findings and errors only, no summary"
    )
    verbosity.add_argument(
        "-v", "--verbose", action="store_true", help="say on stderr what the run did"
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
        "--isolated", action="store_true", help="ignore every configuration file (defaults only)"
    )
    parser.add_argument(
        "--show-settings", action="store_true", help="print the resolved settings and exit"
    )
    parser.add_argument(
        "--show-files", action="store_true", help="print the files that would be linted and exit"
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
    parser.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="lint again whenever a file changes, until interrupted (Ctrl-C)",
    )
    parser.add_argument("--version", action="version", version=f"replaylint {__version__}")
    return parser


def _rule_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replaylint rule", description="Explain a rule.", allow_abbrev=False
    )
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


def _per_file_ignores(values: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    table = []
    for value in values:
        pattern, separator, codes = value.rpartition(":")
        if not separator or not pattern.strip() or not codes.strip():
            raise UsageError(
                f"--per-file-ignores: expected PATTERN:CODES such as `tests/*:RL003`, got `{value}`"
            )
        selectors = _selectors([codes]) or []
        table.append(
            (pattern.strip(), validate_selectors(selectors, KNOWN_CODES, "--per-file-ignores"))
        )
    return tuple(table)


def _settings(args: argparse.Namespace, start: Path) -> Settings:
    if args.isolated:
        if args.config is not None:
            raise UsageError("--isolated ignores configuration files: drop --config or --isolated")
        settings = Settings(root=Path.cwd().absolute())
    else:
        settings = load_settings(KNOWN_CODES, args.config, start)
    if args.extend_exclude:
        extra = tuple(_selectors(args.extend_exclude) or ())
        settings = replace(settings, extend_exclude=settings.extend_exclude + extra)
    if args.per_file_ignores:
        settings = replace(settings, per_file_ignores=_per_file_ignores(args.per_file_ignores))
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


def _check_arguments(args: argparse.Namespace) -> None:
    """Refuse combinations that would silently do something else than asked."""
    if args.fix_only:
        args.fix = True
        if args.diff:
            raise UsageError("--fix-only writes fixes and --diff writes none: choose one")
        if args.statistics:
            raise UsageError("--fix-only reports no findings, so it has no --statistics")
    if args.diff and args.output_format not in HUMAN_FORMATS:
        raise UsageError(
            f"--diff prints a unified diff, not `{args.output_format}`: drop --output-format, "
            f"or drop --diff (`--output-format {args.output_format}` includes each finding's fix)"
        )
    if args.statistics and args.output_format not in STATISTICS_FORMATS:
        raise UsageError(
            f"--statistics prints text or json, not `{args.output_format}`: "
            "use `--output-format json` or drop one of the two options"
        )
    if args.watch and (args.diff or args.show_files or args.show_settings):
        raise UsageError("--watch lints again and again: it cannot be combined with that option")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")


def _mode(args: argparse.Namespace) -> Mode:
    if args.diff:
        return Mode.DIFF
    return Mode.FIX if args.fix else Mode.CHECK


def _use_colour(args: argparse.Namespace, stream: TextIO) -> bool:
    if args.output_format not in HUMAN_FORMATS or args.color == "never":
        return False
    if args.color == "always":
        return True
    if os.environ.get("NO_COLOR"):  # https://no-color.org: any non-empty value
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def _render(reports: Sequence[FileReport], args: argparse.Namespace, colour: bool) -> str:
    if args.fix_only:  # what remains is not reported; files that could not be linted are
        reports = [replace(report, findings=[]) for report in reports]
    if args.output_format in {"text", "full"}:
        return render_text(reports, colour=colour)
    if args.output_format == "concise":
        return render_concise(reports, colour=colour)
    return RENDERERS[args.output_format](reports)


def _report(
    reports: Sequence[FileReport],
    args: argparse.Namespace,
    mode: Mode,
    out: TextIO,
    err: TextIO,
) -> int:
    for report in reports:
        if not args.quiet:
            for note in report.notes:
                err.write(f"warning: {note}\n")
        if report.error is not None:
            err.write(f"error: {report.error}\n")
    unreadable = sum(r.error is not None for r in reports)
    human = args.output_format in HUMAN_FORMATS
    if mode is Mode.DIFF:
        out.write("".join(r.diff for r in reports))
        if not args.quiet:
            err.write(render_summary(reports, mode, unreadable))
    elif args.statistics:
        out.write(render_statistics(reports, "json" if args.output_format == "json" else "text"))
    else:
        out.write(_render(reports, args, _use_colour(args, out)))
        if human and not args.quiet:
            summary = render_fix_only_summary if args.fix_only else render_summary
            out.write(summary(reports, mode, unreadable))
    if any(r.error is not None for r in reports):
        return EXIT_ERROR
    if args.exit_zero or args.fix_only:
        return EXIT_OK
    if mode is Mode.DIFF:
        return EXIT_FINDINGS if any(r.changed for r in reports) else EXIT_OK
    return EXIT_FINDINGS if any(r.findings for r in reports) else EXIT_OK


@contextmanager
def _output(args: argparse.Namespace, out: TextIO) -> Iterator[TextIO]:
    """Where the report goes: ``--output-file`` (its folder created), else ``out``."""
    if args.output_file is None:
        yield out
        return
    path: Path = args.output_file
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("w", encoding="utf-8", newline="")
    except OSError as error:
        raise UsageError(
            f"cannot write the report to {path}: {error.strerror or error}; "
            "choose another --output-file"
        ) from None
    with handle:
        yield handle


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
        if mode is Mode.FIX:  # an editor replaces its buffer with our stdout: hand it back
            _echo_source(out, raw, raw.decode("utf-8", "replace"))
        report = FileReport(filename, error=f"{filename}: {problem}")
        with _output(args, err if mode is Mode.FIX else out) as stream:
            return _report([report], args, mode, stream, err)
    if args.stdin_filename and args.force_exclude and settings.is_excluded(Path(filename)):
        if mode is Mode.FIX:
            _echo_source(out, raw, text)
        return EXIT_OK
    linter.learn([(filename, text)])  # the only file of the run teaches its gate-cache names
    report, fixed = lint_text(linter, text, filename, mode, unsafe=args.unsafe_fixes)
    if mode is Mode.FIX:
        # The fixed source goes to stdout, so diagnostics go to stderr (or --output-file).
        _echo_source(out, raw if fixed == text else fixed.encode(encoding), fixed)
        with _output(args, err) as stream:
            return _report([report], args, mode, stream, err)
    with _output(args, out) as stream:
        return _report([report], args, mode, stream, err)


def _configuration_key(settings: Settings) -> str:
    """Everything besides a file's content that its results depend on."""
    return repr((settings, KNOWN_CODES))


def _show_settings(settings: Settings, out: TextIO) -> int:
    source = settings.config_path or "none (the defaults)"
    out.write(f"configuration file: {source}\n")
    out.write(f"enabled rules: {', '.join(c for c in KNOWN_CODES if settings.is_enabled(c))}\n")
    for field in fields(settings):
        value = getattr(settings, field.name)
        shown = str(value) if isinstance(value, Path) else repr(value)
        out.write(f"{field.name.replace('_', '-')}: {shown}\n")
    return EXIT_OK


def _not_found(paths: Sequence[Path], errors: Sequence[str]) -> list[FileReport]:
    """Discovery's errors (``path: reason``) as reports, so every format shows them."""
    reports = []
    for message in errors:
        named = next((str(p) for p in paths if message.startswith(f"{p}: ")), "")
        reports.append(FileReport(named or message.partition(": ")[0], error=message))
    return reports


def _check_command(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    args = _check_parser().parse_args(argv)
    _check_arguments(args)
    paths: list[Path] = args.paths or [Path(".")]
    reading_stdin = any(str(p) == "-" for p in paths)
    if reading_stdin and len(paths) > 1:
        raise UsageError("`-` (stdin) cannot be combined with other paths")
    if args.stdin_filename and not reading_stdin:
        if args.paths:
            raise UsageError("--stdin-filename needs `-` as the only path")
        reading_stdin = True
    start = Path(args.stdin_filename).parent if args.stdin_filename else paths[0]
    settings = _settings(args, start if reading_stdin else paths[0])
    if args.show_settings:
        return _show_settings(settings, out)
    mode = _mode(args)
    if args.verbose:
        err.write(f"replaylint {__version__}: configuration {settings.config_path or 'none'}\n")
    if reading_stdin:
        if args.watch:
            raise UsageError("--watch needs files to watch, not stdin")
        if args.show_files:
            out.write(f"{args.stdin_filename or '-'}\n")
            return EXIT_OK
        from replaylint.lint.engine import Linter

        return _stdin(args, settings, Linter(settings), mode, out, err)
    if args.show_files:
        files, errors = discover(paths, settings, force_exclude=args.force_exclude)
        out.write("".join(f"{item.path}\n" for item in files))
        for message in errors:
            err.write(f"error: {message}\n")
        return EXIT_ERROR if errors else EXIT_OK
    if args.watch:
        return _watch(args, paths, settings, mode, out, err)
    return _run_paths(args, paths, mode, out, err)


def _run_paths(
    args: argparse.Namespace,
    paths: Sequence[Path],
    mode: Mode,
    out: TextIO,
    err: TextIO,
) -> int:
    began = time.perf_counter()
    # Each file follows its nearest configuration; each project learns from all its files.
    projects, errors = plan_projects(
        paths,
        lambda start: _settings(args, start),
        config=args.config,
        isolated=args.isolated,
        force_exclude=args.force_exclude,
    )
    jobs = args.jobs or default_jobs()
    reports: list[FileReport] = []
    linted = 0
    for project in projects:
        cache = (
            None
            if args.no_cache
            else ResultCache(project.settings.root, _configuration_key(project.settings))
        )
        linted += len(project.files)
        reports += lint_many(
            project.settings,
            project.files,
            mode,
            unsafe=args.unsafe_fixes,
            cache=cache,
            jobs=jobs,
            # Only the text format shows source lines.
            keep_sources=args.output_format in {"text", "full"}
            and not args.statistics
            and mode is not Mode.DIFF,
            learn_from=project.learning_files(),
        )
    reports.sort(key=lambda report: report.filename)
    reports.extend(_not_found(paths, errors))
    if args.verbose:
        err.write(
            f"replaylint: {linted} file{'' if linted == 1 else 's'} linted in "
            f"{time.perf_counter() - began:.2f} s "
            f"({jobs} jobs, result cache {'off' if args.no_cache else 'on'})\n"
        )
    with _output(args, out) as stream:
        return _report(reports, args, mode, stream, err)


_WATCH_INTERVAL_S = 0.3


def _snapshot(args: argparse.Namespace, paths: Sequence[Path], settings: Settings) -> object:
    """What a change is seen by: each file's path, size and modification time."""
    files, errors = discover(paths, settings, force_exclude=args.force_exclude)
    state = []
    for item in files:
        try:
            status = item.path.stat()
        except OSError:
            state.append((str(item.path), -1, -1))
            continue
        state.append((str(item.path), status.st_size, status.st_mtime_ns))
    return (tuple(state), tuple(errors))


def _watch(
    args: argparse.Namespace,
    paths: Sequence[Path],
    settings: Settings,
    mode: Mode,
    out: TextIO,
    err: TextIO,
) -> int:
    """Lint, then lint again whenever a file is added, removed or changed, until interrupted."""
    while True:
        seen = _snapshot(args, paths, settings)
        _run_paths(args, paths, mode, out, err)
        err.write(f"[{time.strftime('%H:%M:%S')}] Watching for file changes.\n")
        out.flush()
        err.flush()
        # A --fix run changes the files it fixes: compare against the state after it.
        seen = _snapshot(args, paths, settings) if mode is Mode.FIX else seen
        while _snapshot(args, paths, settings) == seen:
            time.sleep(_WATCH_INTERVAL_S)
        out.write("\n")


def _server_command(argv: Sequence[str]) -> int:
    from replaylint.server import MissingExtraError, serve

    try:
        return serve(argv)
    except MissingExtraError as error:
        raise UsageError(str(error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    out, err = sys.stdout, sys.stderr
    try:
        if arguments[:1] == ["rule"]:
            return _rule_command(arguments[1:], out)
        if arguments[:1] == ["server"]:
            return _server_command(arguments[1:])
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
