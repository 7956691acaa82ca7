"""How fast is replaylint on a real monorepo, next to the linters people already run?

Fetches the sglang wheel from PyPI (``pip download --no-deps``), unpacks its Python source to a
temporary folder and times, in one run and on the same tree:

* replaylint cold (``--no-cache``) and warm (cache filled by a previous run);
* ``ruff check --no-cache --isolated --select E9,F63`` (ruff's cheapest meaningful rule set);
* torchfix (installed into a private virtual environment, since it pins its own libcst);
* replaylint on a synthetic tree of the same size in which every file is relevant: each sglang
  file gets a small gate-cache function appended, so the textual pre-filter passes every file.

Each is run several times; the table gives median and spread (min-max) of wall time, the ratio to
ruff's median, and the peak resident memory of the whole process tree. Usage::

    python benchmarks/lint_speed.py [--runs 5] [--jobs N] [--skip-torchfix] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

SYNTHETIC_TAIL = """

def _replaylint_bench_ring(slots, heads, ring, dim, dtype, device):
    g_cache = torch.zeros(slots, heads, ring, dim, dtype=dtype, device=device)
    return g_cache
"""


@dataclass
class Timing:
    name: str
    seconds: list[float]
    peak_mb: float
    exit_codes: set[int]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
    except OSError:
        pass
    return found


def _tree_rss_kb(root_pid: int) -> int:
    """Resident memory of a process and all its descendants, from /proc (cheap to sample)."""
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        except OSError:
            continue
        stack.extend(_children(pid))
    return total


def run_timed(
    command: list[str], cwd: Path, timeout: float | None = None
) -> tuple[float, float, int]:
    """Wall seconds, peak tree RSS in MB (sampled every 20 ms), exit code (-9: timed out)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # so that a timeout can stop its worker processes too
    )
    peak = 0
    while process.poll() is None:
        peak = max(peak, _tree_rss_kb(process.pid))
        if timeout is not None and time.perf_counter() - start > timeout:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return time.perf_counter() - start, peak / 1024, -9
        time.sleep(0.02)
    elapsed = time.perf_counter() - start
    stderr = process.stderr.read().decode() if process.stderr else ""
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{command} exited {process.returncode}: {stderr[-2000:]}")
    return elapsed, peak / 1024, process.returncode


def measure(
    name: str, command: list[str], cwd: Path, runs: int, before: list[str] | None = None
) -> Timing:
    seconds, peaks, codes = [], [], set()
    for _ in range(runs):
        if before is not None:
            subprocess.run(before, cwd=cwd, check=False, capture_output=True)
        elapsed, peak, code = run_timed(command, cwd)
        seconds.append(elapsed)
        peaks.append(peak)
        codes.add(code)
    return Timing(name, seconds, max(peaks), codes)


def fetch_sglang(workdir: Path) -> tuple[Path, str]:
    wheels = workdir / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "sglang",
            "-d",
            str(wheels),
        ],
        check=True,
    )
    wheel = next(wheels.glob("sglang-*.whl"))
    tree = workdir / "sglang"
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.endswith(".py"):
                archive.extract(member, tree)
    return tree, wheel.name


def make_synthetic(tree: Path, target: Path) -> None:
    """Every file of ``tree``, each with a gate-cache allocation appended."""
    for path in tree.rglob("*.py"):
        out = target / path.relative_to(tree)
        out.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        prefix = "" if "import torch" in text else "import torch\n"
        out.write_text(prefix + text + SYNTHETIC_TAIL, encoding="utf-8", errors="surrogateescape")


def count_lines(tree: Path) -> tuple[int, int]:
    files = list(tree.rglob("*.py"))
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    return len(files), lines


def torchfix_command(workdir: Path) -> list[str] | None:
    venv = workdir / "torchfix-venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "torchfix"], check=True)
    except subprocess.CalledProcessError:
        return None
    return [str(venv / "bin" / "torchfix")]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--jobs", type=int, default=None, help="replaylint --jobs (default: its own)"
    )
    parser.add_argument("--skip-torchfix", action="store_true")
    parser.add_argument("--slow-runs", type=int, default=2, help="runs of the slow rows")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before a run is cut")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    args = parser.parse_args()

    replaylint = [
        sys.executable,
        "-m",
        "replaylint",
        "check",
        "--exit-zero",
        "--output-format",
        "concise",
    ]
    if args.jobs is not None:
        replaylint += ["--jobs", str(args.jobs)]
    ruff = shutil.which("ruff")
    if ruff is None:
        print("ruff is not installed: pip install ruff", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="replaylint-bench-") as scratch:
        workdir = Path(scratch)
        tree, wheel = fetch_sglang(workdir)
        synthetic = workdir / "synthetic"
        make_synthetic(tree, synthetic)
        files, lines = count_lines(tree)
        syn_files, syn_lines = count_lines(synthetic)
        cache = tree / ".replaylint_cache"

        timings = [
            measure(
                "ruff --select E9,F63 (cold)",
                [
                    ruff,
                    "check",
                    "--no-cache",
                    "--isolated",
                    "--select",
                    "E9,F63",
                    "--exit-zero",
                    ".",
                ],
                tree,
                args.runs,
            ),
            measure(
                "replaylint cold (--no-cache)", [*replaylint, "--no-cache", "."], tree, args.runs
            ),
        ]
        subprocess.run(
            [*replaylint, "."], cwd=tree, check=False, capture_output=True
        )  # fill the cache
        timings.append(
            measure("replaylint warm (cache filled)", [*replaylint, "."], tree, args.runs)
        )
        shutil.rmtree(cache, ignore_errors=True)
        if not args.skip_torchfix:
            command = torchfix_command(workdir)
            if command is not None:
                timings.append(measure("torchfix", [*command, "."], tree, 1, args.timeout))
        timings.append(
            measure(
                "replaylint cold, every file relevant",
                [*replaylint, "--no-cache", "."],
                synthetic,
                args.runs,
            )
        )

    ruff_median = timings[0].median
    cores = len(os.sched_getaffinity(0))
    print(
        f"\nreplaylint lint speed — {time.strftime('%Y-%m-%d')}, {platform.machine()}, {cores} cores, "
        f"Python {platform.python_version()}"
    )
    print(
        f"tree: {wheel}: {files} files, {lines:,} lines; synthetic: {syn_files} files, {syn_lines:,} lines\n"
    )
    header = (
        f"| {'run':<40} | {'median s':>9} | {'min-max s':>13} | {'x ruff':>7} | {'peak MB':>8} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(part) + 0) for part in header.split("|")[1:-1]) + "|")
    for t in timings:
        spread = f"{min(t.seconds):.2f}-{max(t.seconds):.2f}"
        if -9 in t.exit_codes:
            print(
                f"| {t.name:<40} | {'> ' + format(t.median, '.0f'):>9} | {'timed out':>13} | {'':>7} | {t.peak_mb:>8.0f} |"
            )
            continue
        print(
            f"| {t.name:<40} | {t.median:>9.2f} | {spread:>13} | {t.median / ruff_median:>7.2f} | {t.peak_mb:>8.0f} |"
        )
    relevant = timings[-1]
    print(
        f"\nevery file relevant: {syn_lines / relevant.median / cores:,.0f} lines/s per core "
        f"({syn_lines / relevant.median:,.0f} lines/s on {cores} cores)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "cores": cores,
                    "wheel": wheel,
                    "files": files,
                    "lines": lines,
                    "synthetic_lines": syn_lines,
                    "timings": [
                        {"name": t.name, "seconds": t.seconds, "peak_mb": t.peak_mb}
                        for t in timings
                    ],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
