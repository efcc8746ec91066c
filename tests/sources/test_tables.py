"""The table reader: csv / jsonl / parquet, wide and long, segments, and what it refuses."""

from __future__ import annotations

import json
import math
import uuid
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from klwatch.sources import read_source
from klwatch.sources.local import ReadError
from klwatch.sources.tables import read_table
from klwatch.sources.tensorboard import read_tensorboard_file

FORMATS = ["csv", "jsonl", "parquet"]


def write(df: pd.DataFrame, path: Path) -> Path:
    """The frame as each format's usual writer writes it (missing cells stay missing)."""
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        with path.open("w") as fh:
            for rec in df.to_dict(orient="records"):
                fh.write(json.dumps({k: v for k, v in rec.items()
                                     if not (isinstance(v, float) and math.isnan(v))}) + "\n")
    else:
        df.to_parquet(path, index=False)
    return path


def read(path: Path):
    return read_table(path, ref=path.name, source=str(path.parent))


def series_of(seg) -> dict[str, tuple[list, list]]:
    return {k: (s.steps.tolist(), s.values.tolist()) for k, s in seg.series.items()}


@pytest.mark.parametrize("fmt", FORMATS)
def test_wide_table_keeps_every_row_in_order(tmp_path: Path, fmt: str) -> None:
    df = pd.DataFrame({
        "_step": [0, 1, 2, 3, 1, 2],  # a rewind must survive
        "train/kl_penalty": [0.0, 0.01, 0.02, 0.03, 0.0001, 0.005],
        "loss": [1.0, None, 0.8, None, 0.9, 0.7],  # not logged every row: skipped, no warning
        "note": ["a", "b", "c", "d", "e", "f"],  # text: not a metric
        "train/global_step": [10, 11, 12, 13, 11, 12],
    })
    (seg,) = read(write(df, tmp_path / f"run.{fmt}"))
    assert series_of(seg) == {
        "train/kl_penalty": ([0, 1, 2, 3, 1, 2], [0.0, 0.01, 0.02, 0.03, 0.0001, 0.005]),
        "loss": ([0, 2, 1, 2], [1.0, 0.8, 0.9, 0.7]),
        "train/global_step": ([0, 1, 2, 3, 1, 2], [10, 11, 12, 13, 11, 12]),
    }
    assert seg.warnings == [] and seg.kind == "table" and seg.ref == f"run.{fmt}"
    assert seg.meta["step_column"] == "_step" and seg.meta["layout"] == "wide"
    assert seg.store == str((tmp_path / f"run.{fmt}").resolve())


@pytest.mark.parametrize("name", ["step", "Step", "global_step", "train/global_step", "iteration",
                                  "ITERATION"])
def test_any_accepted_step_column_name_is_found(tmp_path: Path, name: str) -> None:
    (seg,) = read(write(pd.DataFrame({name: [5, 6], "kl": [0.1, 0.2]}), tmp_path / "t.csv"))
    assert series_of(seg) == {"kl": ([5, 6], [0.1, 0.2])}


@pytest.mark.parametrize("fmt", FORMATS)
def test_long_table_from_tbparse_matches_the_event_file(tmp_path: Path, fmt: str, write_tbx) -> None:
    from tbparse import SummaryReader

    points = [("train/kl_penalty", s, 0.01 * s, 1.78e9 + s) for s in range(5)]
    points += [("loss", s, 1.0 / (s + 1), 1.78e9 + s) for s in (0, 1, 2, 3)]  # tbparse sorts steps
    event_file = write_tbx(tmp_path / "tb", points)
    (from_tb,) = read_tensorboard_file(event_file, ref="tb", source=str(tmp_path))
    long = SummaryReader(str(event_file), extra_columns={"wall_time"}).scalars
    assert list(long.columns) == ["step", "tag", "value", "wall_time"]
    (seg,) = read(write(long, tmp_path / f"long.{fmt}"))
    assert seg.meta["layout"] == "long"
    assert set(seg.series) == set(from_tb.series)
    for tag, s in from_tb.series.items():
        assert seg.series[tag].steps.tolist() == s.steps.tolist()
        assert seg.series[tag].values.tolist() == s.values.tolist()
        assert np.allclose(seg.series[tag].wall_times, s.wall_times, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_long_table_keeps_row_order_per_tag_and_cuts_segments(tmp_path: Path, fmt: str) -> None:
    df = pd.DataFrame({
        "dir_name": ["a", "a", "a", "b", "a", "b"],
        "step": [1, 2, 2, 1, 1, 0],
        "metric": ["kl", "kl", "loss", "kl", "kl", "text"],
        "value": [0.1, 0.2, 3.0, 0.5, 0.01, "hello"],
    })
    if fmt == "parquet":  # a Parquet column has one type: no text among the values
        df = df.iloc[:-1].astype({"value": float})
    segs = read(write(df, tmp_path / f"t.{fmt}"))
    assert [series_of(s) for s in segs] == [
        {"kl": ([1, 2, 1], [0.1, 0.2, 0.01]), "loss": ([2], [3.0])}, {"kl": ([1], [0.5])}]
    assert [s.meta["layout"] for s in segs] == ["long", "long"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_segment_column_gives_one_segment_per_value_in_order_of_appearance(tmp_path: Path,
                                                                          fmt: str) -> None:
    df = pd.DataFrame({
        "restart": ["r2", "r2", "r0", "r0", "r2", "r1"],
        "step": [20, 21, 1, 2, 22, 10],
        "kl": [0.2, 0.21, 0.01, 0.02, 0.22, 0.1],
        "run_name": ["grpo", "grpo", "grpo", "grpo", "grpo", "grpo"],
    })
    segs = read(write(df, tmp_path / f"t.{fmt}"))
    assert [s.meta["segment_value"] for s in segs] == ["r2", "r0", "r1"]
    assert [series_of(s)["kl"] for s in segs] == [([20, 21, 22], [0.2, 0.21, 0.22]),
                                                  ([1, 2], [0.01, 0.02]), ([10], [0.1])]
    assert [s.ref for s in segs] == [f"t.{fmt}[restart=r2]", f"t.{fmt}[restart=r0]",
                                     f"t.{fmt}[restart=r1]"]
    assert len({s.run_id for s in segs}) == 3 and {s.group for s in segs} == {"t"}
    assert {s.name for s in segs} == {"grpo"}


def test_run_id_column_names_each_segment_after_its_run(tmp_path: Path) -> None:
    df = pd.DataFrame({"run_id": ["abc", "def"], "step": [1, 2], "kl": [0.1, 0.2]})
    segs = read(write(df, tmp_path / "t.csv"))
    assert [(s.run_id, s.name) for s in segs] == [("abc", "abc"), ("def", "def")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_table_without_a_step_column_is_an_error_naming_the_columns(tmp_path: Path, fmt: str) -> None:
    path = write(pd.DataFrame({"epoch": [1, 2], "kl": [0.1, 0.2]}), tmp_path / f"t.{fmt}")
    with pytest.raises(ReadError, match=r"no step column.*columns found: 'epoch', 'kl'"):
        read(path)


def test_non_integer_steps_are_an_error(tmp_path: Path) -> None:
    path = write(pd.DataFrame({"step": [1, 1.5], "kl": [0.1, 0.2]}), tmp_path / "t.csv")
    with pytest.raises(ReadError, match="non-integer step"):
        read(path)


def test_nan_and_inf_cells_are_dropped_with_a_warning_but_empty_cells_are_not(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("step,kl,loss\n1,0.1,1\n2,nan,\n3,inf,0.5\n4,-Infinity,\n5,0.5,NaN\n")
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"step": 1, "kl": 0.1, "loss": 1}\n{"step": 2, "kl": NaN, "loss": null}\n'
                     '{"step": 3, "kl": Infinity, "loss": 0.5}\n{"step": 4, "kl": -Infinity}\n'
                     '{"step": 5, "kl": 0.5, "loss": NaN}\n')
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.table({"step": [1, 2, 3, 4, 5],
                             "kl": [0.1, math.nan, math.inf, -math.inf, 0.5],
                             "loss": pa.array([1, None, 0.5, None, math.nan], pa.float64())}), parquet)
    for path in (csv, jsonl, parquet):
        (seg,) = read(path)
        assert series_of(seg) == {"kl": ([1, 5], [0.1, 0.5]), "loss": ([1, 3], [1.0, 0.5])}, path
        assert seg.warnings == [f"{path.name}: dropped 3 NaN/inf values of 'kl'",
                                f"{path.name}: dropped 1 NaN/inf value of 'loss'"], path


@pytest.mark.parametrize("content", ["", "step,kl\n"], ids=["zero-bytes", "header-only"])
def test_empty_csv_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(ReadError, match="empty table"):
        read(path)


def test_empty_jsonl_and_parquet_are_errors(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("\n")
    pq.write_table(pa.table({"step": pa.array([], pa.int64()), "kl": pa.array([], pa.float64())}),
                   tmp_path / "t.parquet")
    for name in ("t.jsonl", "t.parquet"):
        with pytest.raises(ReadError, match="empty table"):
            read(tmp_path / name)


@pytest.mark.parametrize("stamps,expected", [
    ([1_780_000_000, 1_780_000_001.5], [1_780_000_000, 1_780_000_001.5]),
    ([1_780_000_000_000, 1_780_000_001_500], [1_780_000_000, 1_780_000_001.5]),  # milliseconds
    (["2026-05-28T20:26:40Z", "2026-05-28T20:26:41.5+00:00"], [1_780_000_000, 1_780_000_001.5]),
], ids=["seconds", "milliseconds", "iso"])
def test_wall_time_column_becomes_seconds_since_the_epoch(tmp_path: Path, stamps, expected) -> None:
    df = pd.DataFrame({"step": [1, 2], "kl": [0.1, 0.2], "_timestamp": stamps})
    (seg,) = read(write(df, tmp_path / "t.csv"))
    assert seg.series["kl"].wall_times.tolist() == expected
    assert seg.start_time == expected[0] and "_timestamp" not in seg.series


@pytest.mark.parametrize("utc", [False, True], ids=["naive", "utc"])
def test_parquet_timestamp_column_is_a_wall_time(tmp_path: Path, utc: bool) -> None:
    stamps = pd.to_datetime(["2026-05-28T20:26:40", "2026-05-28T20:26:41.5"], utc=utc,
                            format="ISO8601")
    df = pd.DataFrame({"step": [1, 2], "kl": [0.1, 0.2], "timestamp": stamps})
    (seg,) = read(write(df, tmp_path / "t.parquet"))
    assert seg.series["kl"].wall_times.tolist() == [1_780_000_000, 1_780_000_001.5]


def test_nested_jsonl_keys_are_joined_with_dots_and_a_cut_last_line_warns(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"_step": 1, "train": {"kl": 0.1}}\n{"_step": 2, "train": {"kl": 0.2}}\n'
                    '{"_step": 3, "train": {"k')
    (seg,) = read(path)
    assert series_of(seg) == {"train.kl": ([1, 2], [0.1, 0.2])}
    assert len(seg.warnings) == 1 and "truncated last line 3" in seg.warnings[0]


def test_nested_parquet_columns_are_joined_with_dots(tmp_path: Path) -> None:
    path = tmp_path / "h.parquet"
    pq.write_table(pa.table({"_step": [1, 2], "train": [{"kl": 0.1, "tag": "x"},
                                                         {"kl": 0.2, "tag": "y"}]}), path)
    (seg,) = read(path)
    assert series_of(seg) == {"train.kl": ([1, 2], [0.1, 0.2])}


def test_a_bad_jsonl_line_in_the_middle_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"step": 1, "kl": 0.1}\n{oops\n{"step": 3, "kl": 0.3}\n')
    with pytest.raises(ReadError, match="line 2 is not valid JSON"):
        read(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(-(2**53), 2**53), st.floats(allow_nan=False,
                                                                      allow_infinity=False)),
                     min_size=1, max_size=40),
       fmt=st.sampled_from(FORMATS))
def test_any_steps_and_values_written_come_back_identical(tmp_path: Path, rows, fmt: str) -> None:
    df = pd.DataFrame({"step": [r[0] for r in rows], "kl": [r[1] for r in rows]})
    (seg,) = read(write(df, tmp_path / f"{uuid.uuid4().hex}.{fmt}"))
    assert series_of(seg) == {"kl": ([r[0] for r in rows], [r[1] for r in rows])}


def test_discovery_reads_tables_and_isolates_a_bad_one(tmp_path: Path) -> None:
    (tmp_path / "deep" / "er").mkdir(parents=True)
    write(pd.DataFrame({"step": [1, 2], "kl": [0.1, 0.2]}), tmp_path / "deep" / "er" / "good.parquet")
    write(pd.DataFrame({"epoch": [1], "kl": [0.1]}), tmp_path / "bad.csv")
    got = read_source(str(tmp_path))
    assert got.kinds == ["table"]
    (good,) = [s for s in got.segments if s.error is None]
    (bad,) = [s for s in got.segments if s.error is not None]
    assert good.ref == "deep/er/good.parquet" and series_of(good) == {"kl": ([1, 2], [0.1, 0.2])}
    assert bad.error.startswith("bad.csv: no step column")


# ------------------------------------------------------------------ a torn last row (issue 12)

CSV_HEAD = "step,kl,reward\n1,0.1,1.0\n2,0.2,2.0\n"


@pytest.mark.parametrize("tail, why", [
    ("3,0.3", "2 of 3 fields"),
    ('3,0.3,"ok', "an unclosed quote"),
    ("3,0.3,1.5e", "its last cell '1.5e' is not a number"),
    ("3,0.3,", "its last cell is empty"),
])
def test_a_torn_last_csv_row_is_dropped_with_a_warning_naming_file_and_line(tmp_path: Path, tail: str,
                                                                           why: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(CSV_HEAD + tail)
    (seg,) = read(path)
    assert series_of(seg) == {"kl": ([1, 2], [0.1, 0.2]), "reward": ([1, 2], [1.0, 2.0])}
    assert seg.warnings == [f"t.csv: truncated last line 4 ({why}; no newline after it: crash mid-write?); "
                            "dropped, the rows before it kept"]


@pytest.mark.parametrize("fmt, rows, last, line", [
    ("csv", CSV_HEAD, "3,0.3,é", 4),
    ("jsonl", '{"step": 1, "kl": 0.1}\n{"step": 2, "kl": 0.2}\n', '{"step": 3, "kl": 0.3, "note": "é', 3),
])
def test_a_last_row_cut_inside_a_utf8_character_is_dropped_not_the_whole_table(
        tmp_path: Path, fmt: str, rows: str, last: str, line: int) -> None:
    path = tmp_path / f"t.{fmt}"
    path.write_bytes((rows + last).encode()[:-1])  # the last character's second byte never written
    (seg,) = read(path)
    assert series_of(seg)["kl"] == ([1, 2], [0.1, 0.2])
    assert seg.warnings == [f"t.{fmt}: truncated last line {line} (it ends inside a UTF-8 character; no newline "
                            "after it: crash mid-write?); dropped, the rows before it kept"]


@pytest.mark.parametrize("fmt, text", [("csv", CSV_HEAD + "3,0.3,3.0"),
                                       ("jsonl", '{"step": 1, "kl": 0.1}\n{"step": 3, "kl": 0.3}')])
def test_a_whole_last_row_without_a_newline_is_kept(tmp_path: Path, fmt: str, text: str) -> None:
    path = tmp_path / f"t.{fmt}"
    path.write_text(text)
    (seg,) = read(path)
    assert seg.series["kl"].steps.tolist()[-1] == 3 and seg.warnings == []


def test_a_jsonl_line_nested_too_deeply_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"step": 1, "kl": 0.1}\n' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")
    with pytest.raises(ReadError, match="line 2 is JSON nested too deeply to read"):
        read(path)


@pytest.mark.parametrize("step", ["1e30", "-5e20", "1e17"])
def test_a_step_out_of_range_is_a_named_error_not_another_number(tmp_path: Path, step: str) -> None:
    """An int64 cast of 1e30 gives -9223372036854775808 (and numpy's raw RuntimeWarning): said instead, with
    the value and its row; past 2**53 a float step is no whole number either."""
    p = tmp_path / "run.csv"
    p.write_text("step,kl\n" + "".join(f"{i},{0.01 * i}\n" for i in range(1, 30)) + f"{step},0.5\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ReadError, match=rf"step out of range \('{step}' at row 30"):
            read_table(p, ref="run.csv", source=str(tmp_path))


def test_a_run_beside_a_table_with_a_step_out_of_range_is_still_judged(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "bad.csv").write_text("step,kl\n1,0.1\n2,0.2\n1e30,0.3\n")
    (tmp_path / "good.csv").write_text("step,kl\n" + "".join(f"{i},{0.01 * i}\n" for i in range(1, 30)))
    out = subprocess.run([sys.executable, "-m", "klwatch.cli", "scan", str(tmp_path), "--format", "json", "--no-cache"],
                         capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    by_name = {lin["name"]: lin for lin in report["lineages"]}
    assert by_name["good"]["status"] == "ok" and "out of range" in (by_name["bad.csv"]["error"] or "")
    assert "RuntimeWarning" not in out.stderr and "-9223372036854775808" not in out.stdout + out.stderr
    assert out.returncode == 3, out.returncode


def test_tensorboards_ui_csv_download_is_one_series_named_after_the_file_with_its_clock(tmp_path):
    """``Wall time,Step,Value`` names neither run nor tag: the series takes the file's name, the clock is read."""
    path = tmp_path / "grpo-run-7.csv"
    path.write_text("Wall time,Step,Value\n1700000000.5,1,0.0\n1700000001.5,2,0.01\n1700000100.0,3,0.02\n")
    (seg,) = read_table(path, ref=path.name, source=str(tmp_path))
    assert list(seg.series) == ["grpo-run-7"]
    s = seg.series["grpo-run-7"]
    assert list(s.steps) == [1, 2, 3] and s.wall_times is not None and float(s.wall_times[2]) > 1700000099
    assert seg.start_time is not None and seg.start_time < 1700000001
    assert any("--metric 'grpo-run-7'" in w for w in seg.warnings)
