"""Benchmark: read a ``.wandb`` log of 100,000 history rows x 3 metrics, two ways, in the same run.

    python benchmarks/bench_wandb.py [--rows 100000] [--repeat 3] [--keep DIR] [--assemble]

The log is written by the real wandb client in offline mode (about a minute for 100,000
``run.log`` calls), or with ``--assemble`` built from wandb's own protobuf messages and the
LevelDB framing (seconds; the same records wandb-core writes: a summary update and a history row
per step). ``--keep DIR`` writes the log once into DIR and reuses it on later runs.

Compared, on the same file:
- ours: ``klwatch.sources.wandb_log.read_wandb_run_dir`` (batch protobuf decode; a large history's
  keys coded and its numbers parsed a column at a time by Arrow);
- baseline: the same un-framed records, each decoded with ``wandb_internal_pb2.Record`` and every
  history value with ``json.loads``, rows collected into a pandas DataFrame;
- protobuf only: the baseline without its values: the records un-framed and each parsed with
  ``wandb_internal_pb2.Record``, history items' ``value_json`` strings collected and not decoded
  (the cost of the protobuf parse alone of the file, through wandb's own classes).
Prints the best wall time and CPU time of ``--repeat`` runs (and their median and range: a busy
machine spreads them) and the ratios of the bests and of the medians (goals: ours at least 3x faster
than the baseline, and within 2x of the protobuf parse alone). Each reader's runs come one after the
other (taking turns would have each start on the heap the others left). Not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from klwatch.sources.wandb_log import read_records, read_wandb_run_dir  # noqa: E402
from wandb_framing import frame_wandb_log  # noqa: E402  (the tests' writer of the framing)

METRICS = ("train/kl_penalty", "train/reward", "train/loss")

WRITER = r"""
import math, sys, wandb
rows = int(sys.argv[1])
run = wandb.init(project="klwatch-bench", name="bench", config={"lr": 1e-6})
for i in range(rows):
    run.log({"train/kl_penalty": 0.01 * math.sin(i / 100), "train/reward": i * 1e-4,
             "train/loss": 1.0 / (i + 1)})
run.finish()
print(__import__("pathlib").Path(run.dir).parent)
"""


def write_with_client(*, folder: Path, rows: int) -> Path:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(folder), "WANDB_SILENT": "true",
           "WANDB_CONSOLE": "off", "WANDB_CONFIG_DIR": str(folder / "config")}
    out = subprocess.run([sys.executable, "-c", WRITER, str(rows)], env=env, check=True, text=True,
                         capture_output=True)
    return Path(out.stdout.strip().splitlines()[-1])


def assemble(*, folder: Path, rows: int) -> Path:
    """The records wandb-core writes for ``rows`` ``run.log`` calls, framed like it frames them."""
    from wandb.proto import wandb_internal_pb2 as pb

    run = pb.RunRecord(run_id="bench1", display_name="bench", project="klwatch-bench")
    run.config.update.add(key="lr", value_json="1e-06")
    records = [pb.Record(num=1, run=run).SerializeToString()]
    t0 = 1.76e9
    for i in range(rows):
        values = {"train/kl_penalty": 0.01 * math.sin(i / 100), "train/reward": i * 1e-4,
                  "train/loss": 1.0 / (i + 1), "_timestamp": t0 + 0.0005 * i, "_runtime": 0.5 + 0.0005 * i,
                  "_step": i}
        s = pb.SummaryRecord()
        h = pb.HistoryRecord()
        for k, v in values.items():
            s.update.add(nested_key=[k], value_json=json.dumps(v))
            h.item.add(nested_key=[k], value_json=json.dumps(v))
        h.step.SetInParent()
        rt = pb.SummaryRecord()
        rt.update.add(nested_key=["_wandb", "runtime"], value_json=str(int(0.0005 * i)))
        rt.update.add(key="_runtime", value_json=str(int(0.0005 * i)))
        records += [pb.Record(num=3 * i + 2, summary=rt).SerializeToString(),
                    pb.Record(num=3 * i + 3, summary=s).SerializeToString(),
                    pb.Record(num=3 * i + 4, history=h).SerializeToString()]
    run_dir = folder / "wandb" / "offline-run-20260101_000000-bench1"
    run_dir.mkdir(parents=True)
    (run_dir / "run-bench1.wandb").write_bytes(frame_wandb_log(records))
    return run_dir


def read_ours(run_dir: Path) -> dict[str, list[float]]:
    (seg,) = read_wandb_run_dir(run_dir, ref=run_dir.name, source=str(run_dir.parent))
    return {k: seg.series[k].values.tolist() for k in METRICS}


def read_baseline(run_dir: Path) -> dict[str, list[float]]:
    """Decode each record with wandb's own protobuf class and each value with ``json.loads``."""
    import pandas as pd
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = run_dir.glob("*.wandb")
    records, _ = read_records(log.read_bytes(), name=log.name)
    rows = []
    for payload in records:
        rec = pb.Record.FromString(payload)
        if rec.WhichOneof("record_type") == "history":
            rows.append({".".join(item.nested_key) or item.key: json.loads(item.value_json)
                         for item in rec.history.item})
    frame = pd.DataFrame(rows)
    return {k: frame[k].dropna().astype(float).tolist() for k in METRICS}


def read_protobuf_only(run_dir: Path) -> int:
    """Un-frame and parse every record with wandb's own class; take the history values as strings."""
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = run_dir.glob("*.wandb")
    records, _ = read_records(log.read_bytes(), name=log.name)
    n = 0
    for payload in records:
        rec = pb.Record.FromString(payload)
        if rec.WhichOneof("record_type") == "history":
            n += len([item.value_json for item in rec.history.item])
    return n


def timed(readers: dict[str, Any], run_dir: Path, repeat: int) -> tuple[dict[str, Times], dict[str, Any]]:
    """Each reader run ``repeat`` times in a row: the wall and CPU times of each run, and what it read."""
    times = {name: Times([], []) for name in readers}
    results: dict[str, Any] = {}
    for name, fn in readers.items():
        for _ in range(repeat):
            w, c = time.perf_counter(), time.process_time()
            results[name] = fn(run_dir)
            times[name].walls.append(time.perf_counter() - w)
            times[name].cpus.append(time.process_time() - c)
    return times, results


@dataclass
class Times:
    walls: list[float]
    cpus: list[float]

    def line(self) -> str:
        return (f"{min(self.walls):7.3f} s wall {min(self.cpus):7.3f} s CPU  (median {median(self.walls):.3f} s "
                f"wall, {min(self.walls):.3f}-{max(self.walls):.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--keep", type=Path, default=None, help="write the log here once, reuse it later")
    p.add_argument("--assemble", action="store_true", help="build the log from protobufs, not the client")
    args = p.parse_args()

    folder = args.keep or Path(tempfile.mkdtemp(prefix="klwatch-bench-wandb-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        run(folder=folder, args=args)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def run(*, folder: Path, args: argparse.Namespace) -> None:
    how = "assembled from wandb's protobufs + LevelDB framing" if args.assemble else "written by the real wandb client"
    existing = sorted(folder.glob("wandb/*run-*"))
    if existing:
        run_dir, how = existing[-1], f"reused from {existing[-1]}"
    else:
        t = time.perf_counter()
        run_dir = (assemble if args.assemble else write_with_client)(folder=folder, rows=args.rows)
        print(f"{args.rows} rows {how} in {time.perf_counter() - t:.1f} s")
    (log,) = run_dir.glob("*.wandb")
    print(f"log: {log} ({log.stat().st_size / 1e6:.1f} MB; {how})")

    import pandas  # noqa: F401 - imports are not what is timed
    import wandb.proto.wandb_internal_pb2  # noqa: F401

    times, results = timed({"ours": read_ours, "baseline": read_baseline, "protobuf": read_protobuf_only},
                           run_dir, args.repeat)
    ours, base = results["ours"], results["baseline"]
    same = all(len(ours[k]) == len(base[k]) and all(a == b for a, b in zip(ours[k], base[k])) for k in METRICS)
    n = len(ours[METRICS[0]])
    t_ours, t_base, t_pb = times["ours"], times["baseline"], times["protobuf"]
    print(f"rows read: {n} per metric; both readers agree: {same}")
    print(f"ours:     {t_ours.line()}")
    print(f"baseline: {t_base.line()}  (wandb Record per record, json.loads per value)")
    print(f"protobuf: {t_pb.line()}  (wandb Record per record, values not decoded)")
    print(f"ratio:    {min(t_base.walls) / min(t_ours.walls):7.1f}x wall  {min(t_base.cpus) / min(t_ours.cpus):7.1f}x CPU"
          f"  faster than the baseline (medians: {median(t_base.walls) / median(t_ours.walls):.1f}x wall)")
    print(f"          {min(t_ours.walls) / min(t_pb.walls):7.2f}x wall  {min(t_ours.cpus) / min(t_pb.cpus):7.2f}x CPU"
          f"  the time of the protobuf parse alone (medians: {median(t_ours.walls) / median(t_pb.walls):.2f}x wall)")


if __name__ == "__main__":
    main()
