"""Benchmark: a TensorBoard fleet scanned in one process, on worker processes, and on a Dask cluster,
in the same run (issue 14).

    python benchmarks/bench_parallel.py [--runs 100] [--steps 4000] [--repeat 2] [--no-dask]

Writes a fleet of runs with ``bench_tensorboard.write_fleet`` (one event file each, five tags per
step), then times ``pipeline.scan`` of it (read, stitch, judge; the findings detectors on) four ways,
each in a fresh child process so that every pool start-up is paid as a command-line scan pays it:

- ``--jobs 1``: everything in one process;
- ``--jobs 2``: the default thresholds decide whether a pool is worth starting;
- ``--jobs 2``, pool forced: thresholds of one;
- ``--dask``: a ``distributed.LocalCluster`` on loopback (two worker processes of one thread each,
  started once and kept, as a cluster is), the local scan's stitching in the child.

Prints the best wall time of ``--repeat`` runs of each, the ratios to ``--jobs 1``, the machine's
load, and whether every variant wrote the same JSON report (``generated_at`` aside). Not a test: a
speed-up depends on free cores, which a shared machine may not have.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tensorboard import write_fleet  # noqa: E402

CHILD = r"""
import json, sys, time
from klwatch.parallel import Execution
from klwatch.pipeline import ScanConfig, scan
from klwatch.report import to_json
if __name__ == "__main__":
    root, jobs, forced, dask = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] or None
    low = dict(pool_min_units=1, pool_min_bytes=1, pool_min_lineages=1) if forced else {}
    config = ScanConfig(execution=Execution(jobs=jobs, dask=dask, **low))
    started = time.perf_counter()
    result = scan([root], config=config)
    took = time.perf_counter() - started
    result.generated_at = "-"
    print(json.dumps({"seconds": took, "report": to_json(result)}))
"""


def run_child(*, root: Path, jobs: int, forced: bool, dask: str | None) -> tuple[float, str]:
    """Seconds one scan took in a fresh process, and its JSON report."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(jobs), "1" if forced else "0", dask or ""],
                         capture_output=True, text=True, timeout=1800, check=False)
    if out.returncode != 0:
        raise SystemExit(f"scan failed ({jobs=}, {forced=}, {dask=}):\n{out.stderr[-3000:]}")
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return float(doc["seconds"]), str(doc["report"])


def best_of(*, repeat: int, **kw: object) -> tuple[float, str, list[float]]:
    times, report = [], ""
    for _ in range(repeat):
        took, report = run_child(**kw)  # type: ignore[arg-type]
        times.append(took)
    return min(times), report, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-dask", action="store_true", help="leave the Dask LocalCluster out")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="klwatch-bench-parallel-") as tmp:
        root = Path(tmp) / "fleet"
        paths = write_fleet(root=root, runs=args.runs, steps=args.steps, batched=True)
        size = sum(p.stat().st_size for p in paths)
        print(f"fleet: {args.runs} runs x {args.steps:,} steps x 5 tags, {len(paths)} event files, "
              f"{size / 2**20:.1f} MiB; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")

        variants: list[tuple[str, dict[str, object]]] = [
            ("--jobs 1", dict(jobs=1, forced=False, dask=None)),
            ("--jobs 2 (default thresholds)", dict(jobs=2, forced=False, dask=None)),
            ("--jobs 2 (pool forced)", dict(jobs=2, forced=True, dask=None)),
        ]
        cluster = None
        if not args.no_dask:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address="127.0.0.1:0")
            variants.append(("--dask LocalCluster (2 workers)", dict(jobs=1, forced=False, dask=cluster.scheduler_address)))
        try:
            results = {name: best_of(root=root, repeat=args.repeat, **kw) for name, kw in variants}
        finally:
            if cluster is not None:
                cluster.close()

    base, base_report, _ = results["--jobs 1"]
    print(f"\n{'variant':34s} {'best s':>8s} {'vs --jobs 1':>12s}  runs (s)")
    for name, (took, report, times) in results.items():
        same = "" if report == base_report else "  REPORT DIFFERS"
        print(f"{name:34s} {took:8.2f} {base / took:11.2f}x  {', '.join(f'{t:.2f}' for t in times)}{same}")
    print(f"\nsame JSON report in every variant: {'yes' if all(r == base_report for _, r, _ in results.values()) else 'NO'}"
          f"; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
