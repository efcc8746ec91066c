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
        assert "busy.db" in str(err.value) and "locked" in str(err.value)

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
    assert "broken.db" in str(err.value)

    read = read_source(str(tmp_path))
    errors = [s.error for s in read.segments if s.error]
    assert len(errors) == 1 and "broken.db" in errors[0]


def test_a_sqlite_file_that_is_not_an_mlflow_store_is_an_error(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (x)")
    con.commit()
    con.close()
    with pytest.raises(ReadError, match=r"other\.db: not an MLflow store"):
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


def test_bad_run_folder_becomes_an_error_naming_it_and_the_rest_is_read(
        tmp_path: Path, file_store: Store) -> None:
    import shutil

    root = tmp_path / "mlruns"
    shutil.copytree(file_store.path, root)
    exp_dir = next(root.glob(f"*/{file_store.ids['resumed']}")).parent
    bad_metric = exp_dir / file_store.ids["grouped"] / "metrics" / "train" / "kl_penalty"
    bad_metric.write_text("1760000000000 0.5 1\nthis is not a metric line at all\n")
    (exp_dir / file_store.ids["child"] / "meta.yaml").unlink()

    read = read_source(str(tmp_path))
    assert read.kinds == ["mlflow"]
    errors = {s.ref: s.error for s in read.segments if s.error}
    good = [s for s in read.segments if not s.error]
    assert [s.run_id for s in good] == [file_store.ids["resumed"]]
    assert set(errors) == {f"mlruns/{exp_dir.name}/{file_store.ids['grouped']}",
                           f"mlruns/{exp_dir.name}/{file_store.ids['child']}"}
    assert "kl_penalty" in errors[f"mlruns/{exp_dir.name}/{file_store.ids['grouped']}"]
    assert "meta.yaml" in errors[f"mlruns/{exp_dir.name}/{file_store.ids['child']}"]


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
