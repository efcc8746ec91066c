"""Local MLflow stores, written by the real MlflowClient and read back by klwatch's own readers."""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from klwatch.sources import read_source
from klwatch.sources.local import ReadError
from klwatch.sources import mlflow_local
from klwatch.sources.mlflow_local import read_mlflow_sqlite, read_mlruns

T0 = 1_760_000_000_000  # ms
SAMPLE_DB = Path(__file__).resolve().parents[2] / "sample_runs" / "mlflow" / "mlflow.db"


@dataclass
class Store:
    uri: str
    path: Path
    ids: dict[str, str]


def log_runs(uri: str) -> dict[str, str]:
    """The same runs into any store: a resumed run re-logging steps, NaN, points sharing a
    timestamp, a nested run, a grouped run, a deleted run and a deleted experiment."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("grpo")
    ids: dict[str, str] = {}

    run = c.create_run(exp, run_name="grpo-7b", start_time=T0)
    rid = ids["resumed"] = run.info.run_id
    c.log_batch(rid, params=[Param("lr", "1e-06"), Param("batch", "64"), Param("use_kl", "True"),
                             Param("model", "qwen-7b"), Param("beta", "0.04")],
                tags=[RunTag("team", "rl")])
    # first process: steps 1..10; after a crash the same run is resumed from step 5: 6..15 again
    first = [Metric("train/kl_penalty", 0.01 * s, T0 + 1000 * s, s) for s in range(1, 11)]
    second = [Metric("train/kl_penalty", 0.0001 * s, T0 + 60_000 + 1000 * s, s) for s in range(6, 16)]
    c.log_batch(rid, metrics=first)
    c.log_batch(rid, metrics=second)
    c.log_batch(rid, metrics=[Metric("loss", float("nan"), T0 + 500, 1),
                              Metric("loss", 2.5, T0 + 1500, 2)])
    # three points logged in one call with one timestamp: only the logged order tells them apart
    c.log_batch(rid, metrics=[Metric("reward", 0.3, T0 + 9000, 3), Metric("reward", 0.1, T0 + 9000, 2),
                              Metric("reward", 0.2, T0 + 9000, 1)])
    c.set_terminated(rid, end_time=T0 + 100_000)

    child = c.create_run(exp, run_name="rollout-worker", start_time=T0 + 10,
                         tags={"mlflow.parentRunId": rid})
    ids["child"] = child.info.run_id
    c.log_metric(child.info.run_id, "kl", 0.5, timestamp=T0 + 20, step=0)

    grouped = c.create_run(exp, run_name="grpo-7b-restart", start_time=T0 + 200_000,
                           tags={"group": "grpo-7b-family"})
    ids["grouped"] = grouped.info.run_id
    c.log_batch(grouped.info.run_id,
                metrics=[Metric("train/kl_penalty", 0.02 * s, T0 + 200_000 + s, s) for s in range(16, 21)])

    gone = c.create_run(exp, run_name="deleted-run")
    c.log_metric(gone.info.run_id, "kl", 1.0, step=0)
    c.delete_run(gone.info.run_id)
    ids["deleted"] = gone.info.run_id

    old = c.create_experiment("abandoned")
    orphan = c.create_run(old, run_name="in-deleted-experiment")
    c.log_metric(orphan.info.run_id, "kl", 1.0, step=0)
    c.delete_experiment(old)
    ids["in_deleted_exp"] = orphan.info.run_id
    return ids


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    path = tmp_path_factory.mktemp("sqlite") / "mlflow.db"
    uri = f"sqlite:///{path}"
    return Store(uri=uri, path=path, ids=log_runs(uri))


@pytest.fixture(scope="module")
def file_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    root = tmp_path_factory.mktemp("files") / "mlruns"
    old = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # mlflow 3 keeps the file store behind this flag
    try:
        ids = log_runs(root.as_uri())
        yield Store(uri=root.as_uri(), path=root, ids=ids)
    finally:
        if old is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = old


def copy_mlruns(tmp_path: Path, file_store: Store) -> tuple[Path, Path]:
    """A private copy of the client-written ``mlruns/`` (to damage) and its ``grpo`` experiment folder."""
    import shutil

    root = tmp_path / "mlruns"
    shutil.copytree(file_store.path, root)
    return root, next(root.glob(f"*/{file_store.ids['resumed']}")).parent


def client_histories(uri: str) -> dict[tuple[str, str], list[tuple[int, float, int]]]:
    """What the official client returns for every active run and metric."""
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    out = {}
    exps = [e.experiment_id for e in c.search_experiments()]
    for run in c.search_runs(exps):
        for key in run.data.metrics:
            out[(run.info.run_id, key)] = [(m.timestamp, m.value, m.step)
                                           for m in c.get_metric_history(run.info.run_id, key)]
    return out


def ours(segments) -> dict[tuple[str, str], list[tuple[int, float, int]]]:
    return {(s.run_id, k): [(int(round(t * 1000)), float(v), int(st))
                            for t, v, st in zip(ser.wall_times, ser.values, ser.steps)]
            for s in segments for k, ser in s.series.items()}


def nan_safe(points: list[tuple[int, float, int]]) -> list[tuple[int, str, int]]:
    return sorted((t, "nan" if math.isnan(v) else repr(v), s) for t, v, s in points)


def by_name(segments):
    return {s.name: s for s in segments}


def assert_same_as_client(segments, uri: str) -> None:
    mine, theirs = ours(segments), client_histories(uri)
    assert mine.keys() == theirs.keys()
    for key, points in theirs.items():
        assert nan_safe(mine[key]) == nan_safe(points), key  # the same multiset of points
        times = [t for t, _, _ in mine[key]]
        assert times == sorted(times), key  # and ours is in time order


# -- SQLite ---------------------------------------------------------------------------------------


def test_sqlite_histories_equal_client_get_metric_history(sqlite_store: Store) -> None:
    segs = read_mlflow_sqlite(sqlite_store.path, ref="mlflow.db", source="mlflow.db")
    assert_same_as_client(segs, sqlite_store.uri)


def test_sqlite_resumed_run_keeps_rewind_and_duplicated_steps_in_time_order(sqlite_store: Store) -> None:
    seg = by_name(read_mlflow_sqlite(sqlite_store.path, ref="mlflow.db", source="x"))["grpo-7b"]
    kl = seg.series["train/kl_penalty"]
    assert kl.steps.tolist() == list(range(1, 11)) + list(range(6, 16))
    assert kl.values[10] == pytest.approx(0.0006) and kl.values[9] == pytest.approx(0.1)
    assert np.all(np.diff(kl.wall_times) > 0)
    assert kl.wall_times[0] == (T0 + 1000) / 1000.0


def test_sqlite_points_sharing_a_timestamp_keep_their_logged_order(sqlite_store: Store) -> None:
    seg = by_name(read_mlflow_sqlite(sqlite_store.path, ref="mlflow.db", source="x"))["grpo-7b"]
    assert seg.series["reward"].steps.tolist() == [3, 2, 1]
    assert seg.series["reward"].values.tolist() == [0.3, 0.1, 0.2]
    loss = seg.series["loss"]
    assert math.isnan(loss.values[0]) and loss.values[1] == pytest.approx(2.5)


def test_sqlite_run_carries_name_group_config_tags_store_and_meta(sqlite_store: Store) -> None:
    segs = read_mlflow_sqlite(sqlite_store.path, ref="mlflow.db", source="runs/mlflow.db")
    named = by_name(segs)
    main = named["grpo-7b"]
    assert main.kind == "mlflow" and main.ref == main.run_id == sqlite_store.ids["resumed"]
    assert main.source == "runs/mlflow.db"
    assert main.config == {"lr": 1e-06, "batch": 64, "use_kl": True, "model": "qwen-7b", "beta": 0.04}
    assert main.tags["team"] == "rl"
    assert main.group is None
    assert main.start_time == T0 / 1000.0
    assert main.store == f"{sqlite_store.path.resolve()}#grpo"
    assert main.meta["experiment"] == "grpo" and main.meta["status"] == "FINISHED"
    assert main.meta["lifecycle_stage"] == "active" and main.meta["end_time"] == (T0 + 100_000) / 1000
    assert named["rollout-worker"].group == "grpo-7b"  # nested: the parent run's name
    assert named["grpo-7b-restart"].group == "grpo-7b-family"  # an explicit group tag


def test_sqlite_deleted_runs_and_experiments_are_skipped(sqlite_store: Store) -> None:
    ids = {s.run_id for s in read_mlflow_sqlite(sqlite_store.path, ref="mlflow.db", source="x")}
    assert ids == {sqlite_store.ids[k] for k in ("resumed", "child", "grouped")}


def test_reading_leaves_the_sqlite_store_byte_for_byte_unchanged(sqlite_store: Store) -> None:
    folder = sqlite_store.path.parent
    before = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
              for p in folder.iterdir()}
    read_mlflow_sqlite(sqlite_store.path, ref="mlflow.db", source="x")
    read_source(str(folder))
    after = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
             for p in folder.iterdir()}
    assert after == before  # same files (no journal left behind), same bytes, same mtimes


def test_locked_sqlite_store_fails_fast_with_a_clear_error(
        tmp_path: Path, sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mlflow_local, "SQLITE_BUSY_TIMEOUT_S", 0.5)
    db = tmp_path / "busy.db"
    db.write_bytes(sqlite_store.path.read_bytes())
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA journal_mode=DELETE")
    writer.execute("BEGIN EXCLUSIVE")  # what a writer mid-commit holds: readers must wait
    try:
        t = time.monotonic()
        with pytest.raises(ReadError) as err:
            read_mlflow_sqlite(db, ref="busy.db", source=str(db))
        assert time.monotonic() - t < 60  # the lock is never released: only the busy timeout ends the wait
        assert "locked by another process" in str(err.value)  # read_unit names the file

        t = time.monotonic()
        read = read_source(str(tmp_path))
        assert time.monotonic() - t < 60
        errors = [s.error for s in read.segments if s.error]
        assert len(errors) == 1 and "busy.db" in errors[0] and "locked" in errors[0]
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_corrupt_sqlite_store_is_an_error_naming_the_file(tmp_path: Path, sqlite_store: Store) -> None:
    good = sqlite_store.path.read_bytes()
    db = tmp_path / "broken.db"
    # a valid header and first page, then garbage where the tables' pages were
    db.write_bytes(good[:4096] + bytes(range(256)) * ((len(good) - 4096) // 256))
    with pytest.raises(ReadError) as err:
        read_mlflow_sqlite(db, ref="broken.db", source=str(db))
    assert str(err.value).startswith("not a readable SQLite database")  # read_unit names the file

    read = read_source(str(tmp_path))
    errors = [s.error for s in read.segments if s.error]
    assert len(errors) == 1 and "broken.db" in errors[0]


def sqlite_with(db: Path, *statements: str) -> Path:
    """A SQLite file made by running ``statements``."""
    con = sqlite3.connect(db)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()
    return db


def test_a_sqlite_file_that_is_not_an_mlflow_store_is_an_error(tmp_path: Path) -> None:
    db = sqlite_with(tmp_path / "other.db", "CREATE TABLE runs (x)")
    with pytest.raises(ReadError, match=r"^not an MLflow store"):
        read_mlflow_sqlite(db, ref="other.db", source=str(db))


# -- mlruns/ file store ---------------------------------------------------------------------------


def test_file_store_written_by_the_client_reads_back_exactly(file_store: Store) -> None:
    segs = read_mlruns(file_store.path, ref="mlruns", source="mlruns")
    assert_same_as_client(segs, file_store.uri)
    assert {s.run_id for s in segs} == {file_store.ids[k] for k in ("resumed", "child", "grouped")}
    named = by_name(segs)
    main = named["grpo-7b"]
    assert main.series["train/kl_penalty"].steps.tolist() == list(range(1, 11)) + list(range(6, 16))
    assert main.series["reward"].steps.tolist() == [3, 2, 1]
    assert main.config == {"lr": 1e-06, "batch": 64, "use_kl": True, "model": "qwen-7b", "beta": 0.04}
    assert main.meta["status"] == "FINISHED" and main.start_time == T0 / 1000.0
    assert main.store == f"{file_store.path.resolve()}#grpo"
    assert named["rollout-worker"].group == "grpo-7b"
    assert named["grpo-7b-restart"].group == "grpo-7b-family"


def test_file_store_and_sqlite_store_give_the_same_runs(file_store: Store, sqlite_store: Store) -> None:
    a = by_name(read_mlruns(file_store.path, ref="mlruns", source="x"))
    b = by_name(read_mlflow_sqlite(sqlite_store.path, ref="mlflow.db", source="x"))
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].series.keys() == b[name].series.keys()
        for key in a[name].series:
            sa, sb = a[name].series[key], b[name].series[key]
            assert sa.steps.tolist() == sb.steps.tolist()
            np.testing.assert_array_equal(sa.values, sb.values)


def test_bad_metric_line_costs_that_metric_and_a_missing_meta_yaml_that_run(
        tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    bad_metric = exp_dir / file_store.ids["grouped"] / "metrics" / "train" / "kl_penalty"
    bad_metric.write_text("1760000000000 0.5 1\nthis is not a metric line at all\n")
    (exp_dir / file_store.ids["child"] / "meta.yaml").unlink()

    read = read_source(str(tmp_path))
    assert read.kinds == ["mlflow"]
    errors = {s.ref: s.error for s in read.segments if s.error}
    good = {s.run_id: s for s in read.segments if not s.error}
    assert set(good) == {file_store.ids["resumed"], file_store.ids["grouped"]}
    assert set(errors) == {f"mlruns/{exp_dir.name}/{file_store.ids['child']}"}
    assert "meta.yaml" in errors[f"mlruns/{exp_dir.name}/{file_store.ids['child']}"]
    grouped = good[file_store.ids["grouped"]]
    assert grouped.series == {}
    [warning] = grouped.warnings
    assert f"mlruns/{exp_dir.name}/{file_store.ids['grouped']}/metrics/train/kl_penalty: line 2" in warning
    assert "left out" in warning


def test_local_discovery_reads_sqlite_and_mlruns_side_by_side(
        tmp_path: Path, file_store: Store, sqlite_store: Store) -> None:
    import shutil

    shutil.copytree(file_store.path, tmp_path / "mlruns")
    shutil.copy(sqlite_store.path, tmp_path / "mlflow.db")
    read = read_source(str(tmp_path))
    assert read.kinds == ["mlflow"] and not read.errors
    stores = {s.store.split("#")[0] for s in read.segments}
    assert stores == {str((tmp_path / "mlruns").resolve()), str((tmp_path / "mlflow.db").resolve())}
    assert len(read.segments) == 6 and not any(s.error for s in read.segments)


# -- hostile and damaged mlruns/ (issue 12): the smallest thing that failed, named ------------------

ALIAS_BOMB = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
       f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]" for i in range(8)]
) + "\nname: bomb\n"


def warnings_of(read) -> list[str]:
    return [w for s in read.segments for w in s.warnings] + list(read.warnings)


def test_yaml_alias_bomb_in_experiment_meta_costs_only_its_name_and_is_refused_at_once(
        tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    (exp_dir / "meta.yaml").write_text(ALIAS_BOMB)
    t = time.monotonic()
    read = read_source(str(tmp_path))
    assert time.monotonic() - t < 30  # 9 levels of 9 aliases: refused at the first, never expanded
    assert not read.errors and not any(s.error for s in read.segments)
    assert {s.run_id for s in read.segments} == {file_store.ids[k] for k in ("resumed", "child", "grouped")}
    assert {s.meta["experiment"] for s in read.segments} == {exp_dir.name}  # named by its id
    [warning] = warnings_of(read)
    assert f"mlruns/{exp_dir.name}/meta.yaml" in warning and "alias" in warning


def test_yaml_alias_bomb_in_a_run_meta_costs_that_run_only(tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    (exp_dir / file_store.ids["child"] / "meta.yaml").write_text(ALIAS_BOMB)
    read = read_source(str(tmp_path))
    [bad] = [s for s in read.segments if s.error]
    assert bad.ref == f"mlruns/{exp_dir.name}/{file_store.ids['child']}"
    assert "meta.yaml" in bad.error and "alias" in bad.error
    assert {s.run_id for s in read.segments if not s.error} == {file_store.ids["resumed"], file_store.ids["grouped"]}


def test_damaged_experiment_meta_costs_only_its_name_with_a_warning(tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    (exp_dir / "meta.yaml").write_bytes(b"name: [grpo\nlifecycle_stage: \xff active\n")
    read = read_source(str(tmp_path))
    assert not any(s.error for s in read.segments) and len(read.segments) == 3
    assert {s.meta["experiment"] for s in read.segments} == {exp_dir.name}
    [warning] = warnings_of(read)
    assert f"mlruns/{exp_dir.name}/meta.yaml: damaged experiment meta.yaml" in warning
    assert "its runs are read" in warning


def test_one_non_utf8_byte_costs_only_that_metric_param_or_tag(tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    run = exp_dir / file_store.ids["resumed"]
    (run / "metrics" / "train" / "kl_penalty").write_bytes(b"1760000001000 0.\xff1 1\n")
    (run / "params" / "lr").write_bytes(b"1e-0\xfe6")
    (run / "tags" / "team").write_bytes(b"r\xc3")
    read = read_source(str(tmp_path))
    seg = {s.run_id: s for s in read.segments}[file_store.ids["resumed"]]
    assert seg.error is None
    assert set(seg.series) == {"loss", "reward"}
    assert "lr" not in seg.config and seg.config["batch"] == 64
    assert "team" not in seg.tags and seg.name == "grpo-7b"
    ref = f"mlruns/{exp_dir.name}/{file_store.ids['resumed']}"
    assert sorted(seg.warnings) == sorted([
        f"{ref}/metrics/train/kl_penalty: not UTF-8 (byte 16); this metric is left out",
        f"{ref}/params/lr: not UTF-8 (byte 4); this param is left out",
        f"{ref}/tags/team: not UTF-8 (byte 1); this tag is left out",
    ])
    assert len([s for s in read.segments if not s.error]) == 3  # the store, and its other runs, are read


def test_a_step_of_2_to_the_70_costs_that_metric_naming_file_and_line(tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    loss = exp_dir / file_store.ids["resumed"] / "metrics" / "loss"
    loss.write_text(loss.read_text() + f"{T0 + 5000} 0.5 {2 ** 70}\n")
    read = read_source(str(tmp_path))
    seg = {s.run_id: s for s in read.segments}[file_store.ids["resumed"]]
    assert seg.error is None and "loss" not in seg.series and "train/kl_penalty" in seg.series
    [warning] = seg.warnings
    assert f"{file_store.ids['resumed']}/metrics/loss: line 3: step '{2 ** 70}' does not fit in 64 bits" in warning
    assert not read.errors and len(read.segments) == 3


def test_unterminated_last_line_of_a_metric_file_is_left_out_with_a_warning(
        tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    kl = exp_dir / file_store.ids["grouped"] / "metrics" / "train" / "kl_penalty"
    kl.write_text(kl.read_text() + f"{T0 + 300_000} 0.0")  # a write in progress: ' 21\n' not there yet
    read = read_source(str(tmp_path))
    seg = {s.run_id: s for s in read.segments}[file_store.ids["grouped"]]
    assert seg.series["train/kl_penalty"].steps.tolist() == [16, 17, 18, 19, 20]
    [warning] = seg.warnings
    assert "metrics/train/kl_penalty: its last line" in warning and "no line end" in warning


def test_fifo_and_device_in_a_run_folder_are_never_opened(tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    run = exp_dir / file_store.ids["resumed"]
    os.mkfifo(run / "metrics" / "fifo_metric")
    os.symlink("/dev/zero", run / "metrics" / "zeros")
    os.mkfifo(run / "params" / "fifo_param")
    child_meta = exp_dir / file_store.ids["child"] / "meta.yaml"
    child_meta.unlink()
    os.mkfifo(child_meta)
    t = time.monotonic()
    read = read_source(str(tmp_path))
    assert time.monotonic() - t < 30  # a FIFO opened for reading would block forever
    seg = {s.run_id: s for s in read.segments}[file_store.ids["resumed"]]
    assert sorted(w.split(f"{run.name}/", 1)[1] for w in seg.warnings) == [
        "metrics/fifo_metric: not a regular file (a FIFO); not opened; this metric is left out",
        "metrics/zeros: not a regular file (a character device); not opened; this metric is left out",
        "params/fifo_param: not a regular file (a FIFO); not opened; this param is left out",
    ]
    [bad] = [s for s in read.segments if s.error]
    assert bad.ref.endswith(file_store.ids["child"]) and "meta.yaml: not a regular file (a FIFO)" in bad.error


def remove_deep(top: Path) -> None:
    """Remove a folder chain too deep for ``shutil.rmtree`` (it recurses once per level, and pytest's
    clean-up of old temporary folders would fail on it)."""
    from klwatch.sources.limits import walk

    for folder, _dirs, files in reversed(list(walk(top))):
        for name in files:
            (folder / name).unlink()
        folder.rmdir()


def test_a_metric_nested_1100_folders_deep_is_read_without_recursion(tmp_path: Path, file_store: Store) -> None:
    root, exp_dir = copy_mlruns(tmp_path, file_store)
    metrics = exp_dir / file_store.ids["grouped"] / "metrics"
    fd = os.open(metrics, os.O_RDONLY)
    try:
        for _ in range(1100):  # os.makedirs itself recurses once per level
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("kl", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, f"{T0} 0.25 7\n".encode())
        os.close(leaf)
    finally:
        os.close(fd)
    try:
        read = read_source(str(tmp_path))
    finally:
        remove_deep(metrics / "d")
    seg = {s.run_id: s for s in read.segments}[file_store.ids["grouped"]]
    assert seg.series["/".join(["d"] * 1100 + ["kl"])].steps.tolist() == [7]
    assert not read.errors and not any(s.error for s in read.segments)


# -- SQLite stores opened touching nothing (issue 12) ------------------------------------------------


def file_states(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file in ``folder``: its bytes (hashed) and its mtime."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir())}


def make_wal_store(into: Path, sqlite_store: Store, *, frames: bool) -> Path:
    """A WAL-mode copy of the client-written store in ``into``: switched with ``PRAGMA
    journal_mode=WAL``, then written by the real client. With ``frames`` the db, its ``-wal`` and
    ``-shm`` are copied while connections are open (as a live writer, or one killed, leaves them);
    without, every connection is closed first, which checkpoints and removes the wal."""
    import shutil

    from mlflow import MlflowClient
    from mlflow.entities import Metric

    work = into.parent / f"{into.name}-work"
    work.mkdir()
    db = work / "mlflow.db"
    db.write_bytes(sqlite_store.path.read_bytes())
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    con.execute("PRAGMA wal_autocheckpoint=0")
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    client.log_batch(sqlite_store.ids["resumed"],
                     metrics=[Metric("wal_only", 0.5 * s, T0 + 500_000 + s, s) for s in range(5)])
    into.mkdir()
    if frames:
        for p in work.iterdir():
            shutil.copy2(p, into / p.name)
        con.close()
    else:
        con.close()
        from mlflow.tracking._tracking_service.utils import _get_store

        _get_store(f"sqlite:///{db}").engine.dispose()  # the client's pooled connection too
        assert sorted(p.name for p in work.iterdir()) == ["mlflow.db"], list(work.iterdir())
        shutil.copy2(db, into / "mlflow.db")
    return into / "mlflow.db"


def test_wal_store_with_frames_is_read_from_a_private_copy_touching_nothing(
        tmp_path: Path, sqlite_store: Store) -> None:
    db = make_wal_store(tmp_path / "store", sqlite_store, frames=True)
    assert (db.parent / "mlflow.db-wal").stat().st_size > 0
    before = file_states(db.parent)
    segs = read_mlflow_sqlite(db, ref="mlflow.db", source="x")
    read = read_source(str(db.parent))
    assert file_states(db.parent) == before  # no file created, none changed, no mtime bumped
    for got in (segs, read.segments):
        main = by_name(got)["grpo-7b"]
        assert main.series["wal_only"].steps.tolist() == [0, 1, 2, 3, 4]  # the frames only in the wal
        assert main.series["train/kl_penalty"].steps.tolist() == list(range(1, 11)) + list(range(6, 16))
    assert not read.errors


def test_wal_store_without_a_wal_is_read_immutable_creating_nothing(tmp_path: Path, sqlite_store: Store) -> None:
    db = make_wal_store(tmp_path / "store", sqlite_store, frames=False)
    assert db.read_bytes()[18:20] == b"\x02\x02"  # a WAL-mode database
    before = file_states(db.parent)
    for _ in range(2):  # today's bug showed on the second read: -shm bumped
        read = read_source(str(db.parent))
        assert file_states(db.parent) == before
    assert not read.errors and by_name(read.segments)["grpo-7b"].series["wal_only"].steps.tolist() == [0, 1, 2, 3, 4]


_DIE_MID_TRANSACTION = """
import os, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size=5")  # pages spill into the db before the commit
con.execute("BEGIN")
run = con.execute("SELECT run_uuid FROM runs LIMIT 1").fetchone()[0]
for i in range(20000):
    con.execute("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES ('spill', 1, ?, ?, ?, 0)",
                (i, run, i))
os._exit(9)  # as kill -9 does: no rollback, the journal left hot
"""


def test_a_store_whose_writer_died_mid_transaction_reads_as_committed_touching_nothing(
        tmp_path: Path, sqlite_store: Store) -> None:
    """A hot rollback journal (a training killed while MLflow committed) needs a writer to roll it
    back: read-only SQLite refuses the store, so it is read from a private copy where it rolls back."""
    import subprocess
    import sys

    db = tmp_path / "mlflow.db"
    db.write_bytes(sqlite_store.path.read_bytes())
    subprocess.run([sys.executable, "-c", _DIE_MID_TRANSACTION, str(db)], timeout=120)
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0
    before = file_states(tmp_path)
    read = read_source(str(tmp_path))
    assert file_states(tmp_path) == before
    assert not read.errors and not any(s.error for s in read.segments)
    assert {s.run_id for s in read.segments} == {sqlite_store.ids[k] for k in ("resumed", "child", "grouped")}
    assert not any("spill" in s.series for s in read.segments)  # the uncommitted rows are not read


_READ_AS_NOBODY = """
import json, sys
from klwatch.sources import read_source
out = {}
for folder in sys.argv[1:]:
    r = read_source(folder)
    out[folder] = [len([s for s in r.segments if not s.error]), [e.message for e in r.errors]
                   + [s.error for s in r.segments if s.error]]
print(json.dumps(out))
"""


def _summary(read) -> list:
    """[runs read, every error message] of one read."""
    return [len([s for s in read.segments if not s.error]),
            [e.message for e in read.errors] + [s.error for s in read.segments if s.error]]


def _as_unprivileged_user(folders: list[Path]) -> dict[str, list]:
    """Read each folder as a user who may not write there: this process when it is not root, else a
    subprocess with uid/gid 65534 (``setpriv``); skipped when neither can be arranged."""
    import json
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0:
        return {str(f): _summary(read_source(str(f))) for f in folders}
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and setpriv is not installed: cannot read as an unprivileged user")
    cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
    probe = subprocess.run(cmd + ["import klwatch"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"uid 65534 cannot import klwatch here: {probe.stderr.strip()[-200:]}")
    done = subprocess.run(cmd + [_READ_AS_NOBODY, *map(str, folders)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HOME": "/tmp"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_stores_in_a_read_only_folder_are_readable_by_an_unprivileged_user(sqlite_store: Store) -> None:
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="klwatch-ro-"))  # not under pytest's 0700 tmp: uid 65534 must get in
    try:
        base.chmod(0o755)
        rollback = base / "rollback"
        rollback.mkdir()
        shutil.copy2(sqlite_store.path, rollback / "mlflow.db")
        stores = [rollback, base / "wal-empty", base / "wal-frames"]
        make_wal_store(stores[1], sqlite_store, frames=False)
        make_wal_store(stores[2], sqlite_store, frames=True)
        before = {}
        for folder in stores:
            for p in folder.iterdir():
                p.chmod(0o444)
            folder.chmod(0o555)
            before[folder] = file_states(folder)
        got = _as_unprivileged_user(stores)
        assert got == {str(f): [3, []] for f in stores}
        assert {f: file_states(f) for f in stores} == before
    finally:
        for folder in base.iterdir():
            folder.chmod(0o755)
        shutil.rmtree(base)


@pytest.mark.parametrize("table", ["runs", "metrics"])
def test_a_store_missing_its_runs_or_metrics_table_is_an_error_naming_the_file(
        tmp_path: Path, sqlite_store: Store, table: str) -> None:
    db = tmp_path / "mlflow.db"
    db.write_bytes(sqlite_store.path.read_bytes())
    sqlite_with(db, "PRAGMA foreign_keys=OFF", f"DROP TABLE {table}")
    with pytest.raises(ReadError, match=rf"^not an MLflow store \(no {table} table\)"):
        read_mlflow_sqlite(db, ref="mlflow.db", source=str(db))
    read = read_source(str(tmp_path))
    errors = [e.message for e in read.errors] + [s.error for s in read.segments if s.error]
    assert len(errors) == 1 and "mlflow.db" in errors[0] and f"no {table} table" in errors[0]


def store_with_a_non_utf8_table_name(into: Path) -> Path:
    """The sample store with one byte of the ``experiments`` table's name in ``sqlite_master`` made
    0xFF (what a bit flip found by the fuzz suite did): SQLite's error quotes that byte."""
    data = bytearray(SAMPLE_DB.read_bytes())
    data[data.rfind(b"experiments", 0, data.find(b"CREATE TABLE experiments"))] = 0xFF
    db = into / "mlflow.db"
    db.write_bytes(bytes(data))
    return db


def test_a_damaged_schema_whose_error_is_not_utf8_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ReadError, match=r"^not a readable SQLite database \(damaged"):
        read_mlflow_sqlite(store_with_a_non_utf8_table_name(tmp_path), ref="mlflow.db", source="x")


def test_a_damaged_schema_whose_error_is_not_utf8_named_directly_is_an_error_naming_it(tmp_path: Path) -> None:
    read = read_source(str(store_with_a_non_utf8_table_name(tmp_path)))
    errors = [e.message for e in read.errors] + [s.error for s in read.segments if s.error]
    assert len(errors) == 1 and errors[0].startswith("mlflow.db: not a readable SQLite database (damaged")


def test_a_sqlite_file_without_any_mlflow_table_is_not_a_log(tmp_path: Path) -> None:
    db = sqlite_with(tmp_path / "cache.db", "CREATE TABLE items (k, v)")
    with pytest.raises(mlflow_local.NotALog, match="not an MLflow store"):
        read_mlflow_sqlite(db, ref="cache.db", source=str(db))


def test_sqlite_read_is_bounded_by_the_source_budget(tmp_path: Path, sqlite_store: Store) -> None:
    from klwatch.sources.limits import Budget, LimitExceeded, ReadLimits, reading

    read = read_source(str(sqlite_store.path), limits=ReadLimits(max_bytes=10_000))
    assert [s.error for s in read.segments if s.error] == [] and len(read.errors) == 1
    assert "--max-read-bytes" in read.errors[0].message and "mlflow.db" in read.errors[0].message
    budget = Budget(ReadLimits())  # on the sample store: big enough for a query to be interrupted
    con = mlflow_local._connect(mlflow_local._uri(SAMPLE_DB, "mode=ro"), budget)
    budget.deadline = time.monotonic() - 1  # the SOURCE's deadline passed: a query under way is interrupted
    with reading(budget), pytest.raises(LimitExceeded, match="--max-read-seconds"):
        mlflow_local._query_store(con, abspath=SAMPLE_DB, source="x", who="mlflow.db", budget=budget)
    con.close()


# -- ±inf (issue 12): never "score": NaN downstream --------------------------------------------------


def log_infinities(uri: str) -> str:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    c = MlflowClient(tracking_uri=uri)
    run = c.create_run(c.create_experiment("inf"), run_name="inf", start_time=T0)
    c.log_batch(run.info.run_id, metrics=[Metric("kl", v, T0 + s, s) for s, v in
                                          enumerate([0.5, math.inf, -math.inf, 0.25, math.nan])])
    return run.info.run_id


def test_infinities_logged_by_the_client_are_read_as_nan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    db, files = tmp_path / "inf.db", tmp_path / "mlruns"
    log_infinities(f"sqlite:///{db}")
    log_infinities(files.as_uri())
    [[stored]] = sqlite3.connect(db).execute("SELECT MAX(value) FROM metrics").fetchall()
    assert stored == pytest.approx(mlflow_local.MLFLOW_INF)  # what MLflow's SQL store writes for +inf
    for segs in (read_mlflow_sqlite(db, ref="inf.db", source="x"), read_mlruns(files, ref="mlruns", source="x")):
        vals = segs[0].series["kl"].values
        assert vals[0] == pytest.approx(0.5) and vals[3] == pytest.approx(0.25)
        assert np.isnan(vals[[1, 2, 4]]).all()


def test_store_with_infinities_scans_to_valid_json(tmp_path: Path) -> None:
    """A resumed run whose KL the real client logged with ±inf at every other step: the JSON report
    must parse with NaN and Infinity refused (``"score": NaN`` is not JSON)."""
    import json
    import subprocess
    import sys

    from mlflow import MlflowClient
    from mlflow.entities import Metric

    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.create_experiment("inf")
    for seg in read_mlflow_sqlite(SAMPLE_DB, ref="mlflow.db", source="x"):
        if not (seg.name or "").startswith("resume-buggy"):
            continue
        run = c.create_run(exp, run_name=seg.name, start_time=int(seg.start_time * 1000), tags={"group": seg.group})
        points = [Metric(key, (math.inf if i % 4 == 0 else -math.inf) if "kl" in key and i % 2 == 0 else float(v),
                         int(round(t * 1000)), int(st))
                  for key, s in seg.series.items() for i, (st, v, t) in enumerate(zip(s.steps, s.values, s.wall_times))]
        for i in range(0, len(points), 900):
            c.log_batch(run.info.run_id, metrics=points[i:i + 900])
    cli = "import sys; from klwatch.cli import main; sys.argv[0] = 'klwatch'; main()"
    done = subprocess.run([sys.executable, "-c", cli, "scan", str(tmp_path), "-f", "json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "Traceback" not in done.stderr

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in the JSON report")

    report = json.loads(done.stdout, parse_constant=refuse)
    assert report["lineages"] and all(b["score"] is None or math.isfinite(b["score"])
                                      for lin in report["lineages"] for b in lin["boundaries"])


@pytest.mark.parametrize("expression", ["hex(zeroblob(50000000))", "printf('%.*c', 100000000, 'x')"])
def test_a_store_whose_values_a_generated_column_expands_is_read_in_bounded_memory(tmp_path: Path,
                                                                                    expression: str) -> None:
    """A 1 MB store whose params.value is a virtual generated column of 100 MB a row took 23 GB: SQLite now
    refuses any value past 1 MiB (a named per-file error) or yields none, and the rest is read."""
    from bounded_run import klwatch_bounded

    store = tmp_path / "store"
    store.mkdir()
    db = store / "mlflow.db"
    db.write_bytes(SAMPLE_DB.read_bytes())
    con = sqlite3.connect(db)
    con.executescript(f"""
        ALTER TABLE params RENAME TO params_old;
        CREATE TABLE params (key VARCHAR(250) NOT NULL, src TEXT, run_uuid VARCHAR(32) NOT NULL,
                             value TEXT GENERATED ALWAYS AS ({expression}) VIRTUAL);
        INSERT INTO params (key, src, run_uuid) SELECT key, value, run_uuid FROM params_old;
        DROP TABLE params_old;""")
    con.commit()
    con.close()
    assert db.stat().st_size < 2 << 20
    got = klwatch_bounded("scan", str(store), "--no-cache")
    assert got.peak_mib < 1024 and got.seconds < 60, (got.peak_mib, got.seconds)
    if expression.startswith("hex"):
        assert got.returncode == 2 and "mlflow.db: a value in the store is longer than 1,048,576 bytes" in got.stderr
    else:  # SQLite's printf gives NULL past the limit: the runs are read, without that param
        assert got.returncode in (0, 1) and "reference_reset" in got.stdout, got.stderr[-500:]
