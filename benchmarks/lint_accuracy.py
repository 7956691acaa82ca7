"""How accurate is replaylint on code written the way real serving and model projects write it?

The corpus in ``benchmarks/accuracy/`` holds small packages in six styles (vLLM, transformers,
mamba_ssm, flash-linear-attention, TensorRT-LLM, sglang), in two halves with the same mix of
bugs: ``dev/`` (may be read to improve the linter) and ``heldout/`` (never tuned on; reported
separately as the estimate of how the linter generalises). Two more parts, ``fresh/`` and
``fresh2/``, hold packages in six further projects' styles each, written by authors who had not
read the linter; the first measurement of each is another unseen estimate, after which it is read
like ``dev/``. ``fresh3/`` (two packages, 17 bugs) is written the same way and, like ``heldout/``,
is not read; so are ``fresh4/`` (read after its first measurement), ``fresh5/`` (not read) and
``fresh6/`` (read after its first measurement), two packages and 34 bugs each, and ``fresh7/``
to ``fresh39/`` (one package and 17 bugs each, read after their first measurement). Each part has a ``registry.json``.

Labels are trailing comments on the buggy statements::

    g_ring = torch.zeros_like(d_ring)  # expect-bug: like
    ring_dtype = model_dtype  # expect-bug: imported-policy id=pool-policy

One statement where two bugs land carries both, separated by ``;``
(``# expect-bug: container id=a; imported-policy id=b``). A label covers every line of its statement (for a compound statement: its header). Labels that
share an ``id`` (within a package) are one bug that may be flagged at any of them; a label
without an id is a bug of its own. A finding is true when its first line lies on a labelled
statement, false otherwise. The labels are removed from the copy that is linted (line numbers
kept), so they cannot influence the linter.

For each half this script:

1. copies the packages to a temporary folder without their labels and runs
   ``replaylint check --output-format json --isolated --no-cache`` once per package (a package
   is linted as its own project, so names learned in one package do not help another; the runs
   share one interpreter);
2. scores recall (share of bugs with a finding) and precision (share of findings that are true)
   per style and per bug category;
3. runs every builder (``build_*`` functions named in the registry) in a subprocess with the
   package on ``sys.path``, twice on the original copy (to check the builders are
   deterministic) and once on a fresh copy after ``--fix --unsafe-fixes``;
4. counts a buggy builder (some gate cache not float32 before) as fixed when it still runs and
   every gate cache it returns is float32, and a correct builder as unchanged when every tensor
   it returns keeps its dtype, shape, values and aliasing.

Usage::

    python benchmarks/lint_accuracy.py [--half PART|all] [--json OUT] [--details]
    python benchmarks/lint_accuracy.py --half PART --corpus-only   # check a part without linting

Exit status: 0, or 1 when the corpus itself is inconsistent (a registry entry whose observed
gate dtypes contradict it, a builder that is not deterministic, a label that cannot be parsed).
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import fnmatch
import io
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent / "accuracy"
HALVES = (
    "dev",
    "heldout",
    "fresh",
    "fresh2",
    "fresh3",
    "fresh4",
    "fresh5",
    "fresh6",
    "fresh7",
    "fresh8",
    "fresh9",
    "fresh10",
    "fresh11",
    "fresh12",
    "fresh13",
    "fresh14",
    "fresh15",
    "fresh16",
    "fresh17",
    "fresh18",
    "fresh19",
    "fresh20",
    "fresh21",
    "fresh22",
    "fresh23",
    "fresh24",
    "fresh25",
    "fresh26",
    "fresh27",
    "fresh28",
    "fresh29",
    "fresh30",
    "fresh31",
    "fresh32",
    "fresh33",
    "fresh34",
    "fresh35",
    "fresh36",
    "fresh37",
    "fresh38",
    "fresh39",
)
CATEGORIES = (
    "pool-dtype",
    "default-dtype",
    "like",
    "load",
    "module-cast",
    "cast",
    "imported-policy",
    "promotion",
    "decode-arg",
    "container",
)
TARGETS = {"recall": 0.95, "precision": 0.98, "fix_rate": 0.90, "unchanged": 1.0}
LABEL = re.compile(r"#\s*expect-bug\b(?P<rest>.*)$")
LABEL_BODY = re.compile(r"^:\s*(?P<category>[a-z][a-z0-9-]*)(?:\s+id=(?P<id>[\w.-]+))?\s*$")
LINT_TIMEOUT_S = 300


@dataclass(frozen=True)
class Label:
    path: str
    """Posix path relative to the half's root, e.g. ``vllm_kda/cache.py``."""
    line: int
    first: int
    last: int
    category: str
    bug: str
    """The bug this label belongs to: ``package:id``, or ``path:line`` without an id."""


@dataclass(frozen=True)
class Finding:
    path: str
    row: int
    code: str
    message: str


@dataclass
class Tally:
    bugs: int = 0
    found: int = 0
    findings: int = 0
    true_findings: int = 0
    buggy_builders: int = 0
    fixed_builders: int = 0
    correct_builders: int = 0
    unchanged_builders: int = 0

    def ratios(self) -> dict[str, float | None]:
        def ratio(part: int, whole: int) -> float | None:
            return part / whole if whole else None

        return {
            "recall": ratio(self.found, self.bugs),
            "precision": ratio(self.true_findings, self.findings),
            "fix_rate": ratio(self.fixed_builders, self.buggy_builders),
            "unchanged": ratio(self.unchanged_builders, self.correct_builders),
        }


@dataclass
class HalfResult:
    half: str
    by_style: dict[str, Tally] = field(default_factory=dict)
    by_category: dict[str, Tally] = field(default_factory=dict)
    total: Tally = field(default_factory=Tally)
    missed: list[str] = field(default_factory=list)
    false_findings: list[str] = field(default_factory=list)
    builders: list[dict[str, Any]] = field(default_factory=list)
    corpus_errors: list[str] = field(default_factory=list)
    lint_errors: list[str] = field(default_factory=list)
    left_after_fix: list[str] = field(default_factory=list)
    """Findings ``--fix --unsafe-fixes`` reported and left in place (no fix, or a fix not applied)."""
    seconds: float = 0.0


# --- labels -------------------------------------------------------------------------------


def _comments(text: str) -> Iterator[tuple[int, int, str]]:
    """(line, column, text) of every comment token; strings that look like comments are not."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.start[1], token.string


def _statement_lines(tree: ast.Module, line: int) -> tuple[int, int]:
    """The lines of the innermost statement on ``line`` (a compound statement: its header)."""
    best: tuple[int, int] | None = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        first, last = node.lineno, node.end_lineno or node.lineno
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            last = max(first, body[0].lineno - 1)
        if first <= line <= last and (best is None or last - first < best[1] - best[0]):
            best = (first, last)
    if best is None:
        raise ValueError(f"line {line}: a label must be on a statement")
    return best


def parse_labels(path: str, text: str) -> list[Label]:
    """The labels of one file; ``path`` is relative to the half's root (package first)."""
    tree = ast.parse(text)
    package = path.split("/", 1)[0]
    labels: list[Label] = []
    for line, _, comment in _comments(text):
        match = LABEL.search(comment)
        if match is None:
            continue
        first, last = _statement_lines(tree, line)
        rest = match["rest"]
        if not rest.startswith(":"):
            raise ValueError(f"{path}:{line}: cannot read the label {comment!r}")
        for entry in rest.removeprefix(":").split(";"):
            body = LABEL_BODY.match(f": {entry.strip()}")
            if body is None or body["category"] not in CATEGORIES:
                raise ValueError(f"{path}:{line}: cannot read the label {comment!r}")
            bug = f"{package}:{body['id']}" if body["id"] else f"{path}:{line}"
            labels.append(Label(path, line, first, last, body["category"], bug))
    return labels


def strip_labels(text: str) -> str:
    """``text`` without its label comments; every other character and every line is kept."""
    lines = text.splitlines(keepends=True)
    for line, column, comment in _comments(text):
        if LABEL.search(comment):
            original = lines[line - 1]
            ending = original[len(original.rstrip("\r\n")) :]
            lines[line - 1] = original[:column].rstrip() + ending
    return "".join(lines)


def corpus_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def copy_without_labels(source: Path, target: Path) -> None:
    for path in corpus_files(source):
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(strip_labels(path.read_text(encoding="utf-8")), encoding="utf-8")


# --- scoring ------------------------------------------------------------------------------


def read_findings(report: str, root: Path) -> tuple[list[Finding], list[str]]:
    """Findings of one ``--output-format json`` report, and the files that could not be linted."""
    findings: list[Finding] = []
    errors: list[str] = []
    for entry in json.loads(report or "[]"):
        path = Path(entry["filename"]).resolve().relative_to(root.resolve()).as_posix()
        if entry["code"] is None:
            errors.append(f"{path}: {entry['message']}")
            continue
        row = int(entry["location"]["row"])
        findings.append(Finding(path, row, str(entry["code"]), str(entry["message"])))
    return findings, errors


def is_true(finding: Finding, labels: Iterable[Label]) -> Label | None:
    for label in labels:
        if label.path == finding.path and label.first <= finding.row <= label.last:
            return label
    return None


def score(
    result: HalfResult,
    labels: list[Label],
    findings: list[Finding],
    styles: dict[str, str],
    source_lines: dict[str, list[str]],
) -> None:
    """Adds recall and precision counts to ``result`` (per style, per category, in total)."""
    categories: dict[str, str] = {}
    for label in labels:
        if categories.setdefault(label.bug, label.category) != label.category:
            result.corpus_errors.append(f"{label.bug}: its labels name different categories")
    found: set[str] = set()
    for finding in findings:
        style = styles[finding.path.split("/", 1)[0]]
        hit = is_true(finding, labels)
        for tally in (result.by_style.setdefault(style, Tally()), result.total):
            tally.findings += 1
            tally.true_findings += hit is not None
        if hit is not None:
            found.add(hit.bug)
            result.by_category.setdefault(hit.category, Tally()).findings += 1
            result.by_category[hit.category].true_findings += 1
        else:
            code = source_lines[finding.path][finding.row - 1].strip()
            result.false_findings.append(f"{finding.path}:{finding.row}: {finding.code} `{code}`")
    by_bug: dict[str, list[Label]] = {}
    for label in labels:
        by_bug.setdefault(label.bug, []).append(label)
    for bug, alternatives in sorted(
        by_bug.items(), key=lambda item: (item[1][0].path, item[1][0].line)
    ):
        label = alternatives[0]
        style = styles[label.path.split("/", 1)[0]]
        tallies = (
            result.by_style.setdefault(style, Tally()),
            result.by_category.setdefault(label.category, Tally()),
            result.total,
        )
        for tally in tallies:
            tally.bugs += 1
            tally.found += bug in found
        if bug not in found:
            code = LABEL.sub("", source_lines[label.path][label.first - 1]).strip()
            others = ", ".join(f"{other.path}:{other.first}" for other in alternatives[1:])
            also = f" (or {others})" if others else ""
            result.missed.append(f"{label.path}:{label.first}: [{label.category}] `{code}`{also}")


# --- builders -----------------------------------------------------------------------------


def module_names(root: Path) -> list[str]:
    """Every module of the corpus half at ``root``, as imported with ``root`` on sys.path."""
    names = []
    for path in corpus_files(root):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        names.append(module.removesuffix(".__init__"))
    return names


def builder_names(root: Path) -> list[str]:
    """Every ``module:build_*`` function defined in the corpus half at ``root``."""
    names: list[str] = []
    for path in corpus_files(root):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("build_"):
                names.append(f"{module}:{node.name}")
    return names


def package_of(builder: str) -> str:
    """``vllm_kda`` for ``vllm_kda.cache:build_x``."""
    return builder.split(":", 1)[0].split(".", 1)[0]


def registered(registry: dict[str, Any], builder: str) -> tuple[bool, list[str]]:
    """What the registry says of a builder: buggy or not, and the patterns of its gate caches.

    An entry is ``true``/``false``, or ``{"buggy": ..., "gates": [...]}`` to override the
    package's gate patterns.
    """
    entry = registry["builders"][builder]
    if isinstance(entry, bool):
        entry = {"buggy": entry}
    patterns: list[str] = entry.get("gates", registry["packages"][package_of(builder)]["gates"])
    return bool(entry["buggy"]), patterns


def gate_paths(tensors: dict[str, Any], patterns: list[str]) -> list[str]:
    """The flattened paths (``a.0.g_cache``) that a gate pattern matches, whole or in one part."""
    return sorted(
        path
        for path in tensors
        if any(
            fnmatch.fnmatchcase(part, pattern)
            for pattern in patterns
            for part in (path, *path.split("."))
        )
    )


def run_builders(root: Path, targets: list[str], timeout_s: int = 120) -> dict[str, Any]:
    """Runs the builders in a fresh interpreter with ``root`` first on ``sys.path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "VLLM_"))}
    env["PYTHONPATH"] = str(root)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent / "lint_accuracy_builders.py")],
        input=json.dumps(targets),
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the builder runner failed:\n{done.stderr[-4000:]}")
    results: dict[str, Any] = json.loads(done.stdout)
    return results


def compare_builder(
    name: str,
    expected_buggy: bool,
    patterns: list[str],
    first: dict[str, Any],
    again: dict[str, Any],
    fixed: dict[str, Any],
) -> tuple[dict[str, Any], list[str]]:
    """One builder's outcome, and the corpus errors it shows."""
    errors: list[str] = []
    if first.get("error"):
        return {"builder": name, "outcome": "error before the fix"}, [f"{name}: {first['error']}"]
    if first != again:
        errors.append(f"{name}: two runs before the fix differ (not deterministic)")
    tensors = first["tensors"]
    gates = gate_paths(tensors, patterns)
    if not gates:
        errors.append(f"{name}: returns no gate cache (patterns {patterns})")
    buggy = any(tensors[path]["dtype"] != "torch.float32" for path in gates)
    if buggy != expected_buggy:
        errors.append(f"{name}: registry says buggy={expected_buggy}, observed buggy={buggy}")
    outcome: dict[str, Any] = {"builder": name, "buggy": buggy, "gates": gates}
    if fixed.get("error"):
        outcome["outcome"] = "error after the fix"
        outcome["error"] = fixed["error"]
    elif buggy:
        after = fixed["tensors"]
        wrong = [p for p in gate_paths(after, patterns) if after[p]["dtype"] != "torch.float32"]
        outcome["outcome"] = "fixed" if gate_paths(after, patterns) and not wrong else "not fixed"
        outcome["still_wrong"] = wrong
        # A fix should change the gate caches only: d/k rings and states keep their dtypes.
        outcome["other_dtypes_changed"] = sorted(
            path
            for path, summary in tensors.items()
            if path not in gates and after.get(path, {}).get("dtype") != summary["dtype"]
        )
    else:
        changed = sorted(
            path
            for path in set(tensors) | set(fixed["tensors"])
            if tensors.get(path) != fixed["tensors"].get(path)
        )
        same_aliases = first["aliases"] == fixed["aliases"]
        outcome["outcome"] = "unchanged" if not changed and same_aliases else "changed"
        outcome["changed"] = changed if same_aliases else [*changed, "(aliasing)"]
    return outcome, errors


# --- one half -----------------------------------------------------------------------------


# One interpreter lints every package in turn (each call to main is a run of its own, with its own
# learned names), which saves a start-up of Python and replaylint per package.
_LINT_RUNNER = """
import json, sys
from replaylint.cli import main
jobs = json.load(sys.stdin)
codes = {package: main([*jobs["options"], "-o", output, package]) for package, output in jobs["runs"]}
print(json.dumps(codes))
"""


def lint(root: Path, packages: list[str], *extra: str) -> tuple[list[Finding], list[str]]:
    """Findings of ``replaylint check`` run on each package under ``root`` as its own project."""
    options = ["check", "--output-format", "json", "--exit-zero", "--isolated", "--no-cache"]
    options += ["--jobs", "1", *extra]
    with tempfile.TemporaryDirectory(prefix="replaylint-accuracy-reports-") as reports:
        runs = [(package, str(Path(reports) / f"{package}.json")) for package in packages]
        done = subprocess.run(
            [sys.executable, "-c", _LINT_RUNNER],
            input=json.dumps({"options": options, "runs": runs}),
            cwd=root,
            capture_output=True,
            text=True,
            timeout=LINT_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the linter runner failed:\n{done.stderr[-4000:]}")
        findings: list[Finding] = []
        errors: list[str] = []
        for package, code in json.loads(done.stdout.strip().splitlines()[-1]).items():
            if code not in (0, 1):
                errors.append(f"{package}: exit {code}")
            report = (Path(reports) / f"{package}.json").read_text(encoding="utf-8")
            package_findings, package_errors = read_findings(report, root)
            findings += package_findings
            errors += package_errors
    return findings, errors


def evaluate_half(half: str, workdir: Path) -> HalfResult:
    started = time.perf_counter()
    source = CORPUS / half
    registry = json.loads((source / "registry.json").read_text(encoding="utf-8"))
    result = HalfResult(half)
    styles: dict[str, str] = {name: pkg["style"] for name, pkg in registry["packages"].items()}
    labels: list[Label] = []
    source_lines: dict[str, list[str]] = {}
    for path in corpus_files(source):
        relative = path.relative_to(source).as_posix()
        text = path.read_text(encoding="utf-8")
        source_lines[relative] = text.splitlines()
        try:
            labels += parse_labels(relative, text)
        except (ValueError, SyntaxError) as error:
            result.corpus_errors.append(str(error))
    checked, fixed_root = workdir / f"{half}-checked", workdir / f"{half}-fixed"
    copy_without_labels(source, checked)
    copy_without_labels(source, fixed_root)
    packages = sorted(styles)
    findings, result.lint_errors = lint(checked, packages)
    score(result, labels, findings, styles, source_lines)
    left, fix_errors = lint(fixed_root, packages, "--fix", "--unsafe-fixes")
    result.lint_errors += [f"--fix: {error}" for error in fix_errors]
    result.left_after_fix = [f"{f.path}:{f.row}: {f.code}" for f in left]

    declared: dict[str, Any] = registry["builders"]
    defined = builder_names(source)
    result.corpus_errors += [f"{n}: not in registry.json" for n in defined if n not in declared]
    result.corpus_errors += [
        f"{n}: in registry.json, not defined" for n in declared if n not in defined
    ]
    targets = [name for name in defined if name in declared]
    first, again = run_builders(checked, targets), run_builders(checked, targets)
    after = run_builders(fixed_root, targets)
    for name in targets:
        package = package_of(name)
        expected_buggy, patterns = registered(registry, name)
        outcome, errors = compare_builder(
            name, expected_buggy, patterns, first[name], again[name], after[name]
        )
        outcome["style"] = styles[package]
        result.builders.append(outcome)
        result.corpus_errors += errors
        for tally in (result.by_style.setdefault(styles[package], Tally()), result.total):
            if outcome.get("buggy"):
                tally.buggy_builders += 1
                tally.fixed_builders += outcome["outcome"] == "fixed"
            elif "buggy" in outcome:
                tally.correct_builders += 1
                tally.unchanged_builders += outcome["outcome"] == "unchanged"
    result.seconds = time.perf_counter() - started
    return result


def check_corpus(half: str) -> tuple[collections.Counter[str], list[str]]:
    """Bugs per category and the corpus errors of one part, without linting it.

    For authors of a part: labels parse, every builder is registered, runs twice with the same
    result and returns the gate dtypes the registry claims.
    """
    source = CORPUS / half
    registry = json.loads((source / "registry.json").read_text(encoding="utf-8"))
    errors: list[str] = []
    labels: list[Label] = []
    for path in corpus_files(source):
        try:
            labels += parse_labels(path.relative_to(source).as_posix(), path.read_text("utf-8"))
        except (ValueError, SyntaxError) as error:
            errors.append(str(error))
    categories = collections.Counter({label.bug: label.category for label in labels}.values())
    declared: dict[str, Any] = registry["builders"]
    defined = builder_names(source)
    errors += [f"{n}: not in registry.json" for n in defined if n not in declared]
    errors += [f"{n}: in registry.json, not defined" for n in declared if n not in defined]
    targets = [name for name in defined if name in declared]
    first, again = run_builders(source, targets), run_builders(source, targets)
    for name in targets:
        expected_buggy, patterns = registered(registry, name)
        errors += compare_builder(
            name, expected_buggy, patterns, first[name], again[name], first[name]
        )[1]
    return categories, errors


# --- report -------------------------------------------------------------------------------


def _cell(part: int, whole: int, target: float | None = None) -> str:
    if not whole:
        return "-"
    ratio = part / whole
    text = f"{part}/{whole} {ratio:.1%}"
    return f"{text} ({ratio / target:.2f}x)" if target else text


def table(result: HalfResult) -> str:
    head = "| {} | recall (>= 95%) | precision (>= 98%) | fixed (>= 90%) | unchanged (100%) |"
    rows = [head.format("style"), "| --- | --: | --: | --: | --: |"]

    def row(name: str, tally: Tally) -> str:
        return (
            f"| {name} | {_cell(tally.found, tally.bugs, TARGETS['recall'])} "
            f"| {_cell(tally.true_findings, tally.findings, TARGETS['precision'])} "
            f"| {_cell(tally.fixed_builders, tally.buggy_builders, TARGETS['fix_rate'])} "
            f"| {_cell(tally.unchanged_builders, tally.correct_builders, TARGETS['unchanged'])} |"
        )

    rows += [row(style, result.by_style[style]) for style in sorted(result.by_style)]
    rows.append(row("**total**", result.total))
    rows += ["", "| category | bugs found (recall) | true findings on it |", "| --- | --: | --: |"]
    for category in CATEGORIES:
        tally = result.by_category.get(category)
        if tally is not None:
            rows.append(
                f"| {category} | {_cell(tally.found, tally.bugs)} | {tally.true_findings} |"
            )
    return "\n".join(rows)


def report(result: HalfResult, details: bool) -> str:
    lines = [f"## {result.half} ({result.seconds:.1f} s)", "", table(result), ""]
    left = f"{len(result.left_after_fix)} of {result.total.findings} findings"
    lines += [f"{left} are left after --fix --unsafe-fixes (no fix, or not applied)."]
    collateral = [
        f"{b['builder']}: {', '.join(b['other_dtypes_changed'])}"
        for b in result.builders
        if b.get("other_dtypes_changed")
    ]
    lines += [
        f"{len(collateral)} buggy builders had the dtype of a tensor other than a gate cache changed by the fix.",
        "",
    ]
    sections = [("corpus errors", result.corpus_errors), ("lint errors", result.lint_errors)]
    if details:
        not_fixed = [
            f"{b['builder']}: {b['outcome']} {b.get('still_wrong') or b.get('changed') or b.get('error', '')}"
            for b in result.builders
            if b.get("outcome") not in ("fixed", "unchanged")
        ]
        sections += [
            ("missed bugs", result.missed),
            ("false findings", result.false_findings),
            ("builders not fixed or changed", not_fixed),
            ("findings left after --fix --unsafe-fixes", result.left_after_fix),
            ("buggy builders whose other tensors changed dtype", collateral),
        ]
    for title, items in sections:
        if items:
            lines += [f"{title} ({len(items)}):", *(f"  {item}" for item in items), ""]
    return "\n".join(lines)


def half_payload(result: HalfResult) -> dict[str, Any]:
    """``result`` as JSON-ready data, each tally with its ratios."""
    payload = dataclasses.asdict(result)
    tallies = [*payload["by_style"].values(), *payload["by_category"].values(), payload["total"]]
    for tally in tallies:
        tally["ratios"] = Tally(**tally).ratios()
    return payload


def environment() -> dict[str, str]:
    """Date, machine and the versions of everything the numbers depend on."""
    from importlib import metadata

    def version(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": str(os.cpu_count()),
        **{name: version(name) for name in ("replaylint", "libcst", "torch", "numpy")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parts = sorted(p.name for p in CORPUS.iterdir() if (p / "registry.json").is_file())
    parser.add_argument("--half", choices=[*parts, "all"], default="all")
    parser.add_argument("--json", type=Path, help="write every count and outcome to this file")
    parser.add_argument("--details", action="store_true", help="list missed and false findings")
    parser.add_argument(
        "--corpus-only",
        action="store_true",
        help="do not lint: check labels and builders, and count bugs per category",
    )
    args = parser.parse_args(argv)
    halves = HALVES if args.half == "all" else (args.half,)
    if args.corpus_only:
        failed = False
        for half in halves:
            categories, errors = check_corpus(half)
            print(f"## {half}: {sum(categories.values())} bugs")
            print("\n".join(f"  {name}: {count}" for name, count in sorted(categories.items())))
            print("\n".join(f"corpus error: {error}" for error in errors) or "no corpus errors")
            failed = failed or bool(errors)
        return 1 if failed else 0
    results: list[HalfResult] = []
    with tempfile.TemporaryDirectory(prefix="replaylint-accuracy-") as folder:
        for half in halves:
            results.append(evaluate_half(half, Path(folder)))
            print(report(results[-1], args.details), flush=True)
    if args.json:
        payload = {
            "environment": environment(),
            "targets": TARGETS,
            "halves": [half_payload(result) for result in results],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 1 if any(result.corpus_errors for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
