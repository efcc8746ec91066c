"""The local-path dispatcher (``klwatch.sources.local``): which reader each file or folder of a tree
goes to, in what order, what is never walked into, and how what cannot be read is reported.

The trees are made of real logs: TensorBoard event files from tensorboardX, a W&B offline run
folder and an MLflow SQLite store copied from the committed sample runs (written by the real wandb
and MLflow clients), an ``mlruns`` file store written by the MLflow client, tables written by
pandas and checkpoint folders laid out as NeMo-RL, Hugging Face and verl save them. Every reader
runs for real; the tests only look at what the dispatcher made of them.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from klwatch.model import Segment, SourceError, SourceRead
from klwatch.sources import read_source
from klwatch.sources.checkpoints import read_checkpoint_dir
from klwatch.sources.local import Unit, UnitRead, discover, read_local, read_unit
from klwatch.sources.mlflow_local import read_mlflow_sqlite
from klwatch.sources.tables import read_table
from klwatch.sources.tensorboard import read_tensorboard_file
from klwatch.sources.wandb_log import read_wandb_run_dir

SAMPLES = Path(__file__).resolve().parents[2] / "sample_runs"
MLFLOW_DB = SAMPLES / "mlflow" / "mlflow.db"
TbWriter = Callable[[Path, list[tuple[str, int, float, float]]], Path]
"""The ``write_tbx`` fixture: real tensorboardX scalars into a folder, the event file back."""
KL = [("train/kl", s, 0.01 * s, 1_700_000_000.0 + s) for s in range(1, 21)]


def sample_wandb_run() -> Path:
    """One W&B offline run folder of the committed samples (written by the real wandb client)."""
    return sorted((SAMPLES / "wandb").rglob("offline-run-*"))[0]


def write_csv(path: Path, steps: range) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"step": list(steps), "train/kl": [0.5 * s for s in steps]}).to_csv(path, index=False)
    return path


def write_checkpoint(folder: Path, step: int) -> Path:
    """A NeMo-RL ``step_N`` checkpoint folder as the trainer saves it (weights left out)."""
    folder.mkdir(parents=True)
    (folder / "training_info.json").write_text(json.dumps({"step": step, "consumed_samples": 64 * step}))
    return folder


def write_prompts(path: Path) -> Path:
    """A dataset of prompts: a table file that holds no run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"question {i}", "answer": "yes"}) + "\n" for i in range(3)))
    return path


def make_every_kind(root: Path, write_tbx: TbWriter) -> dict[str, Path]:
    """One of each thing the dispatcher knows, each at its own depth of ``root``."""
    tb = write_tbx(root / "tb" / "grpo", KL)
    run = shutil.copytree(sample_wandb_run(), root / "wandb" / sample_wandb_run().name)
    db = Path(shutil.copy(MLFLOW_DB, root / "mlflow.db"))
    table = write_csv(root / "exports" / "metrics.csv", range(1, 11))
    ckpts = root / "checkpoints"
    for step in (10, 20):
        write_checkpoint(ckpts / f"step_{step}", step)
    return {"tb": tb, "wandb": run, "mlflow": db, "table": table, "checkpoints": ckpts}


def shape(segments: list[Segment]) -> list[tuple]:
    """What a Segment says, in a form that compares (numpy arrays as lists)."""
    return [(s.kind, s.ref, s.source, s.run_id, s.name, s.group, s.store, s.error, s.warnings,
             s.checkpoint_steps, {k: (v.steps.tolist(), v.values.tolist()) for k, v in s.series.items()})
            for s in segments]


def of_kind(read: SourceRead, kind: str) -> list[Segment]:
    return [s for s in read.segments if s.kind == kind]


# ------------------------------------------------------------------------------ every reader


def test_a_tree_of_every_kind_is_read_by_each_reader_in_a_fixed_order(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    paths = make_every_kind(tmp_path, write_tbx)
    spec = str(tmp_path)
    read = read_local(spec)

    assert read.errors == [] and read.warnings == []
    assert read.kinds == ["tensorboard", "table", "wandb-offline", "mlflow", "checkpoints"]
    assert [s.kind for s in read.segments] == sorted((s.kind for s in read.segments), key=read.kinds.index)
    # each piece went to its reader, with its path relative to the folder given as its ref
    rel = {k: str(p.relative_to(tmp_path)) for k, p in paths.items()}
    assert shape(of_kind(read, "tensorboard")) == shape(
        read_tensorboard_file(paths["tb"], ref=rel["tb"], source=spec))
    assert shape(of_kind(read, "table")) == shape(read_table(paths["table"], ref=rel["table"], source=spec))
    assert shape(of_kind(read, "wandb-offline")) == shape(
        read_wandb_run_dir(paths["wandb"], ref=rel["wandb"], source=spec))
    assert shape(of_kind(read, "mlflow")) == shape(
        read_mlflow_sqlite(paths["mlflow"], ref=rel["mlflow"], source=spec))
    assert shape(of_kind(read, "checkpoints")) == shape(
        read_checkpoint_dir(paths["checkpoints"], ref=rel["checkpoints"], source=spec))


def test_what_each_reader_gives_is_what_was_logged(tmp_path: Path, write_tbx: TbWriter) -> None:
    paths = make_every_kind(tmp_path, write_tbx)
    read = read_local(str(tmp_path))

    [tb] = of_kind(read, "tensorboard")
    assert tb.ref == f"tb/grpo/{paths['tb'].name}"
    assert tb.series["train/kl"].steps.tolist() == [s for _, s, _, _ in KL]
    assert tb.series["train/kl"].values.tolist() == pytest.approx([v for _, _, v, _ in KL])
    [wandb] = of_kind(read, "wandb-offline")
    assert wandb.ref == f"wandb/{paths['wandb'].name}"
    assert wandb.run_id == paths["wandb"].name.rsplit("-", 1)[-1]
    assert len(of_kind(read, "mlflow")) == len(read_source(str(MLFLOW_DB)).segments) > 0
    [table] = of_kind(read, "table")
    assert table.ref == "exports/metrics.csv" and table.series["train/kl"].steps.tolist() == list(range(1, 11))
    [ckpt] = of_kind(read, "checkpoints")
    assert ckpt.ref == "checkpoints" and ckpt.checkpoint_steps == [10, 20]


def test_units_come_by_kind_then_by_path_each_with_its_reader(tmp_path: Path, write_tbx: TbWriter) -> None:
    write_tbx(tmp_path / "b", KL)
    write_tbx(tmp_path / "a" / "deeper", KL)
    write_csv(tmp_path / "z.csv", range(3))
    write_csv(tmp_path / "a" / "y.csv", range(3))
    shutil.copy(MLFLOW_DB, tmp_path / "mlflow.db")
    shutil.copytree(sample_wandb_run(), tmp_path / "w" / sample_wandb_run().name)
    write_checkpoint(tmp_path / "ckpt" / "step_1", 1)

    units, errors = discover(tmp_path, spec=str(tmp_path))

    assert errors == []
    got = [(u.kind, str(u.path.relative_to(tmp_path)).split(os.sep)[0], u.reader.__name__) for u in units]
    assert got == [
        ("tensorboard", "a", "read_tensorboard_file"),
        ("tensorboard", "b", "read_tensorboard_file"),
        ("table", "a", "read_table"),
        ("table", "z.csv", "read_table"),
        ("wandb-offline", "w", "read_wandb_run_dir"),
        ("mlflow", "mlflow.db", "read_mlflow_sqlite"),
        ("checkpoints", "ckpt", "read_checkpoint_dir"),
    ]


def test_every_checkpoint_layout_makes_its_parent_folder_one_unit(tmp_path: Path) -> None:
    for layout, name in (("nemo", "step_{}"), ("hf", "checkpoint-{}"), ("verl", "global_step_{}")):
        for step in (5, 10):
            (tmp_path / layout / name.format(step)).mkdir(parents=True)
    units, _ = discover(tmp_path, spec=str(tmp_path))
    assert [(u.kind, u.path.name) for u in units] == [("checkpoints", "hf"), ("checkpoints", "nemo"),
                                                      ("checkpoints", "verl")]


def test_an_mlruns_store_written_by_the_mlflow_client_is_one_unit_whatever_its_folder_is_called(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps the file store behind this flag
    store = tmp_path / "tracking"  # not called mlruns: found by its experiment layout
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.create_run(client.create_experiment("grpo"), run_name="grpo-7b")
    client.log_batch(run.info.run_id, metrics=[Metric("train/kl", 0.1 * s, 1_700_000_000_000 + s, s)
                                               for s in range(1, 6)])
    client.set_terminated(run.info.run_id)
    write_csv(store / "0" / "stray.csv", range(3))  # inside the store: not walked into

    read = read_local(str(tmp_path))

    assert read.errors == [] and read.kinds == ["mlflow"]
    [seg] = read.segments
    assert (seg.run_id, seg.name) == (run.info.run_id, "grpo-7b")
    assert seg.series["train/kl"].steps.tolist() == [1, 2, 3, 4, 5]


# ------------------------------------------------------------------------------ what is not walked


def test_run_folders_checkpoints_and_tool_folders_are_never_walked_into(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    tb = write_tbx(tmp_path / "tb", KL)
    run = shutil.copytree(sample_wandb_run(), tmp_path / "wandb" / sample_wandb_run().name)
    ckpt = write_checkpoint(tmp_path / "ckpts" / "step_3", 3)
    inside = [run / "files", ckpt / "policy", tmp_path / ".git", tmp_path / "__pycache__", tmp_path / ".venv",
              tmp_path / "node_modules", tmp_path / "nb" / ".ipynb_checkpoints"]
    for folder in inside:  # a table and an event file in each, which would be read anywhere else
        write_csv(folder / "metrics.csv", range(3))
        shutil.copy(tb, folder / tb.name)

    units, _ = discover(tmp_path, spec=str(tmp_path))

    assert [(u.kind, u.path) for u in units] == [("tensorboard", tb), ("wandb-offline", run),
                                                 ("checkpoints", ckpt.parent)]


def test_an_empty_profiler_event_file_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "events.out.tfevents.1700000000.host.profile-empty").write_bytes(b"")
    read = read_local(str(tmp_path))
    assert read.segments == [] and read.kinds == []
    assert [e.message for e in read.errors] == [
        f"{tmp_path}: no runs found (no W&B run folders, MLflow stores, TensorBoard event files, tables "
        "or checkpoint folders)"]


def test_a_db_file_is_read_only_when_it_is_an_mlflow_store(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "cache.db")  # a SQLite database of something else
    con.execute("CREATE TABLE items (k TEXT, v TEXT)")
    con.commit()
    con.close()
    (tmp_path / "notes.db").write_text("not a database at all")
    shutil.copy(MLFLOW_DB, tmp_path / "runs.db")

    units, _ = discover(tmp_path, spec=str(tmp_path))

    assert [(u.kind, u.path.name) for u in units] == [("mlflow", "runs.db")]


def test_a_db_that_looks_like_sqlite_but_cannot_be_opened_goes_to_the_mlflow_reader_which_names_it(
        tmp_path: Path) -> None:
    (tmp_path / "broken.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    read = read_local(str(tmp_path))
    [seg] = read.segments
    assert (seg.kind, seg.ref) == ("mlflow", "broken.db")
    assert seg.error.startswith("broken.db: ") and "SQLite" in seg.error
    assert read.kinds == ["mlflow"]


# ------------------------------------------------------------------------------ what cannot be read


def test_a_missing_path_is_an_error_naming_it(tmp_path: Path) -> None:
    spec = str(tmp_path / "no-such-run")
    read = read_local(spec)
    assert read.errors == [SourceError(spec, f"no such file or folder: {spec}")]
    assert read.segments == [] and read.kinds == [] and read.warnings == []


def test_an_empty_folder_says_no_runs_were_found_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    spec = str(tmp_path / "empty")
    [error] = read_local(spec).errors
    assert error.spec == spec and error.message.startswith(f"{spec}: no runs found")


def test_a_home_relative_path_is_read_from_the_home_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_tbx: TbWriter) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write_tbx(tmp_path / "runs", KL)
    read = read_local("~/runs")
    assert read.spec == "~/runs" and read.kinds == ["tensorboard"] and read.errors == []


def test_a_corrupt_file_is_an_error_segment_naming_it_and_the_rest_of_the_tree_is_still_read(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    good = write_tbx(tmp_path / "good", KL)
    bad = tmp_path / "bad" / good.name
    bad.parent.mkdir()
    bad.write_bytes(b"this is no TFRecord stream, only text long enough to hold a header")
    table = write_csv(tmp_path / "metrics.csv", range(5))

    read = read_local(str(tmp_path))

    assert read.kinds == ["tensorboard", "table"] and read.errors == []
    by_ref = {s.ref: s for s in read.segments}
    assert set(by_ref) == {f"bad/{good.name}", f"good/{good.name}", table.name}
    assert by_ref[f"bad/{good.name}"].error.startswith(f"bad/{good.name}: corrupt event file")
    assert by_ref[f"bad/{good.name}"].store == str(bad.parent.resolve())  # as its reader names an event file's store
    assert by_ref[f"bad/{good.name}"].run_id == "bad"  # the run folder: it joins that training run
    assert by_ref[f"good/{good.name}"].error is None and "train/kl" in by_ref[f"good/{good.name}"].series


def test_a_table_that_holds_no_run_is_skipped_with_a_warning_during_a_walk(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    write_prompts(tmp_path / "data" / "prompts.jsonl")
    tb = write_tbx(tmp_path / "tb", KL)

    read = read_local(str(tmp_path))

    assert [s.ref for s in read.segments] == [f"tb/{tb.name}"]
    assert read.kinds == ["tensorboard"]  # the table was skipped: its kind is not among those found
    [warning] = read.warnings
    assert warning.startswith("data/prompts.jsonl: skipped, not a metrics table")


def test_a_folder_holding_only_a_dataset_has_the_warning_and_says_no_runs_were_found(tmp_path: Path) -> None:
    write_prompts(tmp_path / "prompts.jsonl")
    read = read_local(str(tmp_path))
    assert read.segments == [] and read.kinds == []
    assert read.warnings[0].startswith("prompts.jsonl: skipped")
    assert read.errors[0].message.startswith(f"{tmp_path}: no runs found")


def test_a_table_that_holds_no_run_is_an_error_when_it_is_the_file_named(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "prompts.jsonl")
    read = read_local(str(path))
    [seg] = read.segments
    assert (seg.kind, seg.ref) == ("table", "prompts.jsonl")
    assert seg.error.startswith("prompts.jsonl: not a metrics table")
    assert read.kinds == ["table"] and read.warnings == []


@contextmanager
def without_permissions(path: Path) -> Iterator[None]:
    """``path`` with no permissions inside the block, its own back after it. Root (or a process with
    CAP_DAC_OVERRIDE) reads anything: then there is nothing to test, and the test is skipped."""
    mode = path.stat().st_mode & 0o777
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("this process reads files whatever their permissions (root)")
        yield
    finally:
        path.chmod(mode)


def test_a_folder_that_cannot_be_listed_is_an_error_and_the_rest_is_still_read(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    write_tbx(tmp_path / "ok", KL)
    locked = tmp_path / "locked"
    locked.mkdir()
    with without_permissions(locked):
        read = read_local(str(tmp_path))
    assert read.kinds == ["tensorboard"]
    assert [e.ref for e in read.errors] == [str(locked)]
    assert read.errors[0].message.startswith(f"cannot list {locked}")
    shutil.rmtree(tmp_path / "ok")
    with without_permissions(locked):
        read = read_local(str(tmp_path))
    # nothing read, but the error says why: no "no runs found" on top of it
    assert read.segments == [] and [e.ref for e in read.errors] == [str(locked)]


def test_an_unreadable_path_is_a_permission_error_naming_it(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "metrics.csv", range(3))
    with without_permissions(path):
        read = read_local(str(path))
    assert read.errors == [SourceError(str(path), f"permission denied: {path}")] and read.segments == []


# ------------------------------------------------------------------------------ files named directly


def test_a_file_named_directly_is_read_alone_with_its_name_as_ref(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    paths = make_every_kind(tmp_path, write_tbx)
    for kind, path in (("tensorboard", paths["tb"]), ("table", paths["table"]), ("mlflow", paths["mlflow"])):
        read = read_local(str(path))
        assert read.kinds == [kind] and read.errors == []
        assert {s.kind for s in read.segments} == {kind}
    [tb] = read_local(str(paths["tb"])).segments
    assert tb.ref == paths["tb"].name
    [table] = read_local(str(paths["table"])).segments
    assert table.ref == "metrics.csv"


def test_a_run_folder_named_directly_is_read_as_itself(tmp_path: Path) -> None:
    run = shutil.copytree(sample_wandb_run(), tmp_path / sample_wandb_run().name)
    read = read_local(str(run))
    assert read.kinds == ["wandb-offline"] and read.errors == []
    [seg] = read.segments
    assert seg.ref == "." and seg.run_id == run.name.rsplit("-", 1)[-1]


# ------------------------------------------------------------------------------ the watcher's hook


def test_read_local_reads_each_discovered_unit_through_the_read_unit_it_is_given(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    make_every_kind(tmp_path, write_tbx)
    spec = str(tmp_path)
    seen: list[Unit] = []

    def recording(unit: Unit, *, root: Path, spec: str) -> UnitRead:
        seen.append(unit)
        return read_unit(unit, root=root, spec=spec)

    read = read_local(spec, read_unit=recording)

    assert seen == discover(tmp_path, spec=spec)[0]
    assert shape(read.segments) == shape(read_local(spec).segments)
    assert read.kinds == read_local(spec).kinds


def test_the_dispatcher_is_what_read_source_uses_for_a_local_path(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    make_every_kind(tmp_path, write_tbx)
    via_source, direct = read_source(str(tmp_path)), read_local(str(tmp_path))
    assert shape(via_source.segments) == shape(direct.segments)
    assert ((via_source.kinds, via_source.errors, via_source.warnings)
            == (direct.kinds, direct.errors, direct.warnings))



# ------------------------------------------------------------------------------ hostile trees (issue 12)


@contextmanager
def returns_within(seconds: float, fifos: list[Path]) -> Iterator[list[Callable[[], object]]]:
    """Fail, rather than hang the suite, when the block is still blocked on a FIFO after ``seconds``:
    the block runs in a daemon thread; a reader blocked on one of ``fifos`` is released at the end
    (opening a FIFO for writing without blocking gives its blocked reader an end of file)."""
    import threading

    errors: list[BaseException] = []
    done = threading.Event()

    def call(fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the test's own thread
            errors.append(exc)
        finally:
            done.set()

    holder: list[Callable[[], object]] = []
    yield holder  # the test appends the function to run
    thread = threading.Thread(target=call, args=(holder[0],), daemon=True)
    thread.start()
    finished = done.wait(seconds)
    for fifo in fifos:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader blocked on it: the wanted case
    thread.join(5)
    assert finished, f"still blocked after {seconds} s"
    if errors:
        raise errors[0]


def read_within(spec: str, fifos: list[Path], seconds: float = 60) -> SourceRead:
    """``read_source(spec)``, failing instead of hanging when it blocks."""
    got: list[SourceRead] = []
    with returns_within(seconds, fifos) as run:
        run.append(lambda: got.append(read_source(spec)))
    return got[0]


def plant_fifos(root: Path) -> list[Path]:
    """A FIFO under every name a reader would open: an event file, tables, a store, a W&B log in a
    run folder, a checkpoint's ``training_info.json``."""
    names = ["tb/events.out.tfevents.1700000000.host.1.0", "exports/metrics.csv", "exports/h.jsonl",
             "exports/t.parquet", "mlflow.db", "wandb/run-20260101_000000-abc1/run-abc1.wandb",
             "ckpt/step_5/training_info.json"]
    fifos = []
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        fifos.append(path)
    return fifos


def test_fifos_named_like_inputs_are_errors_naming_each_and_nothing_blocks(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    fifos = plant_fifos(tmp_path)
    good = write_tbx(tmp_path / "good", KL)

    read = read_within(str(tmp_path), fifos)

    assert [s.ref for s in read.segments if s.kind == "tensorboard"] == [f"good/{good.name}"]
    for fifo in fifos[:-1]:  # each named, with what it is
        rel = str(fifo.relative_to(tmp_path))
        assert SourceError(str(tmp_path), f"{rel}: not a regular file (a FIFO); not read", ref=rel) in read.errors, \
            (rel, read.errors)
    [ckpt] = [s for s in read.segments if s.kind == "checkpoints"]  # the checkpoint is read, its FIFO skipped
    assert ckpt.checkpoint_steps == [5]
    assert ckpt.warnings == ["ckpt/step_5/training_info.json: not a regular file (a FIFO); skipped"]


def test_a_socket_and_a_symlink_to_dev_zero_named_like_inputs_are_not_read_and_count_as_unreadable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_tbx: TbWriter) -> None:
    import socket

    write_tbx(tmp_path / "good", KL)
    (tmp_path / "events.out.tfevents.1700000000.zero").symlink_to("/dev/zero")
    (tmp_path / "zero.csv").symlink_to("/dev/zero")
    monkeypatch.chdir(tmp_path)  # a socket path must be short: bind it relative to here
    sock = socket.socket(socket.AF_UNIX)
    sock.bind("metrics.jsonl")
    try:
        read = read_within(str(tmp_path), [])
    finally:
        sock.close()
    assert [s.kind for s in read.segments] == ["tensorboard"]
    assert sorted(e.message for e in read.errors) == [
        "events.out.tfevents.1700000000.zero: not a regular file (a character device); not read",
        "metrics.jsonl: not a regular file (a socket); not read",
        "zero.csv: not a regular file (a character device); not read"]


@pytest.mark.parametrize("name", ["events.out.tfevents.1700000000.host", "metrics.csv", "mlflow.db"])
def test_a_fifo_or_a_device_named_directly_is_an_error_naming_it(tmp_path: Path, name: str) -> None:
    fifo, zero = tmp_path / name, tmp_path / "zero" / name
    os.mkfifo(fifo)
    zero.parent.mkdir()
    zero.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), (zero, "a character device")):
        read = read_within(str(path), [fifo])
        assert read.errors == [SourceError(str(path), f"{path}: not a regular file ({kind}); not read")]
        assert read.segments == []


@pytest.mark.parametrize("reader", [read_tensorboard_file, read_table, read_wandb_run_dir, read_checkpoint_dir])
def test_a_file_swapped_for_a_fifo_after_discovery_is_an_error_segment_naming_it_not_a_hang(
        tmp_path: Path, reader: Callable[..., list[Segment]]) -> None:
    """Between the walk and the read a name may become a FIFO: each reader opens without blocking and
    refuses what is not a regular file, naming it."""
    names = {read_tensorboard_file: "events.out.tfevents.1700000000.host", read_table: "metrics.csv",
             read_wandb_run_dir: "run-20260101_000000-abc1/run-abc1.wandb",
             read_checkpoint_dir: "ckpts/checkpoint-1/trainer_state.json"}
    fifo = tmp_path / names[reader]
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    target = fifo.parents[1] if reader is read_checkpoint_dir else (
        fifo.parent if reader is read_wandb_run_dir else fifo)
    unit = Unit({read_tensorboard_file: "tensorboard", read_table: "table", read_wandb_run_dir: "wandb-offline",
                 read_checkpoint_dir: "checkpoints"}[reader], target, reader)
    got: list[UnitRead] = []
    with returns_within(60, [fifo]) as run:
        run.append(lambda: got.append(read_unit(unit, root=tmp_path, spec=str(tmp_path))))
    [seg] = got[0].segments
    said = seg.error or " ".join(seg.warnings)
    assert fifo.name in said and "not a regular file (a FIFO)" in said, said


def make_deep(root: Path, depth: int) -> Path:
    """``root/d/d/.../d``, ``depth`` levels, made one level at a time (pathlib's mkdir(parents=True)
    recurses once per level)."""
    p = root
    for _ in range(depth):
        p = p / "d"
        p.mkdir()
    return p


def remove_deep(root: Path) -> None:
    """Remove a deep tree bottom-up without recursion (shutil.rmtree recurses once per level)."""
    from klwatch.sources.limits import walk

    for folder, _, files in reversed(list(walk(root))):  # a folder after everything below it
        for f in files:
            (folder / f).unlink()
        folder.rmdir()


def test_a_tree_990_folders_deep_is_read_not_a_recursion_error(tmp_path: Path, write_tbx: TbWriter) -> None:
    root = tmp_path / "deep"
    root.mkdir()
    bottom = make_deep(root, 990)
    try:
        write_csv(bottom / "metrics.csv", range(1, 6))
        tb = write_tbx(bottom / "tb", KL)
        read = read_source(str(root))
        assert read.errors == [] and read.kinds == ["tensorboard", "table"]
        rel = str(bottom.relative_to(root))
        assert sorted(s.ref for s in read.segments) == sorted([f"{rel}/tb/{tb.name}", f"{rel}/metrics.csv"])
        assert all(s.error is None for s in read.segments)
    finally:
        remove_deep(root)


def test_a_wandb_run_folder_without_its_log_is_a_warning_naming_it_and_an_error_when_named(
        tmp_path: Path, write_tbx: TbWriter) -> None:
    empty = tmp_path / "wandb" / "offline-run-20260101_000000-gone1"
    (empty / "files").mkdir(parents=True)
    (empty / "files" / "output.log").write_text("crashed before the first record\n")
    write_tbx(tmp_path / "runs" / "run-0000", KL)  # TensorBoard's run-* folders: not W&B, no warning
    read = read_local(str(tmp_path))
    assert read.kinds == ["tensorboard"] and read.errors == []
    assert read.warnings == ["wandb/offline-run-20260101_000000-gone1: a W&B run folder with no .wandb log "
                             "(deleted, or the run never started logging); nothing read from it"]
    named = read_local(str(empty))
    assert [(e.message, e.ref) for e in named.errors] == [
        (f"{empty}: a W&B run folder with no .wandb log (deleted, or the run never started logging); nothing "
         "read from it", str(empty))]


def write_tables(root: Path, n: int) -> list[Path]:
    return [write_csv(root / f"t{i}.csv", range(1, 200)) for i in range(n)]


def test_a_byte_bound_passed_stops_the_source_with_one_error_naming_the_flag_and_keeps_what_was_read(
        tmp_path: Path) -> None:
    from klwatch.sources.limits import ReadLimits

    tables = write_tables(tmp_path, 5)
    size = tables[0].stat().st_size
    read = read_source(str(tmp_path), limits=ReadLimits(max_bytes=int(2.5 * size)))

    assert [s.ref for s in read.segments] == ["t0.csv", "t1.csv"]  # what was read before stays
    assert all(s.error is None for s in read.segments)
    [error] = read.errors  # one error, not one per file left
    assert error.ref == str(tables[2])
    assert error.message == (f"reading {tmp_path} needs more than {int(2.5 * size):,} bytes (at {tables[2]}); raise "
                             "the bound with --max-read-bytes; stopped there: 2 of 5 files or run folders read, "
                             "the rest not")


def test_a_time_bound_passed_stops_the_source_with_one_error_naming_the_flag_and_keeps_what_was_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that moves one second each time it is read (no sleeping): the bound passes partway."""
    import itertools

    from klwatch.sources import limits

    write_tables(tmp_path, 5)
    ticks = itertools.count()
    monkeypatch.setattr(limits.time, "monotonic", lambda: float(next(ticks)))
    read = read_source(str(tmp_path), limits=limits.ReadLimits(max_seconds=8))

    assert 0 < len(read.segments) < 5 and all(s.error is None for s in read.segments)
    [error] = read.errors
    assert error.message.startswith(f"reading {tmp_path} took longer than 8 s (at ")
    assert "raise the bound with --max-read-seconds; stopped there" in error.message


def test_a_time_bound_passed_while_walking_is_one_error_naming_the_flag(tmp_path: Path) -> None:
    from klwatch.sources.limits import ReadLimits

    write_tables(tmp_path, 2)
    read = read_source(str(tmp_path), limits=ReadLimits(max_seconds=-1))
    assert read.segments == []
    assert [e.message for e in read.errors] == [
        f"reading {tmp_path} took longer than -1 s (at {tmp_path}); raise the bound with --max-read-seconds; "
        "stopped while looking for runs, nothing read"]


def test_looking_at_a_wal_mode_store_creates_and_touches_nothing_beside_it(tmp_path: Path) -> None:
    db = Path(shutil.copy(MLFLOW_DB, tmp_path / "mlflow.db"))
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    con.close()  # the last connection gone: SQLite removes -wal and -shm
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}

    units, errors = discover(tmp_path, spec=str(tmp_path))

    assert [(u.kind, u.path) for u in units] == [("mlflow", db)] and errors == []
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_a_store_whose_schema_names_are_not_utf8_goes_to_the_mlflow_reader_not_a_discovery_error(
        tmp_path: Path) -> None:
    """A damaged schema once let UnicodeDecodeError out of discovery, failing the whole SOURCE."""
    data = MLFLOW_DB.read_bytes()
    at = data.index(b"tablemetricsmetrics")
    (tmp_path / "mlflow.db").write_bytes(data[:at] + b"table\xffetricsmetrics" + data[at + 19:])
    units, errors = discover(tmp_path, spec=str(tmp_path))
    assert [(u.kind, u.path.name) for u in units] == [("mlflow", "mlflow.db")] and errors == []


def test_check_exits_3_not_0_when_a_file_named_like_an_input_could_not_be_read(tmp_path: Path) -> None:
    """A CI gate must not pass while something was not read: a symlink to /dev/zero or a FIFO named like a
    tracker file is unreadable (exit 3, the file named), unless a reset was found elsewhere (exit 1)."""
    import subprocess
    import sys

    healthy = tmp_path / "healthy"
    shutil.copytree(SAMPLES / "tensorboard" / "resume-fixed", healthy / "resume-fixed")
    (healthy / "events.out.tfevents.1700000000.zero").symlink_to("/dev/zero")
    os.mkfifo(healthy / "metrics.csv")
    cmd = [sys.executable, "-m", "klwatch.cli", "check", "--no-cache"]
    got = subprocess.run([*cmd, str(healthy)], capture_output=True, text=True, timeout=300)
    assert got.returncode == 3, (got.returncode, got.stdout, got.stderr)
    said = got.stdout + got.stderr
    assert "events.out.tfevents.1700000000.zero: not a regular file (a character device)" in said, said
    assert "metrics.csv: not a regular file (a FIFO)" in said, said
    shutil.copytree(SAMPLES / "tensorboard" / "resume-buggy", healthy / "resume-buggy")
    assert subprocess.run([*cmd, str(healthy)], capture_output=True, text=True, timeout=300).returncode == 1
