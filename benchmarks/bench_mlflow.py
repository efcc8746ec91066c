"""Benchmark: klwatch's MLflow readers against MlflowClient.get_metric_history.

1. SQLite store of 100,000 points (logged with the real client's ``log_batch``): our read-only
   fast path (``read_mlflow_sqlite``) vs ``MlflowClient(tracking_uri="sqlite:///...")`` fetching
   every run's every metric history (target: at least 10x faster).
2. The same store served by a real ``mlflow server``: ``read_mlflow_server`` vs the client
   fetching every history through the same server.

Both sides must return the same points (checked before timing counts). Run:

    .venv/bin/python benchmarks/bench_mlflow.py [--points 100000] [--runs 4] [--keys 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from klwatch.sources.mlflow_local import read_mlflow_sqlite  # noqa: E402
from klwatch.sources.mlflow_server import read_mlflow_server  # noqa: E402
from tests.mlflow_server import start_mlflow_server  # noqa: E402


def build_store(db: Path, *, points: int, runs: int, keys: int) -> None:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.create_experiment("bench")
    per_series = points // (runs * keys)
    rng = np.random.default_rng(0)
    t0 = 1_700_000_000_000
    for r in range(runs):
        run = client.create_run(exp, run_name=f"run-{r}")
        rid = run.info.run_id
        batch: list[Metric] = []
        for step in range(per_series):
            for k in range(keys):
                batch.append(Metric(f"metric_{k}", float(rng.normal()), t0 + r * 10**8 + step * 1000, step))
                if len(batch) == 1000:  # log_batch's limit on metrics per call
                    client.log_batch(rid, metrics=batch)
                    batch = []
        if batch:
            client.log_batch(rid, metrics=batch)
        client.set_terminated(rid)


def client_read_all(tracking_uri: str) -> dict[tuple[str, str], list[tuple[int, float, int]]]:
    """What a user of the official client does: list runs, then every history one by one."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    out = {}
    exps = client.search_experiments()
    for run in client.search_runs([e.experiment_id for e in exps], max_results=50000):
        for key in run.data.metrics:
            hist = client.get_metric_history(run.info.run_id, key)
            out[(run.info.run_id, key)] = [(m.timestamp, m.value, m.step) for m in hist]
    return out


def ours_as_points(segments) -> dict[tuple[str, str], list[tuple[int, float, int]]]:
    out = {}
    for seg in segments:
        for key, s in seg.series.items():
            out[(seg.run_id, key)] = [(int(round(t * 1000)), float(v), int(st))
                                      for t, v, st in zip(s.wall_times, s.values, s.steps)]
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(sorted(a[k]) == sorted(b[k]) for k in a)


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--keys", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="mlflow server worker processes")
    ap.add_argument("--no-server", action="store_true")
    args = ap.parse_args()
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    os.environ.pop("MLFLOW_TRACKING_URI", None)

    work = Path(tempfile.mkdtemp(prefix="klwatch-bench-mlflow-"))
    try:
        db = work / "bench.db"
        t = time.perf_counter()
        build_store(db, points=args.points, runs=args.runs, keys=args.keys)
        print(f"store: {args.points:,} points = {args.runs} runs x {args.keys} metrics "
              f"(logged with log_batch in {time.perf_counter() - t:.1f}s)")

        # -- SQLite -------------------------------------------------------------------------------
        uri = f"sqlite:///{db}"
        client_read_all(uri)  # warm-up: imports, schema check; not timed
        t_client, ref = best_of(lambda: client_read_all(uri), args.repeat)
        t_ours, segs = best_of(lambda: read_mlflow_sqlite(db, ref=db.name, source=str(db)), args.repeat)
        ok = same(ours_as_points(segs), ref)
        print(f"sqlite  MlflowClient.get_metric_history: {t_client * 1000:9.1f} ms")
        print(f"sqlite  klwatch read_mlflow_sqlite:      {t_ours * 1000:9.1f} ms   "
              f"ratio {t_client / t_ours:6.1f}x   same points: {ok}")

        if args.no_server:
            return
        # -- server -------------------------------------------------------------------------------
        srv_dir = work / "server"
        srv_dir.mkdir()
        shutil.copy(db, srv_dir / "server.db")
        t = time.perf_counter()
        server = start_mlflow_server(workdir=srv_dir, workers=args.workers)
        print(f"mlflow server ({args.workers} workers) up in {time.perf_counter() - t:.1f}s at {server.url}")
        try:
            client_read_all(server.url)  # warm-up
            t_client, ref = best_of(lambda: client_read_all(server.url), args.repeat)
            t_ours, read = best_of(lambda: read_mlflow_server(server.spec), args.repeat)
            assert not read.errors, read.errors
            ok = same(ours_as_points(read.segments), ref)
            print(f"server  MlflowClient.get_metric_history: {t_client * 1000:9.1f} ms")
            print(f"server  klwatch read_mlflow_server:      {t_ours * 1000:9.1f} ms   "
                  f"ratio {t_client / t_ours:6.1f}x   same points: {ok}")
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
