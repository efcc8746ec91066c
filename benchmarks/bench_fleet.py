"""Benchmark (issue 14): ``klwatch scan`` on a fleet, against tbparse and a bare protobuf loop; the scan
cache cold, warm and after 1% of the files grew; and a watch poll on a long growing run.

    python benchmarks/bench_fleet.py [--runs 100] [--steps 4000] [--no-tbparse] [--only scan|cache|watch]
    python benchmarks/bench_fleet.py --only verdicts [--runs 400] [--steps 4000] [--seed 0] [--keep DIR]

The fleet is written by this script (TFRecord framing and ``Event`` protobufs, as TensorBoard's
writers frame them): ``runs`` runs of ``steps`` steps and five tags (KL penalty, loss, reward,
entropy, learning rate), each run in one to three event files (a launch and its resumes), in two
layouts: one event per step holding all five tags (writers that batch a step's summaries), and
one tag per event. Every figure is measured in this run, on these files:

- scan: ``klwatch scan --no-cache`` as a process (wall time, interpreter start included; best of
  two), tbparse's ``SummaryReader`` merely reading the same files into a frame, and a bare
  single-core loop that follows the lengths and parses every record with protobuf (no CRC check, no
  verdict; best of two); and, for comparison, the scan with ``--jobs 1`` (no process pool);
- cache: ``klwatch scan`` with an empty cache folder (cold: reads and fills it), again with the
  fleet unchanged (warm), and after 1% of the event files grew by 5% (each read on from where the
  cache stopped); each process as an installed klwatch runs, its bytecode compiled (by the first);
- watch: one ``klwatch watch`` poll (``watch.watch_pass``: its read cache, ``findings=False``, a state
  file) after 1,000 new steps were appended to a run of 10,000 steps, to a run of 1,000,000 steps (and
  to one resumed at step 500,000, its boundary judged again at every poll), and to each of ``--runs``
  runs of 1,000,000 steps (as many as 85% of the available memory and the free disk hold: fewer are
  measured, and said, when 100 do not fit), after two warm-up polls (the first growth
  moves each run into growth buffers and its statistics are kept from then on: ``klwatch.incremental``).
  ``KLWATCH_BENCH_DIR`` puts the files elsewhere than the temporary folder.

Ratios are printed with their targets (scan >= 5x tbparse and <= 3x the bare loop; warm >= 50x
cold, as a process; a poll after 1,000 new steps on a 1M-step run <= 50 ms, about what it costs on a 10k-step one; 100
such runs <= 5 s a poll). Not a test.

``--only verdicts`` (never part of the default run) measures the verdicts instead of the speed: a
fleet of ``--runs`` (default 400) GRPO runs of ``--steps`` steps each, written by
``sweep_resets.write_run`` (TRL-style ``train/kl``, ``train/loss``, ``train/reward``,
``train/grad_norm``, ``train/learning_rate``, one event per logged step, one event file per launch;
each run its own curve shape, noise level, lr schedule and clock). About 1/8 of the runs are buggy: one
resume where the reference was rebuilt from the resumed weights, so the KL restarts from 0 along the
run's own opening, the resumes spread evenly from 5% to 90% of the run, logged every 1, 10, 1 and 5
steps in turn (an N-step point is the mean of the steps since the last log). The rest are healthy:
0, 1 or 2 resumes (at 10-90%) where the KL continues, logged every 1, 1, 5 or 10 steps. One
``klwatch scan ROOT --format json --jobs 2 --no-cache`` judges the fleet; printed: buggy runs flagged
(``reference_reset`` at their resume) / buggy runs, healthy runs flagged (false alarms), healthy runs
whose lineage rolls up as anything but ``ok`` (by status), the scan's wall time, and every miss and
false alarm with its seed, resume step, logging interval and klwatch's verdict and explanation. Exit
code 1 on any miss or false alarm.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dashboard import tfrecord  # noqa: E402
from bench_tensorboard import read_bare_protobuf  # noqa: E402
from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402

TAGS = ["train/kl_penalty", "train/loss", "train/reward", "train/entropy", "train/lr"]
KLWATCH = [sys.executable, "-m", "klwatch.cli"]


def _step_events(step: int, wall: float, values: list[float], *, batched: bool) -> list[bytes]:
    vals = [summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in zip(TAGS, values)]
    groups = [vals] if batched else [[v] for v in vals]
    return [tfrecord(event_pb2.Event(step=step, wall_time=wall, summary=summary_pb2.Summary(value=g))
                    .SerializeToString()) for g in groups]


def _values(step: int, ref_at: int, rng: np.random.Generator) -> list[float]:
    kl = 0.02 * (1 - np.exp(-(step - ref_at) / 200)) + 0.001 * rng.random()
    return [float(kl), float(1.0 / (1 + step / 500)), float(0.5 + 0.1 * rng.random()), float(2.0 - step / 1e5),
            3e-6]


def append_steps(path: Path, steps: range, *, batched: bool, seed: int = 0, ref_at: int = 0) -> None:
    """Append the events of ``steps`` to an event file (creating it with its file_version record)."""
    rng = np.random.default_rng(seed)
    out = bytearray()
    if not path.exists():
        out += tfrecord(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())
    for step in steps:
        for rec in _step_events(step, 1.7e9 + step, _values(step, ref_at, rng), batched=batched):
            out += rec
    with open(path, "ab") as f:
        f.write(out)


def write_fleet(root: Path, *, runs: int, steps: int, batched: bool) -> list[Path]:
    """``runs`` run folders, each one to three event files (a launch, then resumes at a third and two
    thirds of the steps, taking up where the checkpoint was: a healthy resume, the KL goes on)."""
    paths = []
    for r in range(runs):
        folder = root / f"run{r:04d}"
        folder.mkdir(parents=True)
        cuts = [0, steps] if r % 3 == 0 else [0, steps // 2, steps] if r % 3 == 1 else \
            [0, steps // 3, 2 * steps // 3, steps]
        for k, (a, b) in enumerate(zip(cuts, cuts[1:])):
            path = folder / f"events.out.tfevents.{1700000000 + 10 * k}.host.{1000 + k}.0"
            append_steps(path, range(a + 1, b + 1), batched=batched, seed=r * 10 + k)
            paths.append(path)
    return paths


def bare_loop(paths: list[Path]) -> int:
    """The floor (``bench_tensorboard.read_bare_protobuf``) over every file of the fleet."""
    return sum(read_bare_protobuf(path=p) for p in paths)


def tbparse_read(root: Path) -> int:
    from tbparse import SummaryReader

    return len(SummaryReader(str(root), extra_columns={"dir_name"}).scalars)


def timed(fn, *args) -> tuple[float, object]:
    t0 = time.perf_counter()
    got = fn(*args)
    return time.perf_counter() - t0, got


def klwatch_scan(root: Path, *extra: str, env: dict[str, str] | None = None) -> float:
    """``klwatch scan`` as a user runs it, as a process: its wall time (the report goes to a file)."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        done = subprocess.run([*KLWATCH, "scan", str(root), "--format", "json", "-o", f"{out}/r.json", *extra],
                              capture_output=True, text=True, env=env)
        took = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"klwatch scan failed ({done.returncode}): {done.stderr[-2000:]}")
    return took


def bench_scan(*, runs: int, steps: int, tbparse: bool) -> None:
    for batched in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "fleet"
            paths = write_fleet(root, runs=runs, steps=steps, batched=batched)
            size = sum(p.stat().st_size for p in paths)
            layout = "five tags per event" if batched else "one tag per event"
            print(f"\nscan, {layout}: {runs} runs x {steps:,} steps x 5 tags ({runs * steps * 5:,} scalars, "
                  f"{len(paths)} event files, {size / 2**20:.1f} MiB)", flush=True)
            ours = min(klwatch_scan(root, "--no-cache") for _ in range(2))
            bare, points = min(timed(bare_loop, paths) for _ in range(2))  # best of two, as the scan
            one = min(klwatch_scan(root, "--no-cache", "--jobs", "1") for _ in range(2))
            print(f"  klwatch scan --no-cache (process)   {ours:8.2f} s")
            print(f"  bare protobuf loop ({points:,} pts) {bare:8.2f} s")
            print(f"  klwatch / bare loop: {ours / bare:.2f}x (target <= 3x)")
            print(f"  the same scan with --jobs 1 (no process pool): {one:.2f} s, {one / bare:.2f}x the bare loop")
            if tbparse:
                tbp, n = timed(tbparse_read, root)
                print(f"  tbparse SummaryReader ({n:,} rows)  {tbp:8.2f} s")
                print(f"  klwatch vs tbparse: {tbp / ours:.1f}x faster (target >= 5x)")


def bench_cache(*, runs: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "fleet"
        paths = write_fleet(root, runs=runs, steps=steps, batched=True)
        env = _installed_env(KLWATCH_CACHE_DIR=f"{tmp}/cache", PYTHONPYCACHEPREFIX=f"{tmp}/pycache")
        print(f"\ncache: {runs} runs x {steps:,} steps, {len(paths)} event files", flush=True)
        nocache = klwatch_scan(root, "--no-cache", env=env)
        cold = klwatch_scan(root, env=env)
        warm = statistics.median(klwatch_scan(root, env=env) for _ in range(3))
        lasts = [max(folder.glob("events.out.tfevents.*")) for folder in sorted(root.iterdir())]
        grown = lasts[:: max(1, len(lasts) // max(1, len(paths) // 100))][: max(1, len(paths) // 100)]
        for p in grown:  # the runs go on: 5% more steps at the end of 1% of the files
            append_steps(p, range(steps + 1, steps + 1 + steps // 20), batched=True)
        after = klwatch_scan(root, env=env)
        print("  klwatch scan as a process (wall time, interpreter and imports included):")
        print(f"    no cache                     {nocache:8.2f} s")
        print(f"    cold (empty cache, fills it) {cold:8.2f} s")
        print(f"    warm (fleet unchanged)       {warm:8.2f} s   cold / warm: {cold / warm:.1f}x (target >= 50x), "
              f"no cache / warm: {nocache / warm:.1f}x")
        print(f"    after {len(grown)} of {len(paths)} files grew  {after:8.2f} s   no cache / that: {nocache / after:.1f}x")
    with tempfile.TemporaryDirectory() as tmp:  # the same, as the library does it, in one process
        root = Path(tmp) / "fleet"
        paths = write_fleet(root, runs=runs, steps=steps, batched=True)
        print("  the library in one process (pipeline.scan and the ScanCache; imports done before timing):")
        subprocess.run([sys.executable, __file__, "--in-process-cache", str(root), str(steps)], check=True)


def _installed_env(**extra: str) -> dict[str, str]:
    """The environment of a process run as a user runs an installed klwatch: its modules compiled once
    (pip compiles an install's bytecode; here the first process writes it, under ``PYTHONPYCACHEPREFIX``,
    outside the tree), whatever ``PYTHONDONTWRITEBYTECODE`` this shell sets."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **extra}


def in_process_cache(root: Path, steps: int) -> None:
    """The cache figures without the interpreter's start: what a long-lived caller (the dashboard, a CI
    integration calling ``klwatch.pipeline``) pays. Run in a child process so nothing is warm but imports."""
    from klwatch.parallel import Execution
    from klwatch.pipeline import ScanConfig, scan
    from klwatch.scan_cache import ScanCache

    import klwatch.findings  # noqa: F401 - imports are not what is measured here (the reader came with bench_tensorboard)

    config = ScanConfig(execution=Execution(jobs=1))
    specs = [str(root)]
    nocache, plain = timed(lambda: scan(specs, config=config))
    with tempfile.TemporaryDirectory() as tmp:
        cache = ScanCache.open(Path(tmp) / "cache")

        def cached_scan():
            key = cache.scan_key(specs, config)
            got = cache.load_scan(key)
            if got is None:
                got = scan(specs, config=config, read_unit=cache.read_unit, judge_cache=cache)
                cache.store_scan(key, got)
            return got

        cold, _ = timed(cached_scan)
        warm = statistics.median(timed(cached_scan)[0] for _ in range(3))
        lasts = [max(folder.glob("events.out.tfevents.*")) for folder in sorted(root.iterdir())]
        for p in lasts[:: max(1, len(lasts) // 2)][:2]:
            append_steps(p, range(steps + 1, steps + 1 + steps // 20), batched=True)
        after, _ = timed(cached_scan)
    print(f"    no cache                     {nocache:8.3f} s")
    print(f"    cold (empty cache, fills it) {cold:8.3f} s")
    print(f"    warm (fleet unchanged)       {warm:8.3f} s   cold / warm: {cold / warm:.1f}x (as a process: target >= 50x), "
          f"no cache / warm: {nocache / warm:.1f}x")
    print(f"    after 2 files grew           {after:8.3f} s   no cache / that: {nocache / after:.1f}x "
          "(only the grown files read, from where the cache stopped; only their runs judged again)")


def _chunk_bytes(at: int, steps: int) -> bytes:
    """The event-file bytes of ``steps`` more steps after step ``at`` (5 tags, one event per step)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "chunk"
        append_steps(scratch, range(at + 1, at + steps + 1), batched=True)
        return scratch.read_bytes()[len(_FILE_HEAD):]


_FILE_HEAD = tfrecord(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())


def _rss() -> int:
    """This process's resident memory, in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _available() -> int:
    """Memory the machine can still give, in bytes (Linux ``MemAvailable``)."""
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


class _Watcher:
    """``klwatch watch``'s poll as it runs it (``watch_pass``: its read cache, ``ScanConfig(findings=False)``,
    a state file), over one SOURCE whose runs grow by 1,000 steps before each poll."""

    def __init__(self, root: Path, files: list[Path], at: int, *, max_read_bytes: int | None = None) -> None:
        """``max_read_bytes``: as ``--max-read-bytes`` gives it (None: the default, half the memory)."""
        from klwatch.alert_store import AlertState, Sink
        from klwatch.pipeline import ScanConfig
        from klwatch.read_cache import LocalReadCache
        from klwatch.sources.limits import ReadLimits
        from klwatch.watch import return_large_frees

        return_large_frees()  # as `klwatch watch` starts
        self.root, self.files, self.at = root, files, at
        limits = ReadLimits() if max_read_bytes is None else ReadLimits(max_bytes=max_read_bytes)
        self.config, self.cache = ScanConfig(findings=False), LocalReadCache(limits)
        self.state, self.sinks = AlertState(root.parent / "state.db"), [Sink.stdout()]

    def grow(self, steps: int = 1000) -> None:
        more = _chunk_bytes(self.at, steps)
        for path in self.files:
            with open(path, "ab") as f:
                f.write(more)
        self.at += steps

    def poll(self) -> float:
        """One poll's wall time (seconds); checks each run was read on, not read again."""
        import io

        from klwatch.watch import watch_pass

        t0 = time.perf_counter()
        report = watch_pass([str(self.root)], config=self.config, cache=self.cache, state=self.state,
                            sinks=self.sinks, dashboard_url=None, out=io.StringIO())
        took = time.perf_counter() - t0
        if len(report.result.results) != len(self.files) or report.result.any_error:
            raise SystemExit(f"watch poll judged {len(report.result.results)} runs of {len(self.files)}")
        return took

    def close(self) -> None:
        self.state.close()


def _watch_one(base: Path, length: int, tmp: Path) -> tuple[float, int]:
    """Median poll (s) over 5 polls, each after 1,000 new steps, of one run of ``length`` steps; and the
    memory the watched run holds (bytes)."""
    root = tmp / f"one-{length}" / "runs"
    (root / "run").mkdir(parents=True)
    path = root / "run" / "events.out.tfevents.1700000000.host.1.0"
    if length == BIG_RUN:
        shutil.copyfile(base, path)
    else:
        append_steps(path, range(1, length + 1), batched=True)
    before = _rss()
    w = _Watcher(root, [path], length)
    w.poll()  # the watcher starts: reads the run whole
    for _ in range(2):  # the first growths: the series move into growth buffers, the run's statistics are kept
        w.grow()
        w.poll()
    polls = []
    for _ in range(5):
        w.grow()
        polls.append(w.poll())
    held = _rss() - before
    w.close()
    return statistics.median(polls), held


BIG_RUN = 1_000_000


def _watch_resumed(tmp: Path) -> float:
    """Median poll (s) over 5 polls, each after 1,000 new steps, of a 1M-step run with a resume halfway:
    the boundary is judged again at every poll."""
    root = tmp / "resumed" / "runs"
    (root / "run").mkdir(parents=True)
    first = root / "run" / "events.out.tfevents.1700000000.host.1.0"
    second = root / "run" / "events.out.tfevents.1700600000.host.2.0"
    append_steps(first, range(1, BIG_RUN // 2 + 1), batched=True)
    append_steps(second, range(BIG_RUN // 2 + 1, BIG_RUN + 1), batched=True, seed=1)
    return _median_poll(_Watcher(root, [second], BIG_RUN), polls=5)


def _median_poll(w: "_Watcher", *, polls: int) -> float:
    """The median of ``polls`` polls, each after the run(s) grew, once three polls have warmed the watcher."""
    w.poll()
    for _ in range(2):
        w.grow()
        w.poll()
    took = []
    for _ in range(polls):
        w.grow()
        took.append(w.poll())
    w.close()
    return statistics.median(took)


def bench_watch(*, runs: int) -> None:
    """The watcher's poll after 1,000 new steps: on a 10k-step and a 1M-step run, then over a fleet of
    ``runs`` runs of 1M steps (as many as this machine's memory and disk hold, said when fewer)."""
    print("\nwatch: one `klwatch watch` poll (watch_pass: read on, stitch, judge) after 1,000 new steps "
          "(5 tags each) per run", flush=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("KLWATCH_BENCH_DIR")) as tmp_name:
        tmp = Path(tmp_name)
        base = tmp / "base.tfevents"
        append_steps(base, range(1, BIG_RUN + 1), batched=True)
        short, _ = _watch_one(base, 10_000, tmp)
        long, held = _watch_one(base, BIG_RUN, tmp)
        print(f"  run of    10,000 steps: poll {short * 1e3:7.1f} ms")
        print(f"  run of 1,000,000 steps: poll {long * 1e3:7.1f} ms   (target <= 50 ms; "
              f"{held / 2**20:.0f} MiB held by the watcher for it)")
        print(f"  poll on the 1M-step run / poll on the 10k-step run: {long / short:.2f}x (flat: about 1x)", flush=True)
        resumed = _watch_resumed(tmp)
        print(f"  run of 1,000,000 steps resumed at step 500,000 (two event files, the second growing): poll "
              f"{resumed * 1e3:7.1f} ms", flush=True)
        _watch_fleet(base, tmp, runs=runs, per_run=max(held, 1))


def _watch_fleet(base: Path, tmp: Path, *, runs: int, per_run: int) -> None:
    """One poll over ``runs`` runs of 1M steps, each grown by 1,000 steps; fewer runs when this machine's
    memory or disk would not hold them, and then said so. Memory: 85% of what is available, less room for
    one run's first whole read (its parse's peak, ``per_run`` again), at 1.15x what one watched run held."""
    available, free = _available(), shutil.disk_usage(tmp).free
    fits_memory = int((0.85 * available - 2 * per_run) / (per_run * 1.15))
    fits_disk = int(0.8 * free / (base.stat().st_size * 1.05))
    n = max(1, min(runs, fits_memory, fits_disk))
    root = tmp / "fleet" / "runs"
    files = []
    for r in range(n):
        (root / f"run{r:03d}").mkdir(parents=True)
        files.append(root / f"run{r:03d}" / "events.out.tfevents.1700000000.host.1.0")
        shutil.copyfile(base, files[-1])
    # 100 such runs are ~13 GiB of event files, past the default budget of one SOURCE (half the memory):
    # read as `klwatch watch --max-read-bytes` twice their size gives it
    budget = 2 * sum(f.stat().st_size for f in files)
    took = _median_poll(_Watcher(root, files, BIG_RUN, max_read_bytes=budget), polls=3)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(f"  one poll over {n} runs of 1,000,000 steps: {took:.2f} s ({took / n * 1e3:.1f} ms a run; target: "
          f"100 runs <= 5 s); this process's peak RSS {peak / 2**30:.1f} GiB; --max-read-bytes {budget / 2**30:.0f} GiB")
    if n < runs:
        limit = (f"85% of the available memory ({available / 2**30:.1f} GiB) holds {fits_memory} at "
                 f"{per_run / 2**20:.0f} MiB a watched run" if fits_memory <= fits_disk else
                 f"the free disk ({free / 2**30:.1f} GiB) holds {fits_disk} files of {base.stat().st_size / 2**20:.0f} MiB")
        print(f"  ({runs} runs not measured: {limit}; {runs} runs at the cost a run measured here would take "
              f"{took / n * runs:.2f} s, an extrapolation)")


def verdict_fleet_specs(*, runs: int, steps: int, seed: int) -> list:
    """The runs of ``--only verdicts``: every 8th buggy (resumes spread from 5% to 90%), the rest healthy."""
    from sweep_resets import RunSpec

    rng = np.random.default_rng([seed, 8])
    buggy = set(range(0, runs, 8))
    spread = iter(np.linspace(0.05, 0.90, len(buggy)))
    specs = []
    for r in range(runs):
        run_seed = int(seed * 1_000_000 + 900_000 + r)
        if r in buggy:
            interval = (1, 10, 1, 5)[(r // 8) % 4]
            c = int(round(next(spread) * steps))
            if interval > 1:
                c = max(2 * interval, c // interval * interval + (0 if (r // 8) % 8 < 4 else interval // 2))
            resumes, resets, variant = [c], [c], "reset"
        else:
            interval = (1, 1, 5, 10)[r % 4]
            count = r % 3
            resumes = sorted(int(x) for x in rng.choice(np.arange(int(0.1 * steps), int(0.9 * steps)), count,
                                                       replace=False)) if count else []
            while any(b - a < max(20, 4 * interval) for a, b in zip(resumes, resumes[1:])):
                resumes = sorted(int(x) for x in rng.choice(np.arange(int(0.1 * steps), int(0.9 * steps)), count,
                                                           replace=False))
            resets, variant = [], "healthy"
        overshoot = [0 if rng.random() < 0.5 else int(rng.integers(1, 20)) for _ in resumes]
        overshoot = [min(o, max(0, b - a - 1)) for o, a, b in zip(overshoot, resumes, resumes[1:] + [steps])]
        specs.append(RunSpec(name=f"run{r:04d}", profile="fleet", kind="grpo", variant=variant, buggy=r in buggy,
                             seed=run_seed, length=steps, interval=interval, resumes=resumes, resets=resets,
                             overshoot=overshoot))
    order = rng.permutation(runs)  # folder names say nothing about the run
    for k, spec in zip(order, list(specs)):
        spec.name = f"run{k:04d}"
    return specs


def bench_verdicts(*, runs: int, steps: int, seed: int, keep: Path | None) -> int:
    import json

    from sweep_resets import print_cases, score, write_run

    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        root = work / "fleet"
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        specs = verdict_fleet_specs(runs=runs, steps=steps, seed=seed)
        t0 = time.perf_counter()
        files = sum(len(write_run(root, s, lean=True, batched=True)) for s in specs)
        gen = time.perf_counter() - t0
        (work / "manifest.json").write_text(json.dumps([vars(s) for s in specs], indent=1))
        nb = sum(s.buggy for s in specs)
        print(f"\nverdicts: {runs} runs x {steps:,} steps ({nb} buggy, {runs - nb} healthy; {files} event files, "
              f"written in {gen:.1f} s)", flush=True)
        report = work / "report.json"
        t0 = time.perf_counter()
        done = subprocess.run([*KLWATCH, "scan", str(root), "--format", "json", "-o", str(report), "--jobs", "2",
                               "--no-cache"], capture_output=True, text=True)
        took = time.perf_counter() - t0
        if done.returncode not in (0, 1, 3) or not report.exists():
            raise SystemExit(f"klwatch scan failed ({done.returncode}): {done.stderr[-2000:]}")
        res = score(specs, json.loads(report.read_text()))
    not_ok = {k: v for k, v in res["healthy_status"].items() if k != "ok"}
    print(f"  buggy runs flagged (reference_reset at the resume)   {res['caught']:>4} / {res['buggy']}"
          f"   (inconclusive {res['buggy_inconclusive']}, ok {res['buggy_ok']}, "
          f"no boundary {res['buggy_no_boundary']})")
    print(f"  false alarms (healthy runs flagged; resets judged     {res['false_alarms']:>4} / {res['healthy']}")
    print("    at another boundary of a buggy run included)")
    print(f"  healthy runs rolled up as anything but ok            {sum(not_ok.values()):>4} / "
          f"{res['healthy']}   {not_ok}")
    print(f"  healthy boundaries: ok {res['healthy_ok']}, inconclusive {res['healthy_inconclusive']}, "
          f"other {res['healthy_other']} (of {res['healthy_boundaries']})")
    if res["merged_lineages"]:
        print(f"  lineages joining several run folders: {res['merged_lineages']}")
    print(f"  klwatch scan --jobs 2 (process, wall time)           {took:8.2f} s   (exit code {done.returncode})")
    print_cases([res])
    return 1 if res["caught"] < res["buggy"] or res["false_alarms"] else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=None, help="100; 400 with --only verdicts")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--no-tbparse", action="store_true", help="skip tbparse (about a minute per layout)")
    parser.add_argument("--only", choices=["scan", "cache", "watch", "verdicts"])
    parser.add_argument("--seed", type=int, default=0, help="--only verdicts: the fleet's seed")
    parser.add_argument("--keep", type=Path, help="--only verdicts: write (and keep) the fleet and its report here")
    parser.add_argument("--in-process-cache", nargs=2, metavar=("ROOT", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process_cache:
        in_process_cache(Path(args.in_process_cache[0]), int(args.in_process_cache[1]))
        return
    if args.only == "verdicts":
        sys.exit(bench_verdicts(runs=args.runs or 400, steps=args.steps, seed=args.seed, keep=args.keep))
    args.runs = args.runs or 100
    if args.only in (None, "scan"):
        bench_scan(runs=args.runs, steps=args.steps, tbparse=not args.no_tbparse)
    if args.only in (None, "cache"):
        bench_cache(runs=args.runs, steps=args.steps)
    if args.only in (None, "watch"):
        bench_watch(runs=args.runs)


if __name__ == "__main__":
    main()
