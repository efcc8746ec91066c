"""The sample scenarios through every remote or alternative source: a real ``mlflow server`` serving
the sample MLflow store, an ``mlruns/`` file store written by the real MLflow client, and the real
``wandb`` client talking to the local W&B stub that serves the sample W&B runs. Each must give the
verdicts the generator planted, with every restart stitched into its training run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from klwatch.pipeline import ScanConfig, scan
from klwatch.report import to_dict
from klwatch.sources import read_source
from mlflow_server import MlflowServer, serving_a_copy
from spec_shape import check_report
from wandb_stub import StubRun, WandbStub

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
KEY = "k" * 40


def runs_of(tracker: str) -> list[dict]:
    return [r for r in MANIFEST["runs"] if r["tracker"] == tracker]


def assert_planted_verdicts(report: dict, runs: list[dict], ids: dict[str, str] | None = None) -> None:
    """Each manifest run is one lineage holding all its processes' tracker runs, with its verdicts."""
    check_report(report)
    for run in runs:
        want = {(ids or {}).get(p["run_id"], p["run_id"]) for p in run["processes"]}
        owners = [lin for lin in report["lineages"] if want <= {m["ref"] for m in lin["members"]}]
        assert len(owners) == 1, (run["id"], want, [lin["name"] for lin in owners])
        lin = owners[0]
        assert lin["status"] == run["expected_status"], (run["id"], lin["boundaries"])
        assert [(b["step"], b["verdict"]) for b in lin["boundaries"]] == \
               [(b["step"], b["expected_verdict"]) for b in run["boundaries"]], run["id"]
    assert len(report["lineages"]) == len({r["id"] for r in runs}), [lin["name"] for lin in report["lineages"]]


@pytest.fixture(scope="module")
def sample_mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with serving_a_copy(SAMPLES / "mlflow" / "mlflow.db", workdir=tmp_path_factory.mktemp("sample-mlflow-server")) as server:
        yield server


@pytest.mark.server
def test_sample_runs_through_a_real_mlflow_server(sample_mlflow_server: MlflowServer) -> None:
    result = scan([sample_mlflow_server.spec])
    assert result.sources[0].errors == []
    assert_planted_verdicts(to_dict(result), runs_of("mlflow"))


def test_sample_runs_through_an_mlruns_folder_written_by_the_mlflow_client(tmp_path: Path, monkeypatch) -> None:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps the file store behind this flag
    src = read_source(str(SAMPLES / "mlflow" / "mlflow.db"))
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    exp = client.create_experiment("klwatch-samples")
    new_ids: dict[str, str] = {}
    for seg in src.segments:
        tags = {k: v for k, v in seg.tags.items() if not k.startswith("mlflow.")}
        run = client.create_run(exp, start_time=int((seg.start_time or 0) * 1000), run_name=seg.name, tags=tags)
        new_ids[seg.run_id] = run.info.run_id
        metrics = [Metric(name, float(v), int(t * 1000), int(s))
                   for name, series in seg.series.items()
                   for s, v, t in zip(series.steps, series.values, series.wall_times)]
        params = [Param(k, str(v)) for k, v in seg.config.items()]
        for i in range(0, max(len(metrics), 1), 1000):
            client.log_batch(run.info.run_id, metrics=metrics[i:i + 1000], params=params if i == 0 else [],
                             tags=[RunTag("klwatch.copy", "1")] if i == 0 else [])
        client.set_terminated(run.info.run_id)
    result = scan([str(tmp_path / "mlruns")])
    assert_planted_verdicts(to_dict(result), runs_of("mlflow"), ids=new_ids)


def _stub_runs() -> list[StubRun]:
    """The sample W&B runs as the W&B server holds them: one run per id, a resumed id's processes in order."""
    read = read_source(str(SAMPLES / "wandb"))
    by_id: dict[str, list] = {}
    for seg in sorted(read.segments, key=lambda s: s.first_wall_time() or 0):
        by_id.setdefault(seg.run_id, []).append(seg)
    runs = []
    for run_id, segs in by_id.items():
        rows: list[dict] = []
        for seg in segs:
            steps = sorted({int(s) for series in seg.series.values() for s in series.steps})
            table = {s: {} for s in steps}
            for name, series in seg.series.items():
                for s, v, t in zip(series.steps, series.values, series.wall_times):
                    table[int(s)][name] = float(v)
                    table[int(s)]["_timestamp"] = float(t)
            rows.extend(table[s] for s in steps)
        for i, row in enumerate(rows):  # the server's own step counter continues across a resume
            row["_step"] = i
            row.setdefault("_runtime", 0.0)
        first = segs[0]
        runs.append(StubRun(id=run_id, name=first.name or run_id, rows=rows, config=first.config, group=first.group,
                            exported_rows=len(rows) // 2))
    return runs


@pytest.mark.server
def test_sample_runs_through_the_wandb_api_against_the_local_stub(monkeypatch) -> None:
    monkeypatch.setenv("KLWATCH_WANDB_TIMEOUT", "10")
    with WandbStub(runs={("team", "rl"): _stub_runs()}) as server:
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        monkeypatch.setenv("WANDB_API_KEY", KEY)
        result = scan(["wandb://team/rl"], config=ScanConfig())
        assert not {"RunSampledHistory", "RunFullHistory"} & set(server.operations)  # full history only
    assert result.sources[0].errors == []
    assert all(seg.kind == "wandb-api" for seg in result.sources[0].segments)
    assert np.sum([len(seg.series) for seg in result.sources[0].segments]) > 0
    assert_planted_verdicts(to_dict(result), runs_of("wandb"))
