"""The dashboard page driven through Streamlit's AppTest: the fleet, the run view, the URL, the sliders."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from klwatch.pipeline import scan
from klwatch.reference_reset import ReferenceResetConfig

from dashboard_runs import write_fleet

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fleet(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="module")
def run_ids(fleet_dir: Path) -> dict[str, str]:
    return {r.lineage.name: r.lineage.id for r in scan([str(fleet_dir)]).results}


def _app(monkeypatch: pytest.MonkeyPatch, *sources: str, **query: str | list[str]) -> AppTest:
    monkeypatch.setenv("KLWATCH_DASHBOARD_SOURCES", "\n".join(sources))
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def _qp(at: AppTest, key: str) -> list[str]:
    """A query parameter's values as the URL holds them (AppTest gives a lone value as a string)."""
    value = at.query_params.get(key, [])
    return [value] if isinstance(value, str) else list(value)


def _plain(markdown: str) -> str:
    """A markdown value as the page shows it (the app escapes every text from a source or a link)."""
    return re.sub(r"\\(.)", r"\1", markdown)


def _table(at: AppTest):
    return at.dataframe(key="fleet_table").value


def _chart_spec(at: AppTest) -> dict:
    """The run chart (the fleet picture comes first on the page)."""
    return json.loads(at.get("plotly_chart")[-1].proto.spec)


def test_the_page_loads_with_the_flagged_run_first_and_opened(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path,
                                                              run_ids: dict[str, str]) -> None:
    at = _app(monkeypatch, str(fleet_dir))
    assert not at.exception
    assert not at.error
    table = _table(at)
    assert list(table["run"])[0] == "grpo-resume-buggy"
    assert list(table["status"]) == ["reference_reset", "ok", "ok"]
    counts = [m.value for m in at.markdown if "-badge[" in m.value][0]
    assert "reference_reset: **1**" in counts and "ok: **2**" in counts
    assert at.selectbox(key="run").value == run_ids["grpo-resume-buggy"]
    assert _qp(at, "run") == [run_ids["grpo-resume-buggy"]]
    spec = _chart_spec(at)
    assert sorted(s["x0"] for s in spec["layout"]["shapes"] if s["type"] == "line" and s["yref"] == "paper") == [41, 81]


def test_a_link_to_a_run_opens_it_with_its_boundaries(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path,
                                                      run_ids: dict[str, str]) -> None:
    at = _app(monkeypatch, str(fleet_dir), run=run_ids["grpo-resume-fixed"])
    assert at.selectbox(key="run").value == run_ids["grpo-resume-fixed"]
    assert any(_plain(h.value).endswith("grpo-resume-fixed") for h in at.header)
    labels = [e.label for e in at.expander if e.label.startswith("step ")]
    assert [label.split(" · ")[:2] for label in labels] == [["step 41", "ok"], ["step 81", "ok"]]
    spec = _chart_spec(at)
    markers = [a["text"] for a in spec["layout"]["annotations"] if a["text"].startswith("<b>")]
    assert [m.split()[0] for m in markers] == ["<b>ok", "<b>ok"]
    # the panels below the KL were picked from the run's own series
    assert at.multiselect(key=f"linked::{run_ids['grpo-resume-fixed']}").value == ["train/loss", "train/reward", "train/lr"]
    # each boundary says which windows its verdict compared; the members are the run's three launches
    (judged,) = [r for r in scan([str(fleet_dir)]).results if r.lineage.id == run_ids["grpo-resume-fixed"]]
    compared = [m.value for m in at.markdown if m.value.startswith("Compared steps")]
    assert compared == [f"Compared steps {v.window_before[0]}–{v.window_before[1]} (before) with "
                        f"{v.window_after[0]}–{v.window_after[1]} (after)." for v in judged.verdicts]
    members = at.dataframe[-1].value
    assert list(members["kind"]) == ["tensorboard"] * 3 and list(members["first_step"]) == [1, 41, 81]
    # and the page says why those three launches are one run, as the report's stitching does
    (stitching,) = [e for e in at.expander if e.label.startswith("Stitching:")]
    said = [m.value for m in stitching.markdown]
    assert len(said) == len(judged.lineage.notes) == 2 and all("joined" in m for m in said)


def test_a_link_to_a_run_that_is_not_there_warns_and_opens_another(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path,
                                                                   run_ids: dict[str, str]) -> None:
    at = _app(monkeypatch, str(fleet_dir), run="tensorboard:gone:gone")
    assert any("tensorboard:gone:gone" in w.value for w in at.warning)  # in a code span: as typed
    assert at.selectbox(key="run").value == run_ids["grpo-resume-buggy"]


def test_moving_a_threshold_changes_the_verdicts_and_the_url(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path) -> None:
    at = _app(monkeypatch, str(fleet_dir))
    assert "reference_reset" in set(_table(at)["status"])
    # 10 low points cannot fit in the 6-point window after a resume: no boundary can be a reset any more
    at.slider(key="rr_min_low_points").set_value(10).run()
    statuses = set(_table(at)["status"])  # the runs with a resume are undecided now, the others ok
    assert "reference_reset" not in statuses and "inconclusive" in statuses and statuses <= {"ok", "inconclusive"}
    labels = [e.label for e in at.expander if e.label.startswith("step ")]
    assert labels and all(" · inconclusive · " in label for label in labels)
    assert _qp(at, "min_low_points") == ["10"]
    [b for b in at.button if b.label == "Default thresholds"][0].click().run()
    assert at.slider(key="rr_min_low_points").value == ReferenceResetConfig().min_low_points
    assert "reference_reset" in set(_table(at)["status"])
    assert "min_low_points" not in at.query_params


def test_thresholds_and_filters_come_back_from_the_url(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path) -> None:
    at = _app(monkeypatch, str(fleet_dir), flagged="1", reset_score="0.99")
    assert at.toggle(key="only_flagged").value is True
    assert at.slider(key="rr_reset_score").value == pytest.approx(0.99)
    assert list(_table(at)["run"]) == ["grpo-resume-buggy"]
    at.toggle(key="only_flagged").set_value(False).run()
    assert len(_table(at)) == 3
    assert "flagged" not in at.query_params
    at.multiselect(key="statuses").set_value(["ok"]).run()
    assert list(_table(at)["status"]) == ["ok", "ok"]
    assert _qp(at, "status") == ["ok"]


def test_a_bad_source_shows_its_error_and_the_rest_stays_usable(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path,
                                                                tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing-here")
    monkeypatch.setenv("KLWATCH_DASHBOARD_ALLOW_ADD", str(tmp_path))  # adding from the page is off without it
    at = _app(monkeypatch, missing, str(fleet_dir))
    assert not at.exception
    assert any(missing in _plain(e.value) for e in at.error)
    assert len(_table(at)) == 3
    assert at.selectbox(key="run").value  # a run is open
    # a source added from the sidebar that cannot be read: its error shows, it goes in the URL
    typo = os.path.realpath(tmp_path / "typo-runs")
    at.text_input(key="new_source").input(typo).run()
    assert _qp(at, "src") == [typo]
    assert any(typo in _plain(e.value) for e in at.error)
    assert len(_table(at)) == 3
    (remove,) = [b for b in at.button if b.key == f"rm::{typo}"]
    assert remove.label == "Remove" and remove.proto.icon == ":material/close:"  # a visible label, not a blank glyph
    remove.click().run()
    assert "src" not in at.query_params
    assert not any(typo in _plain(e.value) for e in at.error)


def test_runs_that_cannot_be_judged_open_and_say_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "no-kl"))
    for step in range(1, 30):
        writer.add_scalar("train/loss", 1.0 / step, step)
    writer.close()
    broken = tmp_path / "broken" / "events.out.tfevents.1700000000.host.1"
    broken.parent.mkdir()
    broken.write_bytes(b"\x13\x00\x00\x00 not a record " * 8)
    ids = {r.lineage.name: r.lineage.id for r in scan([str(tmp_path)]).results}
    assert len(ids) == 2

    at = _app(monkeypatch, str(tmp_path))
    assert set(_table(at)["status"]) == {"error", "no_kl_metric"}
    for name, run_id in ids.items():
        at = _app(monkeypatch, str(tmp_path), run=run_id)
        assert not at.exception
        if "broken" in name:
            assert any("broken/events.out.tfevents" in _plain(e.value) for e in at.error)  # the file, named, in place
        else:
            assert any("No reference-KL metric" in w.value for w in at.warning)
            assert len(at.get("plotly_chart")) == 1  # no boundary: no fleet picture; the run chart of its loss


def test_panels_chart_options_and_the_control_run_live_in_the_url(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path,
                                                                 run_ids: dict[str, str]) -> None:
    fixed, buggy = run_ids["grpo-resume-fixed"], run_ids["grpo-resume-buggy"]
    at = _app(monkeypatch, str(fleet_dir), run=buggy, panel=["train/reward"], smooth="0.6", logy="1", x="wall",
              control=run_ids["grpo-continuous"], zoom="41", zw="10")
    assert not at.exception
    assert at.multiselect(key=f"linked::{buggy}").value == ["train/reward"]
    assert at.slider(key="smoothing").value == pytest.approx(0.6) and at.toggle(key="log_y").value is True
    assert at.selectbox(key="control").value == run_ids["grpo-continuous"] and at.selectbox(key="zoom").value == "41"
    spec = _chart_spec(at)
    assert spec["layout"]["xaxis"]["type"] == "date" and spec["layout"]["yaxis"]["type"] == "log"
    assert any(t.get("legendgroup") == "control" for t in spec["data"])
    assert any("Compare: parted." in e.value for e in at.error)
    for key, value in {"panel": ["train/reward"], "smooth": ["0.6"], "logy": ["1"], "x": ["wall"], "zoom": ["41"]}.items():
        assert _qp(at, key) == value
    # Back/Forward: the browser brings an earlier URL; the page follows it
    at.query_params.clear()
    at.query_params["run"] = fixed
    at.run()
    assert at.selectbox(key="run").value == fixed
    assert at.toggle(key="log_y").value is False and at.selectbox(key="control").value is None


def test_a_stitching_key_from_the_url_reaches_the_pipeline(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path) -> None:
    at = _app(monkeypatch, str(fleet_dir), group_by="no_such_key")
    assert not at.exception
    assert at.text_input(key="group_by").value == "no_such_key"
    assert _qp(at, "group_by") == ["no_such_key"]
    assert len(_table(at)) == 3  # TensorBoard runs carry no config: stitching falls back as the CLI does
