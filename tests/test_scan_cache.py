"""The scan cache (``klwatch.scan_cache``): a cached read is the read, a grown log is read on from where
the cache stopped, an unchanged scan is reused whole, and the cache stays private, bounded and out
of the user's run folders."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import klwatch.scan_cache as scan_cache
import klwatch.sources.tensorboard as tb
from klwatch.pipeline import ScanConfig, judge_reads, scan
from klwatch.report import to_json
from klwatch.scan_cache import CacheUnusable, ScanCache, parse_size
from klwatch.sources.local import read_local
from segment_equality import assert_same_segment
from tb_runs import write_run

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


def tree_state(root: Path) -> list[tuple[str, int, int]]:
    """Every path under ``root`` with its size and mtime: what 'nothing written there' compares."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out.append((str(p.relative_to(root)), st.st_size, st.st_mtime_ns))
    return sorted(out)


def assert_same_read(got, want) -> None:
    assert [s.ref for s in got.segments] == [s.ref for s in want.segments]
    for g, w in zip(got.segments, want.segments):
        assert_same_segment(g, w)
    assert (got.kinds, got.warnings, got.errors) == (want.kinds, want.warnings, want.errors)


def report_of(result) -> str:
    return to_json(dataclasses.replace(result, generated_at="T"))


@pytest.fixture
def cache(tmp_path: Path) -> ScanCache:
    return ScanCache.open(tmp_path / "cache")


@pytest.mark.parametrize("sub", ["tensorboard", "wandb", "mlflow", "trl", "negatives"])
def test_a_read_served_from_the_cache_equals_a_fresh_read(cache: ScanCache, sub: str) -> None:
    spec = str(SAMPLES / sub)
    want = read_local(spec)
    first = read_local(spec, read_unit=cache.read_unit)
    again = read_local(spec, read_unit=cache.read_unit)
    assert_same_read(first, want)
    assert_same_read(again, want)
    assert list((cache.directory / "units").rglob("*.arrow")), "nothing was cached"


def test_an_unchanged_unit_is_not_read_again(cache: ScanCache, tmp_path: Path, monkeypatch) -> None:
    write_run(tmp_path / "runs" / "a", resumes=[30], buggy=True)
    read_local(str(tmp_path / "runs"), read_unit=cache.read_unit)
    calls = []
    real = tb.read_tensorboard_file_since
    monkeypatch.setattr(tb, "read_tensorboard_file_since", lambda *a, **k: calls.append(1) or real(*a, **k))
    read_local(str(tmp_path / "runs"), read_unit=cache.read_unit)
    assert calls == []


def test_a_grown_event_file_is_read_on_from_where_the_cache_stopped(cache: ScanCache, tmp_path: Path,
                                                                     monkeypatch) -> None:
    runs = tmp_path / "runs"
    write_run(runs / "a", resumes=[], buggy=False, last=400)
    (path,) = (runs / "a").glob("events.out.tfevents.*")
    data = path.read_bytes()
    heads, _ = tb._record_heads(data)
    cut = heads[len(heads) // 2]
    path.write_bytes(data[:cut])
    read_local(str(runs), read_unit=cache.read_unit)
    with open(path, "ab") as f:
        f.write(data[cut:])
    starts = []
    real = tb.read_regular
    monkeypatch.setattr(tb, "read_regular", lambda p, **k: starts.append(k.get("start", 0)) or real(p, **k))
    got = read_local(str(runs), read_unit=cache.read_unit)
    assert starts == [cut]
    assert_same_read(got, read_local(str(runs)))
    monkeypatch.undo()
    assert_same_read(read_local(str(runs), read_unit=cache.read_unit), read_local(str(runs)))  # and cached so


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_read_again(cache: ScanCache, tmp_path: Path) -> None:
    table = tmp_path / "runs" / "metrics.csv"
    table.parent.mkdir()
    table.write_text("step,kl\n1,0.010\n2,0.020\n3,0.030\n")
    st = table.stat()
    read_local(str(table.parent), read_unit=cache.read_unit)
    table.write_text("step,kl\n1,0.011\n2,0.020\n3,0.030\n")  # same size
    os.utime(table, ns=(st.st_atime_ns, st.st_mtime_ns))
    got = read_local(str(table.parent), read_unit=cache.read_unit)
    assert got.segments[0].series["kl"].values[0] == pytest.approx(0.011)


def test_a_damaged_cache_entry_is_a_miss_and_is_removed(cache: ScanCache, tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "a", resumes=[30], buggy=True)
    want = read_local(str(tmp_path / "runs"))
    read_local(str(tmp_path / "runs"), read_unit=cache.read_unit)
    arrows = list((cache.directory / "units").rglob("*.arrow"))  # one per process's event file
    for arrow in arrows:
        arrow.write_bytes(b"not arrow at all")
    assert_same_read(read_local(str(tmp_path / "runs"), read_unit=cache.read_unit), want)
    assert all(a.read_bytes() != b"not arrow at all" for a in arrows)  # replaced by a good entry
    assert_same_read(read_local(str(tmp_path / "runs"), read_unit=cache.read_unit), want)


def test_an_unchanged_scan_is_reused_whole_and_any_change_is_a_new_key(cache: ScanCache, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs / "a", resumes=[30], buggy=True)
    write_run(runs / "b", resumes=[], buggy=False, seed=1)
    config = ScanConfig()
    key = cache.scan_key([str(runs)], config)
    assert key is not None and cache.load_scan(key) is None
    result = scan([str(runs)], config=config)
    cache.store_scan(key, result)
    reused = cache.load_scan(key)
    assert reused is not None and report_of(reused) == report_of(result)
    assert cache.scan_key([str(runs)], config) == key
    assert cache.scan_key([str(runs)], dataclasses.replace(config, intentional_resets=(30,))) != key
    assert cache.scan_key([str(runs) + "#a"], config) != key
    write_run(runs / "b", resumes=[], buggy=False, seed=2, start_wall=1_800_000_000.0)  # a new event file
    assert cache.scan_key([str(runs)], config) != key
    assert cache.scan_key(["wandb://entity/project"], config) is None


def test_the_cache_never_writes_into_the_run_folders(cache: ScanCache, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard", runs / "tb")
    shutil.copytree(SAMPLES / "wandb", runs / "wandb")
    before = tree_state(runs)
    for _ in range(2):
        result = judge_reads([(read_local(str(runs), read_unit=cache.read_unit), None)], config=ScanConfig())
        cache.store_scan(cache.scan_key([str(runs)], ScanConfig()), result)
    assert tree_state(runs) == before


def test_the_cache_is_pruned_to_its_size_bound_least_recently_used_first(tmp_path: Path, monkeypatch) -> None:
    for i in range(6):
        write_run(tmp_path / "runs" / f"r{i}", resumes=[], buggy=False, seed=i)
    whole = ScanCache.open(tmp_path / "cache")
    read_local(str(tmp_path / "runs"), read_unit=whole.read_unit)
    os.utime(tmp_path / "cache", ns=(0, 0))
    for p in (whole.directory / "units").rglob("*"):  # all used long ago...
        os.utime(p, ns=(10**9, 10**9))
    read_local(str(tmp_path / "runs" / "r5"), read_unit=whole.read_unit)  # ...but r5, used just now
    half = ScanCache.open(tmp_path / "cache", max_bytes=whole.size() // 2)
    assert half.prune() > 0
    assert 0 < half.size() <= half.max_bytes
    calls = []
    real = tb.read_tensorboard_file_since
    monkeypatch.setattr(tb, "read_tensorboard_file_since", lambda *a, **k: calls.append(1) or real(*a, **k))
    read_local(str(tmp_path / "runs" / "r5"), read_unit=half.read_unit)
    assert calls == [], "the most recently used entry was pruned"


def test_a_cache_folder_others_can_write_to_is_not_used(tmp_path: Path) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(CacheUnusable, match="writable by other users"):
        ScanCache.open(d)


def test_a_new_cache_folder_is_private(tmp_path: Path) -> None:
    c = ScanCache.open(tmp_path / "new" / "cache")
    assert c.directory.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(("text", "size"), [("500MB", 500 << 20), ("2GiB", 2 << 30), ("1.5G", 3 << 29),
                                            ("0", 0), ("4096", 4096), ("64k", 64 << 10)])
def test_cache_sizes_read_as_people_write_them(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1GB", "", "1e30TB"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_a_segment_json_would_change_is_read_but_not_cached(cache: ScanCache, tmp_path: Path, monkeypatch) -> None:
    write_run(tmp_path / "runs" / "a", resumes=[], buggy=False)
    real = tb.read_tensorboard_file_since

    def with_tuple(*a, **k):
        segs, resume = real(*a, **k)
        segs[0].config["odd"] = (1, 2)  # a tuple comes back from JSON as a list
        return segs, resume

    monkeypatch.setattr(tb, "read_tensorboard_file_since", with_tuple)
    got = read_local(str(tmp_path / "runs"), read_unit=cache.read_unit)
    assert got.segments[0].config["odd"] == (1, 2)
    assert not list((cache.directory / "units").rglob("*.json"))


def test_the_default_cache_folder_follows_klwatch_cache_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KLWATCH_CACHE_DIR", str(tmp_path / "here"))
    assert scan_cache.default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv("KLWATCH_CACHE_DIR")
    assert "klwatch" in str(scan_cache.default_cache_dir())


def test_a_grown_wandb_log_is_read_on_from_where_the_cache_stopped(cache: ScanCache, tmp_path: Path,
                                                                    monkeypatch) -> None:
    import klwatch.sources.wandb_log as wandb_log

    src = next((SAMPLES / "wandb").rglob("*.wandb")).parent
    run = tmp_path / "runs" / src.name
    shutil.copytree(src, run)
    (log,) = run.glob("*.wandb")
    data = log.read_bytes()
    cut = int(len(data) * 0.6)
    log.write_bytes(data[:cut])  # the run as a live writer had it: cut inside a record
    first = read_local(str(tmp_path / "runs"), read_unit=cache.read_unit)
    assert first.segments and not first.segments[0].error
    with open(log, "ab") as f:
        f.write(data[cut:])
    starts = []
    real = wandb_log.read_regular
    monkeypatch.setattr(wandb_log, "read_regular", lambda p, **k: starts.append(k.get("start", 0)) or real(p, **k))
    got = read_local(str(tmp_path / "runs"), read_unit=cache.read_unit)
    assert len(starts) == 1 and 0 < starts[0] <= cut
    monkeypatch.undo()
    assert_same_read(got, read_local(str(tmp_path / "runs")))


# -- the command line -----------------------------------------------------------------------------

KLWATCH = [sys.executable, "-m", "klwatch.cli"]


def klwatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*KLWATCH, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def report_without_date(path: Path) -> dict:
    doc = json.loads(path.read_text())
    doc.pop("generated_at", None)
    return doc


def test_scan_reuses_an_unchanged_scan_and_gives_the_report_a_fresh_scan_gives(tmp_path: Path,
                                                                                private_scan_cache: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard", runs)
    before = tree_state(runs)
    fresh = klwatch("scan", runs, "--format", "json", "-o", tmp_path / "fresh.json", "--no-cache")
    assert not list(private_scan_cache.rglob("*.arrow")) and not list(private_scan_cache.rglob("*.pickle"))
    first = klwatch("scan", runs, "--format", "json", "-o", tmp_path / "first.json")
    assert list(private_scan_cache.rglob("*.arrow")) and len(list((private_scan_cache / "scans").rglob("*.pickle"))) == 1
    again = klwatch("scan", runs, "--format", "json", "-o", tmp_path / "again.json")
    assert fresh.returncode == first.returncode == again.returncode
    assert fresh.stderr == first.stderr == again.stderr
    want = report_without_date(tmp_path / "fresh.json")
    assert report_without_date(tmp_path / "first.json") == want == report_without_date(tmp_path / "again.json")
    assert tree_state(runs) == before


def test_a_cache_folder_inside_a_source_is_not_used(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard", runs)
    before = tree_state(runs)
    got = klwatch("scan", runs, "--format", "json", "--cache-dir", runs / "cache")
    assert "lies inside the SOURCE" in got.stderr and got.returncode in (0, 1)
    assert tree_state(runs) == before


def test_a_bad_cache_size_is_a_usage_error(tmp_path: Path) -> None:
    got = klwatch("scan", SAMPLES / "tensorboard", "--cache-size", "lots")
    assert got.returncode == 2 and "--cache-size" in got.stderr and "not a size" in got.stderr


def test_every_folder_the_cache_makes_is_private(tmp_path: Path, private_scan_cache: Path) -> None:
    """Under the 0700 top folder, sub-folders made on the way (mkdir's parents) are 0700 too, whatever the umask."""
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLES / "tensorboard", runs)
    assert klwatch("scan", runs, "--format", "json").returncode in (0, 1)
    folders = [private_scan_cache, *(p for p in private_scan_cache.rglob("*") if p.is_dir())]
    assert len(folders) > 2
    assert {str(p.relative_to(private_scan_cache)): oct(p.stat().st_mode & 0o777) for p in folders
            if p.stat().st_mode & 0o077} == {}


def test_check_reads_through_the_cache_too(tmp_path: Path, private_scan_cache: Path) -> None:
    a = klwatch("check", SAMPLES / "tensorboard")
    b = klwatch("check", SAMPLES / "tensorboard")
    c = klwatch("check", SAMPLES / "tensorboard", "--no-cache")
    assert (a.returncode, a.stdout) == (b.returncode, b.stdout) == (c.returncode, c.stdout)
    assert list((private_scan_cache / "scans").rglob("*.pickle"))


def test_only_the_runs_whose_data_changed_are_judged_again(cache: ScanCache, tmp_path: Path, monkeypatch) -> None:
    import klwatch.pipeline as pipeline

    runs = tmp_path / "runs"
    write_run(runs / "a", resumes=[30], buggy=True)
    write_run(runs / "b", resumes=[40], buggy=False, seed=1)
    config = ScanConfig()
    judged: list[str] = []
    real = pipeline.judge_lineage
    monkeypatch.setattr(pipeline, "judge_lineage", lambda lin, **k: judged.append(lin.name) or real(lin, **k))
    first = scan([str(runs)], config=config, read_unit=cache.read_unit, judge_cache=cache)
    assert sorted(judged) == ["a", "b"]
    judged.clear()
    again = scan([str(runs)], config=config, read_unit=cache.read_unit, judge_cache=cache)
    assert judged == [] and report_of(again) == report_of(first)
    write_run(runs / "b", resumes=[], buggy=False, seed=2, start_wall=1_800_000_000.0)  # a new launch in b
    judged.clear()
    grown = scan([str(runs)], config=config, read_unit=cache.read_unit, judge_cache=cache)
    assert len(judged) == 1 and judged[0].startswith("b")  # a's data did not change: not judged again
    monkeypatch.undo()
    assert report_of(grown) == report_of(scan([str(runs)], config=config))
    other = dataclasses.replace(config, intentional_resets=(31,))  # other settings: judged afresh
    assert report_of(scan([str(runs)], config=other, judge_cache=cache)) == report_of(scan([str(runs)], config=other))


def test_the_cache_says_which_units_a_scan_would_really_read(cache: ScanCache, tmp_path: Path) -> None:
    """What a process pool is worth starting for: only files that changed since they were cached."""
    from klwatch.sources.local import discover

    runs = tmp_path / "runs"
    write_run(runs / "a", resumes=[30], buggy=True)
    write_run(runs / "b", resumes=[], buggy=False, seed=1)
    units, _ = discover(runs, spec=str(runs))
    assert all(cache.will_read(u, root=runs, spec=str(runs)) for u in units)
    read_local(str(runs), read_unit=cache.read_unit)
    assert not any(cache.will_read(u, root=runs, spec=str(runs)) for u in units)
    (path,) = (runs / "b").glob("events.out.tfevents.*")
    with open(path, "ab") as f:
        f.write(b"\0" * 16)
    assert [u.path for u in units if cache.will_read(u, root=runs, spec=str(runs))] == [path]
