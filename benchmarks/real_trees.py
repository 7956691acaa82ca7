"""replaylint on real code no one here wrote: the sglang and fla-core wheels from PyPI.

Downloads each wheel (``pip download --no-deps``; skipped cleanly when there is no network),
unpacks its Python files, runs replaylint's two passes over every file — learning gate-cache
names from decode calls, then all rules — and prints a table: files, lines, learned names, how
many gate-cache bindings and decode calls the rules examined, findings per rule, parse errors,
and time. Correct code must give no finding.

Then it checks recall on the same real code: sglang's hybrid state pool
(``srt/mem_cache/memory_pool.py``) is copied with its gate ring broken in three ways, and each copy
must give exactly the expected finding at the expected line:

* RL002: the gate ring's ``dtype=torch.float32`` changed to ``dtype=ring_dtype``;
* RL003: that ``dtype=`` argument removed (the ring follows torch's default dtype);
* RL004: the ring cast with ``.to(ring_dtype)`` where it is handed to the pool's state object.

Usage::

    python benchmarks/real_trees.py [--cache DIR] [--jobs N] [--tree sglang] [--tree fla-core]
                                    [--json out.json]

Exit status: 0 when every tree is clean and every mutation is found (or nothing could be
downloaded), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from replaylint._version import __version__
from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.model import Finding, SourceError
from replaylint.lint.rules.base import Rule as GateCacheRule
from replaylint.lint.rules.registry import ALL_RULES

DEFAULT_TREES = ("sglang", "fla-core")
POOL = "sglang/srt/mem_cache/memory_pool.py"
CENSUS_BINDING = "RL901"
CENSUS_CALL = "RL902"


class _Census(GateCacheRule):
    """Not a rule: counts what the rules examined, so that "no finding" is not vacuous."""

    CODE = "RL900"
    NAME = "census"
    SUMMARY = "Counts gate-cache bindings and decode calls."
    RATIONALE = FIX = ""
    FIX_APPLICABILITY = None
    VALID = INVALID = ()

    def check_binding(self, binding: GateCacheBinding) -> None:
        self.context.add_finding(CENSUS_BINDING, binding.value, "binding", None)

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else None
        if isinstance(func, cst.Name):
            name = func.value
        if name and any(entry.matches(name) for entry in self.context.entry_points):
            self.context.add_finding(CENSUS_CALL, node, "call", None)


@dataclass
class FileResult:
    filename: str
    findings: list[Finding] = field(default_factory=list)
    bindings: int = 0
    calls: int = 0
    error: str | None = None


@dataclass
class TreeResult:
    name: str
    wheel: str
    files: int = 0
    lines: int = 0
    learned: dict[str, LearnedFrom] = field(default_factory=dict)
    bindings: int = 0
    calls: int = 0
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    learn_seconds: float = 0.0
    check_seconds: float = 0.0
    """Every file parsed and checked."""
    prefiltered_seconds: float = 0.0
    """The same, with the textual pre-filter skipping files that cannot hold a finding."""
    prefiltered_findings: list[Finding] = field(default_factory=list)


# --------------------------------------------------------------------------- fetching
def fetch(spec: str, cache: Path) -> tuple[Path, str] | None:
    """Download and unpack ``spec``'s wheel; returns (source folder, wheel name) or None."""
    folder = cache / re.sub(r"[^A-Za-z0-9_.-]", "_", spec)
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            spec,
            "-d",
            str(folder),
        ]
        try:
            subprocess.run(command, check=True, capture_output=True, timeout=600)
        except (subprocess.SubprocessError, OSError) as error:
            detail = getattr(error, "stderr", b"") or b""
            print(
                f"skip {spec}: could not download it ({detail.decode(errors='replace').strip()[-200:] or error})"
            )
            return None
        wheels = sorted(folder.glob("*.whl"))
        if not wheels:
            print(f"skip {spec}: pip downloaded no wheel")
            return None
    source = folder / "src"
    if not source.exists():
        with zipfile.ZipFile(wheels[-1]) as archive:
            for member in archive.namelist():
                if member.endswith(".py"):
                    archive.extract(member, source)
    return source, wheels[-1].name


# --------------------------------------------------------------------------- linting
_WORKER: Linter | None = None


def _init_worker(
    patterns: tuple[str, ...], learned: dict[str, LearnedFrom], prefilter: bool
) -> None:
    global _WORKER
    _WORKER = Linter(
        rules=(*ALL_RULES, _Census),
        gate_caches=GateCacheNames(patterns, learned),
        prefilter=prefilter,
    )


def _check_file(path: str) -> FileResult:
    assert _WORKER is not None
    result = FileResult(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
        findings = _WORKER.check(text, path)
    except (SourceError, UnicodeDecodeError) as error:
        result.error = f"{path}: {getattr(error, 'message', error)}"
        return result
    except Exception as error:  # a rule bug: report it, keep going
        result.error = f"{path}: INTERNAL ERROR {type(error).__name__}: {error}"
        return result
    for finding in findings:
        if finding.code == CENSUS_BINDING:
            result.bindings += 1
        elif finding.code == CENSUS_CALL:
            result.calls += 1
        else:
            result.findings.append(finding)
    return result


def lint_tree(name: str, wheel: str, source: Path, jobs: int) -> TreeResult:
    paths = sorted(str(p) for p in source.rglob("*.py"))
    tree = TreeResult(name, wheel, files=len(paths))
    texts = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        tree.lines += text.count("\n")
        texts.append((path, text))
    start = time.perf_counter()
    linter = Linter()
    names = linter.learn(texts)
    tree.learned = dict(names.learned)
    tree.learn_seconds = time.perf_counter() - start
    del texts
    # Every file parsed and checked (what the rules' precision rests on), then the way users
    # run it: files the textual pre-filter proves irrelevant are not parsed. Same findings.
    for prefilter in (False, True):
        init = (names.patterns, names.learned, prefilter)
        start = time.perf_counter()
        if jobs > 1:
            with multiprocessing.get_context("fork").Pool(jobs, _init_worker, init) as pool:
                results = pool.map(_check_file, paths, chunksize=8)
        else:
            _init_worker(*init)
            results = [_check_file(path) for path in paths]
        seconds = time.perf_counter() - start
        if prefilter:
            tree.prefiltered_seconds = seconds
            tree.prefiltered_findings = [f for r in results for f in r.findings]
            continue
        tree.check_seconds = seconds
        for result in results:
            tree.bindings += result.bindings
            tree.calls += result.calls
            tree.findings.extend(result.findings)
            if result.error:
                tree.errors.append(result.error)
    return tree


# --------------------------------------------------------------------------- mutations
@dataclass
class Mutation:
    code: str
    description: str
    expected_row: int
    found: list[tuple[int, str]]

    @property
    def ok(self) -> bool:
        return self.found == [(self.expected_row, self.code)]


def _gate_allocation(text: str) -> tuple[int, int]:
    """Offsets of ``replayssm_g = torch.zeros(`` and of its ``dtype=torch.float32``."""
    start = text.index("replayssm_g = torch.zeros(")
    dtype = text.index("dtype=torch.float32", start)
    if text.count("\n", start, dtype) > 3:
        raise ValueError("the gate ring allocation in memory_pool.py changed shape")
    return start, dtype


def _row(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def mutations(pool_source: str) -> list[tuple[str, str, str, int]]:
    """(code, description, mutated text, expected row) for each way to break the gate ring."""
    start, dtype = _gate_allocation(pool_source)
    cases = []
    broken = (
        pool_source[:dtype] + "dtype=ring_dtype" + pool_source[dtype + len("dtype=torch.float32") :]
    )
    cases.append(("RL002", "gate ring dtype=ring_dtype", broken, _row(pool_source, dtype)))
    line_start = pool_source.rindex("\n", 0, dtype) + 1
    line_end = pool_source.index("\n", dtype) + 1
    without = pool_source[:line_start] + pool_source[line_end:]
    call = start + len("replayssm_g = ")
    cases.append(("RL003", "gate ring without dtype=", without, _row(pool_source, call)))
    handed = pool_source.index("replayssm_g=replayssm_g,")
    cast = pool_source.replace(
        "replayssm_g=replayssm_g,", "replayssm_g=replayssm_g.to(ring_dtype),", 1
    )
    column_row = _row(pool_source, handed)
    cases.append(("RL004", "gate ring cast .to(ring_dtype) when handed over", cast, column_row))
    return cases


def run_mutations(source: Path, names: GateCacheNames) -> list[Mutation]:
    pool_path = source / POOL
    text = pool_path.read_text(encoding="utf-8")
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for code, description, mutated, row in mutations(text):
            path = Path(folder) / f"memory_pool_{code}.py"
            path.write_text(mutated, encoding="utf-8")
            linter = Linter(gate_caches=names)
            found = sorted((f.location.row, f.code) for f in linter.check(mutated, str(path)))
            results.append(Mutation(code, description, row, found))
    return results


# --------------------------------------------------------------------------- report
def _table(trees: Sequence[TreeResult], jobs: int) -> str:
    codes = [rule.CODE for rule in ALL_RULES]
    header = [
        *("tree", "wheel", "files", "lines", "learned", "bindings", "calls"),
        *codes,
        *("errors", "learn s", "all parsed s", "pre-filtered s", "lines/s (pre-filtered)"),
    ]
    rows = []
    for tree in trees:
        counts = Counter(f.code for f in tree.findings)
        total = tree.learn_seconds + tree.prefiltered_seconds
        rows.append(
            [tree.name, tree.wheel, str(tree.files), str(tree.lines), str(len(tree.learned)),
             str(tree.bindings), str(tree.calls)]
            + [str(counts.get(code, 0)) for code in codes]
            + [str(len(tree.errors)), f"{tree.learn_seconds:.1f}", f"{tree.check_seconds:.1f}",
               f"{tree.prefiltered_seconds:.1f}", f"{tree.lines / total:,.0f}" if total else "-"]
        )  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("-|-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines) + f"\n({jobs} worker process(es), replaylint {__version__})"


def _as_json(trees: Sequence[TreeResult], mutations: Sequence[Mutation]) -> dict[str, object]:
    return {
        "trees": [
            {
                "name": tree.name,
                "wheel": tree.wheel,
                "files": tree.files,
                "lines": tree.lines,
                "learned": sorted(tree.learned),
                "bindings": tree.bindings,
                "calls": tree.calls,
                "findings": [
                    {"file": f.filename, "row": f.location.row, "code": f.code}
                    for f in tree.findings
                ],
                "errors": tree.errors,
                "learn_seconds": tree.learn_seconds,
                "check_seconds": tree.check_seconds,
                "prefiltered_seconds": tree.prefiltered_seconds,
                "prefiltered_findings": len(tree.prefiltered_findings),
            }
            for tree in trees
        ],
        "mutations": [
            {"code": m.code, "expected_row": m.expected_row, "found": m.found} for m in mutations
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "replaylint-real-trees"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--tree", action="append", help="a pip requirement (default: sglang, fla-core)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs")
    trees: list[TreeResult] = []
    mutation_results: list[Mutation] = []
    for spec in args.tree or DEFAULT_TREES:
        fetched = fetch(spec, args.cache)
        if fetched is None:
            continue
        source, wheel = fetched
        tree = lint_tree(spec, wheel, source, args.jobs)
        trees.append(tree)
        if (source / POOL).exists():
            names = GateCacheNames().with_learned(tree.learned)
            mutation_results = run_mutations(source, names)
    if not trees:
        print("nothing downloaded: skipped")
        return 0
    print(_table(trees, args.jobs))
    for tree in trees:
        for name, origin in sorted(tree.learned.items()):
            print(f"  learned `{name}` in {tree.name}: {origin.describe()}")
        for finding in tree.findings:
            print(
                f"  FALSE POSITIVE? {finding.filename}:{finding.location.row}: {finding.code} {finding.message}"
            )
        for error in tree.errors:
            print(f"  not parsed: {error}")
    for mutation in mutation_results:
        verdict = "ok" if mutation.ok else "MISSED"
        print(
            f"mutation {mutation.code} ({mutation.description}): expected row "
            f"{mutation.expected_row}, found {mutation.found} -> {verdict}"
        )
    if args.json:
        args.json.write_text(json.dumps(_as_json(trees, mutation_results), indent=2))
    clean = all(not t.findings and not t.prefiltered_findings for t in trees)
    return 0 if clean and all(m.ok for m in mutation_results) else 1


if __name__ == "__main__":
    sys.exit(main())
