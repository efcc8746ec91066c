"""Benchmark: a TensorBoard fleet scanned in one process, on worker processes, and on a Dask cluster,
in the same run (issue 14); and on real Dask clusters of one and two worker processes (issue 26).

    python benchmarks/bench_parallel.py [--runs 100] [--steps 4000] [--repeat 2] [--no-dask]
    python benchmarks/bench_parallel.py --only clusters [--runs 2000] [--steps 4000] [--repeat 1] [--fleet DIR]

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

``--only clusters`` (issue 26, item 5) scans ``bench_fleet``'s fleet instead (``make``-style runs of
``--steps`` steps and five tags, each in one to three event files: a launch and its resumes; default
2,000 runs) on clusters of real processes: a ``dask scheduler`` and one, then two ``dask worker``
processes of one thread on 127.0.0.1 (``tests/dask_processes.py``; each cluster started before its
scans, as a cluster exists before a scan, and stopped after them). Timed, each scan in a fresh child
process: ``--jobs 1`` (the local baseline), ``--jobs 2`` (the local pool), ``--dask`` on 1 worker and
``--dask`` on 2 workers. Prints the ratios measured in this run (each against ``--jobs 1``; 2 workers
against 1) and whether the reports are identical byte for byte, the clock aside (exit code 1 if not).
Writing the fleet costs about as much as one scan; ``--fleet DIR`` keeps it for the next run.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

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


def print_table(results: dict[str, tuple[float, str, list[float]]], *, base: str) -> bool:
    """The best time of each variant and its ratio to ``base``; whether every report is ``base``'s."""
    base_took, base_report, _ = results[base]
    print(f"\n{'variant':34s} {'best s':>8s} {'speed-up':>12s}  runs (s)     (speed-up: {base}'s time / the variant's)")
    for name, (took, report, times) in results.items():
        same = "" if report == base_report else "  REPORT DIFFERS"
        print(f"{name:34s} {took:8.2f} {base_took / took:11.2f}x  {', '.join(f'{t:.2f}' for t in times)}{same}")
    return all(report == base_report for _, report, _ in results.values())


def bench_pool(args: argparse.Namespace) -> bool:
    """Issue 14: one process, the pool by its thresholds and forced, a ``LocalCluster``."""
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
            variants.append(("--dask LocalCluster (2 workers)",
                             dict(jobs=1, forced=False, dask=cluster.scheduler_address)))
        try:
            results = {name: best_of(root=root, repeat=args.repeat or 2, **kw) for name, kw in variants}
        finally:
            if cluster is not None:
                cluster.close()
    same = print_table(results, base="--jobs 1")
    print(f"\nsame JSON report in every variant: {'yes' if same else 'NO'}; load average now {os.getloadavg()[0]:.2f}")
    return same


def make_fleet(root: Path, *, runs: int, steps: int) -> list[Path]:
    """``bench_fleet``'s fleet in ``root``, written unless a fleet of that shape is already there."""
    from bench_fleet import write_fleet as write_make_fleet

    done = root / f".written-{runs}x{steps}"
    if done.exists():
        return sorted(root.rglob("events.out.tfevents.*"))
    if root.exists():
        raise SystemExit(f"{root} exists and holds no {runs} x {steps} fleet written by this benchmark")
    started = time.perf_counter()
    paths = write_make_fleet(root, runs=runs, steps=steps, batched=True)
    done.touch()
    print(f"  (fleet written in {time.perf_counter() - started:.0f} s)", flush=True)
    return paths


def on_cluster(folder: Path, *, workers: int, root: Path, repeat: int) -> tuple[float, str, list[float]]:
    """The best scan of ``root`` on a real cluster of ``workers`` worker processes, started for it."""
    from dask_processes import dask_processes

    with dask_processes(folder / f"cluster-{workers}", workers=workers) as cluster:
        return best_of(root=root, repeat=repeat, jobs=1, forced=False, dask=cluster.address)


def bench_clusters(args: argparse.Namespace) -> bool:
    """Issue 26, item 5: locally, and on real clusters of one and of two worker processes."""
    runs = args.runs or 2000
    with tempfile.TemporaryDirectory(prefix="klwatch-bench-clusters-") as tmp:
        root = Path(args.fleet) if args.fleet else Path(tmp) / "fleet"
        paths = make_fleet(root, runs=runs, steps=args.steps)
        size = sum(p.stat().st_size for p in paths)
        print(f"fleet: {runs} runs x {args.steps:,} steps x 5 tags, 1-3 launches each: {len(paths)} event files, "
              f"{size / 2**20:.0f} MiB; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}", flush=True)
        repeat = args.repeat or 1
        results = {
            "--jobs 1 (local)": best_of(root=root, repeat=repeat, jobs=1, forced=False, dask=None),
            "--jobs 2 (local pool)": best_of(root=root, repeat=repeat, jobs=2, forced=False, dask=None),
            "--dask, 1 worker process": on_cluster(Path(tmp), workers=1, root=root, repeat=repeat),
            "--dask, 2 worker processes": on_cluster(Path(tmp), workers=2, root=root, repeat=repeat),
        }
    same = print_table(results, base="--jobs 1 (local)")
    local, one = results["--jobs 1 (local)"][0], results["--dask, 1 worker process"][0]
    two = results["--dask, 2 worker processes"][0]
    print(f"\n2 workers vs 1 worker: {one / two:.2f}x; 2 workers vs local --jobs 1: {local / two:.2f}x; "
          f"1 worker vs local --jobs 1: {local / one:.2f}x")
    print(f"the four reports identical byte for byte (generated_at aside): {'yes' if same else 'NO'}; "
          f"load average now {os.getloadavg()[0]:.2f}")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["pool", "clusters"], default="pool",
                        help="pool: issue 14's comparison (default); clusters: real Dask clusters of 1 and 2 workers")
    parser.add_argument("--runs", type=int, default=None,
                        help="runs in the fleet (default 100; 2,000 with --only clusters)")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=None,
                        help="scans of each variant, the best kept (default 2; 1 for clusters)")
    parser.add_argument("--no-dask", action="store_true", help="leave the Dask LocalCluster out (pool)")
    parser.add_argument("--fleet", help="write the fleet here, or scan the one written here before (clusters)")
    args = parser.parse_args()
    if args.only == "pool":
        args.runs = args.runs or 100
    ok = bench_pool(args) if args.only == "pool" else bench_clusters(args)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
