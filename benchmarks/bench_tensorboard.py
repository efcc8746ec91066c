"""Benchmark: read one TensorBoard event file of 100,000 scalars three ways, in the same run.

    python benchmarks/bench_tensorboard.py [--points 100000] [--tags 4] [--repeat 3]
                                           [--writer tensorboardX|summary.Writer]
    python benchmarks/bench_tensorboard.py --fleet [--runs 100] [--steps 4000] [--repeat 1]

``--fleet`` writes a fleet of runs (one event file each, five tags per step), once with each
event holding the five tags of one step (as writers that batch a step's summaries write) and
once with one tag per event, and reads every file with klwatch, tbparse and a bare protobuf loop
(``Event.FromString`` of each record, no CRC check), printing the ratios (issue 14).

Compares klwatch's reader (klwatch.sources.tensorboard) with tbparse's SummaryReader and with
TensorBoard's EventAccumulator(size_guidance={"scalars": 0}) (the setting that keeps every point).
Prints the best wall time of ``--repeat`` runs, the peak memory each reader allocates (tracemalloc,
in one fresh child process per reader) and the ratios. Not a test: the target (at least 5x
faster than tbparse) is checked by reading the output.
"""

from __future__ import annotations

import argparse
import importlib
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klwatch.sources.tensorboard import read_tensorboard_file  # noqa: E402


def write_event_file(*, folder: Path, points: int, tags: int, writer_kind: str) -> Path:
    """One event file, ``points`` scalars spread over ``tags`` tags.

    ``tensorboardX`` writes ``simple_value`` scalars (as torch does); ``summary.Writer`` writes v2
    tensor scalars (as TF2 and ``tensorboard.summary.Writer`` do).
    """
    names = [f"train/metric_{i}" for i in range(tags - 1)] + ["train/kl_penalty"]
    if writer_kind == "tensorboardX":
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(str(folder), max_queue=1000, flush_secs=3600)
        add = writer.add_scalar
    else:
        from tensorboard.summary import Writer

        writer = Writer(str(folder))
        add = writer.add_scalar
    steps = points // tags
    for step in range(steps):
        for j, name in enumerate(names):
            add(name, 0.001 * step + j, step)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def read_ours(*, path: Path) -> int:
    (seg,) = read_tensorboard_file(path, ref=path.name, source=str(path.parent))
    return sum(len(s) for s in seg.series.values())


def read_tbparse(*, path: Path) -> int:
    """tbparse puts simple_value scalars in ``.scalars`` and v2 tensor scalars in ``.tensors``."""
    from tbparse import SummaryReader

    reader = SummaryReader(str(path))
    return len(reader.scalars) + len(reader.tensors)


def read_event_accumulator(*, path: Path) -> int:
    """Every point kept (size 0) for scalars, and for tensors, where v2 scalars land."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    return (sum(len(acc.Scalars(tag)) for tag in tags["scalars"])
            + sum(len(acc.Tensors(tag)) for tag in tags["tensors"]))


READERS: dict[str, Callable[..., int]] = {
    "klwatch": read_ours,
    "tbparse": read_tbparse,
    "EventAccumulator(scalars=0)": read_event_accumulator,
}
_IMPORTS = {"klwatch": "klwatch.sources.tensorboard", "tbparse": "tbparse",
            "EventAccumulator(scalars=0)": "tensorboard.backend.event_processing.event_accumulator"}


def best_time(*, fn: Callable[..., int], path: Path, repeat: int) -> tuple[float, int]:
    """(best seconds of ``repeat`` runs, points read)."""
    best = float("inf")
    count = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        count = fn(path=path)
        best = min(best, time.perf_counter() - t0)
    return best, count


def peak_memory(*, name: str, path: Path) -> float:
    """Peak MiB that Python and numpy allocate while the reader reads the file (tracemalloc).

    Measured in a fresh child process per reader, after its imports, so one reader's garbage or
    import-time allocations cannot blur another's peak, and apart from the timed runs, since
    tracemalloc's bookkeeping slows the pure-Python readers several times over.
    """
    out = subprocess.run([sys.executable, __file__, "--peak-of", name, str(path)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _child_peak(name: str, path: Path) -> None:
    importlib.import_module(_IMPORTS[name])
    tracemalloc.start()
    READERS[name](path=path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(peak / 2**20)


FLEET_TAGS = ["train/loss", "train/reward", "train/kl_penalty", "train/entropy", "train/lr"]


def write_fleet(*, root: Path, runs: int, steps: int, batched: bool) -> list[Path]:
    """``runs`` run folders of one event file each, five tags per step, through tensorboardX's file
    writer: one Summary of five ``simple_value``s per step (``batched``), else one per tag."""
    from tensorboardX import SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary

    paths = []
    for r in range(runs):
        writer = SummaryWriter(str(root / f"run{r:04d}"), max_queue=100_000, flush_secs=3600)
        for step in range(steps):
            vals = [Summary.Value(tag=t, simple_value=0.001 * step + j + r) for j, t in enumerate(FLEET_TAGS)]
            for group in ([vals] if batched else [[v] for v in vals]):
                writer.file_writer.add_summary(Summary(value=group), step, 1.7e9 + step)
        writer.close()
        paths.extend((root / f"run{r:04d}").glob("events.out.tfevents.*"))
    return paths


def read_bare_protobuf(*, path: Path) -> int:
    """The floor: follow the lengths and parse every record with protobuf, touching each scalar."""
    from tensorboard.compat.proto import event_pb2

    data = path.read_bytes()
    parse = event_pb2.Event.FromString
    pos, count = 0, 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        for v in parse(data[pos + 12:pos + 12 + length]).summary.value:
            if v.WhichOneof("value") == "simple_value":
                count += 1
        pos += length + 16
    return count


FLEET_READERS: dict[str, Callable[..., int]] = {
    "klwatch": read_ours, "tbparse": read_tbparse, "bare protobuf loop": read_bare_protobuf}


def bench_fleet(*, runs: int, steps: int, repeat: int) -> None:
    """Both fleet layouts, each read by every reader in the same run; times are best of ``repeat``."""
    for batched in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            paths = write_fleet(root=Path(tmp), runs=runs, steps=steps, batched=batched)
            size = sum(p.stat().st_size for p in paths)
            layout = "five tags per event" if batched else "one tag per event"
            print(f"\nfleet, {layout}: {runs} runs x {steps:,} steps x 5 tags "
                  f"({runs * steps * 5:,} scalars, {size / 2**20:.1f} MiB), written in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
            times: dict[str, float] = {}
            for name, fn in FLEET_READERS.items():
                best, counts = float("inf"), set()
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    counts.add(sum(fn(path=p) for p in paths))
                    best = min(best, time.perf_counter() - t0)
                times[name] = best
                print(f"  {name:<22}{best:>9.3f} s  points {counts}", flush=True)
            ours = times["klwatch"]
            print(f"  klwatch vs tbparse: {times['tbparse'] / ours:.1f}x faster (target >= 5x); "
                  f"klwatch / bare loop: {ours / times['bare protobuf loop']:.2f}x (target <= 3x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--tags", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--writer", choices=["tensorboardX", "summary.Writer"], default="tensorboardX",
                        help="simple_value scalars (tensorboardX, as torch) or v2 tensor scalars")
    parser.add_argument("--fleet", action="store_true", help="the fleet benchmark of issue 14")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--peak-of", nargs=2, metavar=("READER", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.peak_of:
        _child_peak(args.peak_of[0], Path(args.peak_of[1]))
        return
    if args.fleet:
        bench_fleet(runs=args.runs, steps=args.steps, repeat=args.repeat)
        return

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = write_event_file(folder=Path(tmp), points=args.points, tags=args.tags,
                                writer_kind=args.writer)
        size = path.stat().st_size
        print(f"{args.writer} wrote {args.points:,} scalars ({args.tags} tags) to one event file of "
              f"{size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)
        results: dict[str, tuple[float, float, int]] = {}
        for name, fn in READERS.items():
            t, n = best_time(fn=fn, path=path, repeat=args.repeat)
            results[name] = (t, peak_memory(name=name, path=path), n)

    ours_t = results["klwatch"][0]
    print(f"\n{'reader':<30}{'best time':>12}{'peak alloc':>13}{'points':>10}{'time / ours':>14}")
    for name, (t, mem, n) in results.items():
        print(f"{name:<30}{t:>10.3f} s{mem:>9.1f} MiB{n:>10,}{t / ours_t:>13.1f}x")
    counts = {n for _, _, n in results.values()}
    if counts != {args.points}:
        print(f"WARNING: readers disagree on the number of points: {counts}")
    ratio = results["tbparse"][0] / ours_t
    print(f"\nklwatch vs tbparse: {ratio:.1f}x faster (target >= 5x): "
          f"{'met' if ratio >= 5 else 'NOT met'}; vs EventAccumulator: "
          f"{results['EventAccumulator(scalars=0)'][0] / ours_t:.1f}x")


if __name__ == "__main__":
    main()
