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

    python benchmarks/lint_speed.py [--runs 5] [--slow-runs 1] [--jobs N] [--skip-torchfix]
        [--relevant-every N] [--workdir DIR] [--timeout S] [--json out.json]

``--relevant-every N`` builds the every-file-relevant tree from every N-th sglang file, to bound
the time of that row; ``--workdir`` keeps the download and unpacked tree for the next run.
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
    cpu_seconds: list[float]
    """User + system time of the whole process tree, per run."""
    load: tuple[float, float]
    """The 1-minute load average before the first and after the last run."""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_seconds)


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


def compile_bytecode() -> None:
    """Compiles replaylint's modules and libcst's to bytecode first, as ``pip install`` does: a
    source checkout run with PYTHONDONTWRITEBYTECODE set would compile them again on every run."""
    import libcst

    import replaylint

    for package in (replaylint, libcst):
        folder = Path(package.__file__).parent
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(folder)],
            env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            check=True,
            capture_output=True,
        )


def run_timed(
    command: list[str], cwd: Path, timeout: float | None = None
) -> tuple[float, float, int, float]:
    """Wall seconds, peak tree RSS in MB (sampled every 20 ms), exit code (-9: timed out) and the
    CPU seconds (user + system) of the process and every child it waited for."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # so that a timeout can stop its worker processes too
    )
    peak = 0
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid == process.pid:
            break
        peak = max(peak, _tree_rss_kb(process.pid))
        if timeout is not None and time.perf_counter() - start > timeout:
            os.killpg(process.pid, signal.SIGKILL)
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = -9
            return time.perf_counter() - start, peak / 1024, -9, usage.ru_utime + usage.ru_stime
        time.sleep(0.02)
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read().decode() if process.stderr else ""
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{command} exited {process.returncode}: {stderr[-2000:]}")
    return elapsed, peak / 1024, process.returncode, usage.ru_utime + usage.ru_stime


def measure(
    name: str,
    command: list[str],
    cwd: Path,
    runs: int,
    before: list[str] | None = None,
    timeout: float | None = None,
) -> Timing:
    seconds, peaks, codes, cpu = [], [], set(), []
    load_before = os.getloadavg()[0]
    for _ in range(runs):
        if before is not None:
            subprocess.run(before, cwd=cwd, check=False, capture_output=True)
        elapsed, peak, code, used = run_timed(command, cwd, timeout)
        seconds.append(elapsed)
        peaks.append(peak)
        codes.add(code)
        cpu.append(used)
        if code == -9:
            break  # timed out: do not spend more time on it
    return Timing(name, seconds, max(peaks), codes, cpu, (load_before, os.getloadavg()[0]))


def fetch_sglang(workdir: Path) -> tuple[Path, str]:
    """Download and unpack the sglang wheel into ``workdir`` (reused when already there)."""
    wheels = workdir / "wheels"
    tree = workdir / "sglang"
    existing = sorted(wheels.glob("sglang-*.whl")) if wheels.is_dir() else []
    if existing and tree.is_dir():
        return tree, existing[-1].name
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


def make_synthetic(tree: Path, target: Path, every: int = 1) -> None:
    """Every ``every``-th file of ``tree`` (in path order), each with a gate-cache allocation
    appended: every file it holds is relevant, and every one has a finding."""
    if target.is_dir():
        shutil.rmtree(target)
    for path in sorted(tree.rglob("*.py"))[::every]:
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


def _versions(ruff: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        replaylint_version = version("replaylint")
    except PackageNotFoundError:  # run from a checkout that is not installed
        from replaylint import __version__ as replaylint_version
    ruff_version = subprocess.run(
        [ruff, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return f"replaylint {replaylint_version}, libcst {version('libcst')}, {ruff_version}"


def _row(t: Timing, ruff_median: float) -> str:
    load = f"{t.load[0]:.1f}-{t.load[1]:.1f}"
    if -9 in t.exit_codes:
        return (
            f"| {t.name:<40} | {'> ' + format(t.median, '.0f'):>9} | {'timed out':>13} | "
            f"{'':>7} | {'':>7} | {t.peak_mb:>8.0f} | {load:>9} |"
        )
    spread = f"{min(t.seconds):.2f}-{max(t.seconds):.2f}"
    return (
        f"| {t.name:<40} | {t.median:>9.2f} | {spread:>13} | {t.median / ruff_median:>7.2f} | "
        f"{t.cpu_median:>7.2f} | {t.peak_mb:>8.0f} | {load:>9} |"
    )


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
    parser.add_argument(
        "--relevant-every",
        type=int,
        default=1,
        metavar="N",
        help="build the every-file-relevant tree from every N-th sglang file (default: all)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="download and unpack here, and reuse what is already there (default: a temp folder)",
    )
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
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        tree, wheel = fetch_sglang(workdir)
        synthetic = workdir / "synthetic"
        make_synthetic(tree, synthetic, args.relevant_every)
        files, lines = count_lines(tree)
        syn_files, syn_lines = count_lines(synthetic)
        cache = tree / ".replaylint_cache"
        shutil.rmtree(cache, ignore_errors=True)
        compile_bytecode()

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
                timings.append(measure("torchfix", [*command, "."], tree, 1, timeout=args.timeout))
        timings.append(
            measure(
                "replaylint cold, every file relevant",
                [*replaylint, "--no-cache", "."],
                synthetic,
                args.slow_runs,
                timeout=args.timeout,
            )
        )

    ruff_median = timings[0].median
    cores = len(os.sched_getaffinity(0))
    print(
        f"\nreplaylint lint speed — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{platform.machine()}, {cores} cores, Python {platform.python_version()}, "
        f"{_versions(ruff)}"
    )
    sample = "" if args.relevant_every == 1 else f" (every {args.relevant_every}th sglang file)"
    print(
        f"tree: {wheel}: {files} files, {lines:,} lines; every-file-relevant tree{sample}: "
        f"{syn_files} files, {syn_lines:,} lines\n"
    )
    header = (
        f"| {'run':<40} | {'median s':>9} | {'min-max s':>13} | {'x ruff':>7} | {'CPU s':>7} "
        f"| {'peak MB':>8} | {'load':>9} |"
    )
    print(header)
    print("|" + "|".join("-" * len(part) for part in header.split("|")[1:-1]) + "|")
    for t in timings:
        print(_row(t, ruff_median))
    relevant = timings[-1]
    if -9 not in relevant.exit_codes:
        print(
            f"\nevery file relevant: {syn_lines / relevant.median / cores:,.0f} lines/s per core "
            f"({syn_lines / relevant.median:,.0f} lines/s on {cores} cores, wall); "
            f"{syn_lines / relevant.cpu_median:,.0f} lines per CPU-second"
        )
    print(
        "CPU s: user + system time of the process and its workers; load: 1-minute load average "
        "before the first and after the last run of the row. replaylint's and libcst's modules "
        "are compiled to bytecode before the first run, as an install does."
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
                    "synthetic_files": syn_files,
                    "synthetic_lines": syn_lines,
                    "relevant_every": args.relevant_every,
                    "timings": [
                        {
                            "name": t.name,
                            "seconds": t.seconds,
                            "cpu_seconds": t.cpu_seconds,
                            "peak_mb": t.peak_mb,
                            "load": t.load,
                            "exit_codes": sorted(t.exit_codes),
                        }
                        for t in timings
                    ],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
