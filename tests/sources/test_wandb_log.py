"""The ``.wandb`` log reader, on run folders written by the real wandb client (offline mode).

The runs are written once per module (``wandb.init`` is slow) by two real processes: the first
logs a run, a new-run restart of it and a run with nested and non-numeric values; the second
resumes the first run's id (the same W&B run, a second folder) and rewinds it with
``resume_from``. The rows each run logs are planned here and handed to the writer as JSON, so the
tests compare what we read with exactly what was logged.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from klwatch.sources import read_source
from klwatch.sources.local import ReadError, read_local
from klwatch.sources.wandb_log import BLOCK, read_wandb_run_dir
from wandb_framing import frame_wandb_log, in_payload
from wandb_offline import offline_env

CONFIG = {"lr": 1e-6, "kl_coef": 0.05, "model": {"name": "qwen", "size": 7}}


def _first_rows() -> list[dict]:
    return [{"train/kl_penalty": 0.01 + 1e-4 * s, "train/reward": math.sin(s / 7), "train/global_step": s,
             "label": "warmup" if s < 5 else "main"} for s in range(300)]


def _resumed_rows() -> list[dict]:  # the second process resumes from the step-200 checkpoint
    return [{"train/kl_penalty": 1e-5 * (s - 199), "train/reward": math.cos(s / 7), "train/global_step": s}
            for s in range(200, 260)]


def _restart_rows() -> list[dict]:  # a new W&B run continuing the step axis
    return [{"train/kl_penalty": 2e-3 + 1e-5 * s, "train/global_step": s} for s in range(300, 340)]


def _nested_rows() -> list[dict]:
    return [{"train": {"kl": 0.5 * i, "deep": {"x": i - 2}}, "flag": i % 2 == 0, "text": "abc", "none": None,
             "big": 10 ** 20, "neg_inf": float("-inf"), "nan": float("nan"), "hist": {"_type": "histogram"}}
            for i in range(5)]


PLAN = {
    "first": [
        {"label": "first", "init": {"id": "grpoa1", "name": "grpo-7b", "group": "grpo-7b", "job_type": "train",
                                    "config": CONFIG, "tags": ["rl", "grpo"]},
         "rows": [[s, r] for s, r in enumerate(_first_rows())], "summary": {"best": 1.5},
         "config_update": {"added_later": 3}},
        {"label": "restart", "init": {"id": "grpoc1", "name": "grpo-7b", "group": "grpo-7b", "config": CONFIG},
         "rows": [[300 + i, r] for i, r in enumerate(_restart_rows())]},
        {"label": "nested", "init": {"id": "nested1", "name": "nested"},
         "rows": [[i, r] for i, r in enumerate(_nested_rows())]},
    ],
    "second": [
        {"label": "resumed", "init": {"id": "grpoa1", "name": "grpo-7b", "group": "grpo-7b", "resume": "allow",
                                      "config": CONFIG},
         "rows": [[200 + i, r] for i, r in enumerate(_resumed_rows())]},
        {"label": "rewound", "init": {"resume_from": "grpoa1?_step=100", "name": "grpo-7b", "group": "grpo-7b"},
         "rows": [[101 + i, {"train/kl_penalty": 0.5 + i}] for i in range(3)]},
    ],
}

WRITER = r"""
import json, sys, time, wandb
plan = json.load(open(sys.argv[1]))
out = {}
for run_plan in plan:
    time.sleep(1.05 - time.time() % 1)  # folders are named by the second: never reuse one
    run = wandb.init(project="klwatch-test", **run_plan["init"])
    for step, row in run_plan["rows"]:
        run.log(row, step=step)
    for k, v in run_plan.get("summary", {}).items():
        run.summary[k] = v
    if run_plan.get("config_update"):
        run.config.update(run_plan["config_update"])
    out[run_plan["label"]] = str(__import__("pathlib").Path(run.dir).parent)
    run.finish()
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """label -> run folder, written by two real wandb processes in offline mode."""
    root = tmp_path_factory.mktemp("wandb-offline")
    script = root / "writer.py"
    script.write_text(WRITER)
    env = offline_env(root)
    folders: dict[str, Path] = {}
    for process in ("first", "second"):
        (root / f"{process}.json").write_text(json.dumps(PLAN[process]))
        subprocess.run([sys.executable, str(script), str(root / f"{process}.json"), str(root / f"{process}.out")],
                       env=env, check=True, timeout=180, cwd=root)
        folders.update({k: Path(v) for k, v in json.loads((root / f"{process}.out").read_text()).items()})
    return folders


def read(folder: Path):
    [seg] = read_wandb_run_dir(folder, ref=folder.name, source=str(folder.parent))
    return seg


def planned(label: str) -> list[tuple[int, dict]]:
    return [(s, r) for s, r in next(p for ps in PLAN.values() for p in ps if p["label"] == label)["rows"]]


def assert_series_as_logged(seg, rows: list[tuple[int, dict]], key: str) -> None:
    expect = [(s, r[key]) for s, r in rows if key in r]
    got = seg.series[key]
    assert got.steps.tolist() == [s for s, _ in expect]
    assert got.values.tolist() == [float(v) for _, v in expect]


def test_offline_run_reads_back_exactly_what_was_logged(runs: dict[str, Path]) -> None:
    seg = read(runs["first"])
    assert seg.error is None and seg.warnings == []
    assert (seg.kind, seg.run_id, seg.name, seg.group) == ("wandb-offline", "grpoa1", "grpo-7b", "grpo-7b")
    assert seg.store == str(runs["first"].parent)
    for key in ("train/kl_penalty", "train/reward", "train/global_step"):
        assert_series_as_logged(seg, planned("first"), key)
    assert "label" not in seg.series  # text is not a metric
    assert seg.config == {**CONFIG, "added_later": 3}
    assert seg.tags == {"rl": "", "grpo": ""}
    assert seg.meta["job_type"] == "train" and seg.meta["summary"]["best"] == pytest.approx(1.5)
    assert seg.meta["summary"]["train/global_step"] == 299  # the summary follows the last row
    runtime = seg.series["_runtime"]
    assert runtime.steps.tolist() == list(range(300))
    assert np.all(np.diff(runtime.values) >= 0) and runtime.values[0] >= 0
    wall = seg.series["train/kl_penalty"].wall_times
    assert wall is not None and np.all(np.diff(wall) >= 0)
    assert seg.start_time is not None and seg.start_time <= wall[0] < seg.start_time + 120
    assert abs(wall[0] - runtime.values[0] - seg.start_time) < 30


def test_resumed_process_is_its_own_segment_with_the_same_run_id(runs: dict[str, Path]) -> None:
    first, resumed = read(runs["first"]), read(runs["resumed"])
    assert runs["first"] != runs["resumed"]
    assert resumed.run_id == first.run_id == "grpoa1" and resumed.name == "grpo-7b"
    assert resumed.meta["resumed"] is True and first.meta["resumed"] is False
    assert_series_as_logged(resumed, planned("resumed"), "train/kl_penalty")
    assert resumed.start_time > first.series["train/kl_penalty"].wall_times[-1]  # a later process
    assert resumed.config == CONFIG


def test_new_run_restart_has_its_own_id_and_the_same_group(runs: dict[str, Path]) -> None:
    seg = read(runs["restart"])
    assert (seg.run_id, seg.group, seg.name) == ("grpoc1", "grpo-7b", "grpo-7b")
    assert_series_as_logged(seg, planned("restart"), "train/kl_penalty")


def test_rewind_gives_the_step_it_resumed_from(runs: dict[str, Path]) -> None:
    seg = read(runs["rewound"])
    assert seg.resumed_from_step == 100
    assert seg.meta["branch_point"] == {"run": "grpoa1", "value": 100.0, "metric": "_step"}
    assert seg.series["train/kl_penalty"].steps.tolist() == [101, 102, 103]
    assert read(runs["first"]).resumed_from_step is None


def test_nested_keys_are_joined_and_non_numbers_skipped(runs: dict[str, Path]) -> None:
    seg = read(runs["nested"])
    rows = _nested_rows()
    assert seg.series["train.kl"].values.tolist() == [r["train"]["kl"] for r in rows]
    assert seg.series["train.deep.x"].values.tolist() == [r["train"]["deep"]["x"] for r in rows]
    assert seg.series["big"].values.tolist() == [1e20] * 5
    assert seg.series["neg_inf"].values.tolist() == [-math.inf] * 5
    assert np.isnan(seg.series["nan"].values).all() and len(seg.series["nan"]) == 5
    for skipped in ("flag", "text", "none", "hist", "hist._type"):
        assert skipped not in seg.series
    assert seg.meta["summary"]["train.kl"] == pytest.approx(2.0)


def test_reader_agrees_with_wandbs_own_protobuf_and_json_per_value(runs: dict[str, Path]) -> None:
    """Decode every record with wandb's own ``Record`` class and ``json.loads`` per value: the
    same series, rows in the same order, and the same run record."""
    from wandb.proto import wandb_internal_pb2 as pb

    from klwatch.sources.wandb_log import read_records

    for label in ("first", "nested", "rewound"):
        log = next(runs[label].glob("*.wandb"))
        records, _ = read_records(log.read_bytes(), name=log.name)
        expect: dict[str, list[tuple[int, float]]] = {}
        for payload in records:
            rec = pb.Record.FromString(payload)
            if rec.WhichOneof("record_type") == "run":
                run = rec.run
            if rec.WhichOneof("record_type") != "history":
                continue
            row = {".".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
            for k, v in row.items():
                if k not in ("_step", "_timestamp") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    expect.setdefault(k, []).append((row["_step"], float(v)))
        seg = read(runs[label])
        assert set(seg.series) == set(expect)
        for k, pairs in expect.items():
            assert seg.series[k].steps.tolist() == [s for s, _ in pairs]
            np.testing.assert_array_equal(seg.series[k].values, [v for _, v in pairs])
        assert (seg.run_id, seg.name or "", seg.group or "") == (run.run_id, run.display_name, run.run_group)
        assert seg.start_time == run.start_time.seconds + run.start_time.nanos / 1e9


def test_truncated_file_keeps_whole_records_and_warns(runs: dict[str, Path], tmp_path: Path) -> None:
    full = read(runs["first"])
    data = next(runs["first"].glob("*.wandb")).read_bytes()
    rng = np.random.default_rng(3)
    # 3 bytes into the last record: the writer may end a block with zero padding, which a cut of the
    # file's last 3 bytes would only shorten (depending on how long the client's records came out)
    end = len(data.rstrip(b"\x00"))
    # and one inside a record's payload near the middle (a cut that lands on a record boundary leaves a
    # shorter whole file, with nothing to warn about)
    mid = in_payload(data, len(data) // 2)
    cuts = [end - 3, mid, BLOCK + 5, 5000] + rng.integers(7, len(data), 12).tolist()
    for cut in cuts:
        folder = tmp_path / f"cut{cut}" / runs["first"].name
        folder.mkdir(parents=True)
        (folder / next(runs["first"].glob("*.wandb")).name).write_bytes(data[:cut])
        seg = read(folder)
        assert seg.error is None
        for key, s in seg.series.items():  # exactly a prefix of what the whole file holds
            n = len(s)
            assert s.steps.tolist() == full.series[key].steps[:n].tolist()
            assert s.values.tolist() == full.series[key].values[:n].tolist()
        if cut in (end - 3, mid):
            assert any("cut short" in w for w in seg.warnings), seg.warnings
    half = read(tmp_path / f"cut{mid}" / runs["first"].name)
    assert 0 < len(half.series["train/kl_penalty"]) < 300


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]


def test_flipped_byte_is_an_error_naming_the_crc(runs: dict[str, Path], tmp_path: Path) -> None:
    """A single-block file has no later block to resynchronise on: the file is unreadable."""
    src = runs["nested"]
    log = next(src.glob("*.wandb"))
    data = log.read_bytes()
    assert len(data) < BLOCK
    root = tmp_path / "tree"
    folder = root / "wandb" / src.name
    folder.mkdir(parents=True)
    (folder / log.name).write_bytes(_flip(data, in_payload(data, len(data) // 2)))
    with pytest.raises(ReadError, match="CRC mismatch"):
        read(folder)
    out = read_local(str(root))
    [seg] = out.segments
    assert seg.error is not None and "CRC mismatch" in seg.error and src.name in seg.error


def test_a_chunk_length_running_past_the_end_of_the_file_reads_as_a_cut_not_as_damage(tmp_path: Path) -> None:
    """A header whose length byte is flipped (0x00 -> 0x40: 16 KiB more) declares a chunk that ends inside
    its block but past the end of the file: exactly what a log cut short by a crash, or still being
    written, holds (LevelDB's own reader takes it as the end of the file too), so the records before it
    are read, with a cut-short warning; no CRC can say otherwise, since the payload is not all there."""
    from wandb.proto import wandb_internal_pb2 as pb

    def row(step: int) -> bytes:
        h = pb.HistoryRecord()
        h.item.add(nested_key=["_step"], value_json=str(step))
        h.item.add(nested_key=["kl"], value_json=str(0.5 * step))
        return pb.Record(history=h).SerializeToString()

    data = bytearray(frame_wandb_log([row(s) for s in range(10)]))
    assert len(data) < BLOCK // 2
    header = 7 + sum(7 + len(row(s)) for s in range(5))  # the sixth record's chunk header
    assert struct.unpack_from("<H", data, header + 4)[0] == len(row(5)) < 256
    data[header + 5] ^= 0x40
    folder = tmp_path / "run-20260101_000000-cut1"
    folder.mkdir()
    (folder / "run-cut1.wandb").write_bytes(bytes(data))
    seg = read(folder)
    assert seg.error is None and seg.series["kl"].values.tolist() == [0.5 * s for s in range(5)]
    assert any(f"cut short at byte {len(data)} inside a record" in w for w in seg.warnings), seg.warnings


def test_corrupt_block_is_skipped_to_the_next_block_with_a_warning(runs: dict[str, Path], tmp_path: Path) -> None:
    full = read(runs["first"])
    log = next(runs["first"].glob("*.wandb"))
    data = log.read_bytes()
    assert len(data) > 3 * BLOCK
    folder = tmp_path / runs["first"].name
    folder.mkdir()
    (folder / log.name).write_bytes(_flip(data, in_payload(data, BLOCK + 3000)))
    seg = read(folder)
    assert any("CRC mismatch" in w and "next 32 KiB block" in w for w in seg.warnings), seg.warnings
    got, whole = seg.series["train/kl_penalty"], full.series["train/kl_penalty"]
    assert 0 < len(whole) - len(got) < 200  # the rest of one block is lost, no more
    pairs = set(zip(whole.steps.tolist(), whole.values.tolist()))
    assert set(zip(got.steps.tolist(), got.values.tolist())) <= pairs
    assert got.steps[-1] == whole.steps[-1] and got.steps[0] == whole.steps[0]
    # corruption in the last block leaves nothing to resynchronise on
    at = in_payload(data, len(data) - 40)
    assert at // BLOCK == (len(data) - 1) // BLOCK
    (folder / log.name).write_bytes(_flip(data, at))
    with pytest.raises(ReadError, match="CRC mismatch"):
        read(folder)


def test_not_a_wandb_log_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "run-20260101_000000-abc"
    folder.mkdir()
    (folder / "run-abc.wandb").write_bytes(b"\x00" * 100)
    with pytest.raises(ReadError, match="not a W&B transaction log"):
        read(folder)
    (folder / "run-abc.wandb").write_bytes(b":W&B")
    with pytest.raises(ReadError, match="shorter than its 7-byte header"):
        read(folder)


def test_older_item_layouts_typed_values_and_removals(tmp_path: Path) -> None:
    """Items keyed by ``key`` (the pre-core writer), typed values, records spanning blocks, and
    summary/config removals, framed around wandb's own protobuf messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    def record(**kw) -> bytes:
        return pb.Record(**kw).SerializeToString()

    run = pb.RunRecord(run_id="old1", display_name="legacy", run_group="g", project="p")
    run.config.update.add(key="lr", value_json='{"value": 0.1, "desc": null}')
    run.config.update.add(key="blob", value_json=json.dumps("x" * 70000))  # spans three blocks
    records = [record(run=run)]
    for step in range(4):
        h = pb.HistoryRecord()
        h.item.add(key="_step", value_json=str(step))
        h.item.add(key="a", value_json=repr(1.5 * step))
        h.item.add(nested_key=["b", "c"], value_json=str(step))
        h.item.add(nested_key=["t"], number=0.25 * step)
        h.item.add(nested_key=["i"], integer=-step)
        h.item.add(nested_key=["u"], number=math.inf if step == 3 else math.nan if step == 2 else -0.5)
        h.item.add(nested_key=["s"], text="x")
        records.append(record(history=h))
        s = pb.SummaryRecord()
        s.update.add(key="a", value_json=repr(1.5 * step))
        s.update.add(key="gone", value_json="1")
        records.append(record(summary=s))
    removal = pb.SummaryRecord()
    removal.remove.add(key="gone")
    records.append(record(summary=removal))
    cfg = pb.ConfigRecord()
    cfg.remove.add(key="blob")
    records.append(record(config=cfg))
    folder = tmp_path / "run-20260101_000000-old1"
    folder.mkdir()
    data = frame_wandb_log(records)
    assert len(data) > 2 * BLOCK
    (folder / "run-old1.wandb").write_bytes(data)
    seg = read(folder)
    assert seg.warnings == []
    assert (seg.run_id, seg.name, seg.group) == ("old1", "legacy", "g")
    assert seg.config == {"lr": 0.1}
    assert seg.series["a"].values.tolist() == [0.0, 1.5, 3.0, 4.5]
    assert seg.series["b.c"].values.tolist() == [0, 1, 2, 3]
    assert seg.series["t"].values.tolist() == [0.0, 0.25, 0.5, 0.75]
    assert seg.series["i"].values.tolist() == [0, -1, -2, -3]
    u = seg.series["u"].values
    assert u[:2].tolist() == [-0.5, -0.5] and np.isnan(u[2]) and u[3] == math.inf
    assert "s" not in seg.series and "_timestamp" not in seg.series
    assert seg.series["a"].wall_times is None and seg.series["a"].steps.tolist() == [0, 1, 2, 3]
    assert seg.meta["summary"] == {"a": 4.5}


def test_read_source_discovers_run_folders_at_any_depth(runs: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "tree"
    placed = {"first": root / "a" / "b" / "c" / "wandb", "resumed": root / "a" / "b" / "c" / "wandb",
              "restart": root / "x" / "wandb"}
    for label, parent in placed.items():
        shutil.copytree(runs[label], parent / runs[label].name)
    out = read_source(str(root))
    assert out.errors == [] and out.kinds == ["wandb-offline"]
    refs = sorted(s.ref for s in out.segments)
    assert refs == sorted(str((placed[k] / runs[k].name).relative_to(root)) for k in placed)
    by_ref = {s.ref: s for s in out.segments}
    seg = by_ref[str((placed["restart"] / runs["restart"].name).relative_to(root))]
    assert seg.run_id == "grpoc1" and seg.store == str(placed["restart"])
    assert len(seg.series["train/kl_penalty"]) == 40


def test_undecodable_record_with_a_good_crc_is_skipped_with_a_warning(tmp_path: Path) -> None:
    from wandb.proto import wandb_internal_pb2 as pb

    def row(step: int) -> bytes:
        h = pb.HistoryRecord()
        h.item.add(nested_key=["_step"], value_json=str(step))
        h.item.add(nested_key=["kl"], value_json=str(0.5 * step))
        return pb.Record(history=h).SerializeToString()

    bad_row = b"\x12\x03\x0a\x7f\x00"  # a history record whose item claims 127 bytes it does not have
    bad_summary = b"\x1a\x03\x0a\x7f\x00"
    folder = tmp_path / "run-20260101_000000-bad1"
    folder.mkdir()
    (folder / "run-bad1.wandb").write_bytes(frame_wandb_log([row(0), bad_row, row(1), bad_summary, row(2)]))
    seg = read(folder)
    assert seg.series["kl"].values.tolist() == [0.0, 0.5, 1.0]
    assert any("could not be decoded" in w for w in seg.warnings), seg.warnings


def _ld(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, by hand: damaged records cannot be made by wandb's classes."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while n >= 0x80:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        return bytes(out + bytes([n]))
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_records_with_a_good_crc_but_damaged_contents_cost_only_themselves_named_by_byte(tmp_path: Path) -> None:
    """What fuzzing found: contents that decode as protobuf but break the reader further on (a key
    that is not UTF-8, a history step that is not a message, summary bytes that parse only joined to
    the next record). Each once dropped the whole run with a bare TypeError / DecodeError."""
    from wandb.proto import wandb_internal_pb2 as pb

    def row(step: int) -> bytes:
        h = pb.HistoryRecord()
        h.item.add(nested_key=["_step"], value_json=str(step))
        h.item.add(nested_key=["kl"], value_json=str(0.5 * step))
        return pb.Record(history=h).SerializeToString()

    not_utf8_key = _ld(2, _ld(1, _ld(2, b"k\xff") + b"\x31" + struct.pack("<d", 1.5)))  # typed value, bad key
    summary_not_utf8 = _ld(3, _ld(1, _ld(1, b"\xfe") + _ld(8, b"1")))
    bad_step = _ld(2, _ld(1, _ld(2, b"kl") + _ld(16, b"9")) + _ld(2, b"\xff\xff"))
    half_summary = _ld(3, b"\x0a\x05abc")  # claims 5 bytes, has 3: parses only joined to the next one
    rest_of_it = _ld(3, b"de\x12\x03\x0a\x01x")  # ... and a removal, so the summary is replayed
    records = [pb.Record(run=pb.RunRecord(run_id="bad2")).SerializeToString(), row(0), not_utf8_key, row(1),
               summary_not_utf8, bad_step, row(2), half_summary, rest_of_it, row(3)]
    folder = tmp_path / "run-20260101_000000-bad2"
    folder.mkdir()
    (folder / "run-bad2.wandb").write_bytes(frame_wandb_log(records))

    out = read_local(str(folder))
    [seg] = out.segments
    assert seg.error is None and out.errors == [] and seg.run_id == "bad2"
    assert seg.series["kl"].steps.tolist() == [0, 1, 2, 2, 3]  # the bad step's row numbered from the row before
    assert seg.series["kl"].values.tolist() == [0.0, 0.5, 9.0, 1.0, 1.5]
    assert seg.series["k\ufffd"].values.tolist() == [1.5]  # a key that is not UTF-8: read, its byte replaced
    assert "run-bad2.wandb: 2 history rows have no usable _step (none, or one beyond +-2**53); numbered from their neighbours" in seg.warnings
    dropped = [w for w in seg.warnings if "could not be decoded" in w]
    assert len(dropped) == 1 and dropped[0].startswith("run-bad2.wandb: 2 records with a good CRC could not be "
                                                       "decoded (at bytes ")
