"""Benchmark (issue 26, item 1): a scan's peak memory against the size of the fleet.

    python benchmarks/bench_memory.py [--small 100] [--runs 2000] [--steps 4000]
        [--fleet DIR] [--small-fleet DIR] [--reference CHECKOUT] [--reports DIR]

Scans ``bench_fleet``'s make-style TensorBoard fleet (``bench_parallel.make_fleet``: 4,000 steps, 5
tags, 1-3 launches per run) of ``--small`` runs and of ``--runs`` runs, each cold in a fresh child
process (``--jobs 1``, no scan cache), and takes each child's peak RSS from the kernel
(``os.wait4``'s rusage of that child alone). Printed, each measured in this run: the peak RSS and wall
time of both scans and their ratios (target: RSS(large)/RSS(small) <= 1.2).

``--reference CHECKOUT`` (a checkout of klwatch, e.g. ``git worktree add /tmp/klwatch-old <commit>``)
scans the small fleet with that code too (``--reference-large``: the large one as well) and prints
whether its JSON report is the same byte for byte (``generated_at`` aside), with its RSS beside.
``--reports DIR`` keeps every report there (``<label>-<runs>.json``); a reference report already
there is used instead of scanning again. Exit code 1 when a report differs. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_parallel import make_fleet  # noqa: E402  (bench_fleet's generator, with its written-marker)

CHILD = r"""
import sys
from klwatch.cli import main
sys.argv = ["klwatch", "scan", sys.argv[1], "--format", "json", "-o", sys.argv[2], "--jobs", "1", "--no-cache"]
main()
"""


def scan_child(root: Path, report: Path, *, package: Path | None = None) -> tuple[float, float]:
    """Peak RSS (MiB) and wall seconds of one cold ``klwatch scan`` in a fresh process; ``package``: a
    folder holding the ``klwatch`` package to use instead of the installed one."""
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = str(package)
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(report)], env=env, cwd="/",
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    took = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1, 3) or not report.exists():
        raise SystemExit(f"scan of {root} failed ({code}): {child.stderr.read().decode()[-3000:]}")
    return usage.ru_maxrss / 1024, took


def report_text(path: Path) -> str:
    """A JSON report without its ``generated_at``: what must be the same byte for byte."""
    doc = json.loads(path.read_text())
    doc["generated_at"] = "-"
    return json.dumps(doc, indent=2)


def reference_package(checkout: Path, work: Path) -> Path:
    """A folder whose ``klwatch`` is the checkout's ``detectors/`` (the package's own name for it)."""
    folder = work / "reference-package"
    folder.mkdir(exist_ok=True)
    link = folder / "klwatch"
    if not link.exists():
        link.symlink_to(checkout.resolve() / "detectors")
    return folder


def measure(label: str, root: Path, runs: int, reports: Path, *, package: Path | None = None) -> tuple[float, float]:
    """Scan ``root`` (or reuse a kept reference report), print its figures; (peak RSS MiB, seconds)."""
    out = reports / f"{label}-{runs}.json"
    if package is not None and out.exists() and (reports / f"{label}-{runs}.rss").exists():
        rss, took = (float(x) for x in (reports / f"{label}-{runs}.rss").read_text().split())
        print(f"  {label:10s} {runs:6d} runs: peak RSS {rss:8.1f} MiB, {took:7.1f} s (kept from an earlier run)")
        return rss, took
    out.unlink(missing_ok=True)
    rss, took = scan_child(root, out, package=package)
    (reports / f"{label}-{runs}.rss").write_text(f"{rss} {took}")
    print(f"  {label:10s} {runs:6d} runs: peak RSS {rss:8.1f} MiB, {took:7.1f} s", flush=True)
    return rss, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=100, help="runs in the small fleet (default 100)")
    parser.add_argument("--runs", type=int, default=2000, help="runs in the large fleet (default 2,000)")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--fleet", type=Path, help="the large fleet: written here, or the one written here before")
    parser.add_argument("--small-fleet", type=Path,
                        help="the small fleet: written here, or the one written here before")
    parser.add_argument("--reference", type=Path, help="a klwatch checkout whose reports must be the same")
    parser.add_argument("--reference-large", action="store_true", help="scan the large fleet with it too")
    parser.add_argument("--reports", type=Path, help="keep the reports (and reuse the reference's) here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="klwatch-bench-memory-") as tmp:
        work = Path(tmp)
        reports = args.reports or work / "reports"
        reports.mkdir(parents=True, exist_ok=True)
        small = make_fleet(args.small_fleet or work / "small", runs=args.small, steps=args.steps)
        large = make_fleet(args.fleet or work / "large", runs=args.runs, steps=args.steps)
        roots = {args.small: (args.small_fleet or work / "small"), args.runs: (args.fleet or work / "large")}
        print(f"fleets: {args.small} runs ({len(small)} event files), {args.runs} runs ({len(large)} event files), "
              f"{args.steps:,} steps x 5 tags; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
        figures = {n: measure("klwatch", roots[n], n, reports) for n in (args.small, args.runs)}
        ratio = figures[args.runs][0] / figures[args.small][0]
        print(f"\npeak RSS {args.runs} runs / {args.small} runs: {ratio:.2f}x (target <= 1.2x)")
        print(f"wall time {args.runs} runs / {args.small} runs: {figures[args.runs][1] / figures[args.small][1]:.1f}x "
              f"({args.runs / args.small:.0f}x the runs)")
        same = True
        if args.reference:
            package = reference_package(args.reference, reports)
            for n in (args.small, args.runs) if args.reference_large else (args.small,):
                rss, _ = measure("reference", roots[n], n, reports, package=package)
                equal = report_text(reports / f"klwatch-{n}.json") == report_text(reports / f"reference-{n}.json")
                same = same and equal
                print(f"  {n} runs: the report equals the reference's byte for byte (generated_at aside): "
                      f"{'yes' if equal else 'NO'}; peak RSS reference / now {rss / figures[n][0]:.2f}x")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
