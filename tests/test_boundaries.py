"""Boundary inference on generated step sequences: every restart found, with the right evidence,
and no restart invented inside one process."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from klwatch.boundaries import BoundaryConfig, infer_boundaries, named_reset_step, split_segment
from klwatch.model import Boundary, Lineage, Segment, Series

CFG = BoundaryConfig()


@st.composite
def process_runs(draw):
    """A run's processes: (first step, last step) each; a restart resumes at or before the last step + 1."""
    n = draw(st.integers(1, 6))
    procs = []
    start = draw(st.integers(0, 5))
    for _ in range(n):
        length = draw(st.integers(3, 40))
        end = start + length - 1
        procs.append((start, end))
        back = draw(st.integers(0, min(10, length - 1)))  # 0: continue; >0: resume from an older checkpoint
        start = end + 1 - back
    return procs


def one_segment(procs, *, with_clock: bool, rng: np.random.Generator, runtime: bool = False,
                gaps: list[float] | None = None) -> Segment:
    """One tracker run the processes all logged into; ``runtime`` logs a per-process runtime counter
    (W&B's ``_runtime``), ``gaps`` the seconds each restart took (default: 300 s each)."""
    steps, walls, runtimes = [], [], []
    t = 1e9
    for k, (a, b) in enumerate(procs):
        started = t
        for s in range(a, b + 1):
            t += float(rng.uniform(0.8, 1.6))  # jittery step time
            steps.append(s)
            walls.append(t)
            runtimes.append(t - started)
        t += gaps[k] if gaps and k < len(gaps) else 300.0  # a restart takes minutes
    vals = rng.uniform(0.01, 0.02, len(steps))
    series = {"kl": Series(steps, vals, walls if with_clock else None),
              "loss": Series(steps, vals * 3, walls if with_clock else None)}
    if runtime:
        series["_runtime"] = Series(steps, runtimes, walls if with_clock else None)
    return Segment(kind="mlflow", ref="r", source="s", run_id="r", series=series)


def restarts_in_place(procs, *, with_clock: bool, seed: int, runtime: bool = False, gaps: list[float] | None = None):
    """The pieces and boundaries found in one tracker run that the processes all logged into."""
    seg = one_segment(procs, with_clock=with_clock, rng=np.random.default_rng(seed), runtime=runtime, gaps=gaps)
    pieces = split_segment(seg, 0, prefer="kl", config=CFG)
    return pieces, infer_boundaries([seg], pieces, metric="kl", checkpoint_steps=[], declared_steps=[], config=CFG)


@settings(max_examples=150, deadline=None)
@given(process_runs(), st.integers(0, 2**31 - 1))
def test_every_in_place_restart_is_found_with_a_clock_and_a_runtime_counter(procs, seed):
    pieces, bounds = restarts_in_place(procs, with_clock=True, seed=seed, runtime=True)
    assert [b.step for b in bounds] == [a for a, _ in procs[1:]]
    for b, (prev, cur) in zip(bounds, zip(procs, procs[1:])):
        assert "time_gap" in b.evidence and "runtime_reset" in b.evidence
        if cur[0] <= prev[1]:
            assert "step_rewind" in b.evidence or "duplicate_steps" in b.evidence
        assert b.resumed_from_step == cur[0] - 1
    # every series is cut at the same restarts
    for p in pieces:
        assert np.array_equal(p.series["kl"].steps, p.series["loss"].steps)


def test_a_lone_long_pause_in_a_reattached_run_is_a_restart_but_a_family_of_pauses_is_routine():
    """An MLflow run re-attached with MLFLOW_RUN_ID continues its steps seamlessly: one gap like no
    other is all it shows. Evaluation every N steps pauses the same way each time: no restart."""
    procs = [(1, 30), (31, 60)]
    _, bounds = restarts_in_place(procs, with_clock=True, seed=1)
    assert [(b.step, b.evidence) for b in bounds] == [(31, ["time_gap"])]
    evals = [(1, 10), (11, 20), (21, 30), (31, 40), (41, 50)]
    _, bounds = restarts_in_place(evals, with_clock=True, seed=1, gaps=[40.0, 45.0, 38.0, 42.0])
    # only tentative: they stand only where the KL says the reference was reset (pipeline.settle_tentative)
    assert [b.step for b in bounds] == [11, 21, 31, 41] and all(b.tentative for b in bounds)


def _reattached_run(*, reset_at: list[int]) -> Segment:
    """One MLflow run re-attached at every launch (MLFLOW_RUN_ID), steps seamless, launches every 10
    steps with like pauses; the reference rebuilt at ``reset_at``."""
    rng = np.random.default_rng(3)
    steps = np.arange(1, 51)
    anchor = np.zeros(len(steps))
    for r in reset_at:
        anchor[steps > r] = r
    kl = 0.05 * (1 - np.exp(-(steps - anchor) / 6.0)) * np.exp(rng.normal(0, 0.05, len(steps)))
    wall = 1e9 + np.cumsum(rng.uniform(0.8, 1.2, len(steps))) + 40.0 * ((steps - 1) // 10)
    return Segment(kind="mlflow", ref="r", source="s", run_id="r", store="db",
                   series={"kl": Series(steps, kl, wall), "loss": Series(steps, 1 / steps, wall)})


def test_a_routine_pause_is_a_boundary_only_where_the_kl_was_reset():
    from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage

    [healthy] = build_lineages([_reattached_run(reset_at=[])], config=ScanConfig())
    assert healthy.boundaries == [] and len(healthy.pieces) == 1
    assert len(healthy.pieces[0]["kl"]) == 50  # the pieces are joined back whole
    [ratchet] = build_lineages([_reattached_run(reset_at=[20, 30])], config=ScanConfig())
    result = judge_lineage(ratchet, config=ScanConfig())
    assert [(v.boundary.step, v.verdict) for v in result.verdicts] == [(21, "reference_reset"), (31, "reference_reset")]
    assert any("pause before step 21" in n for n in ratchet.notes)


@settings(max_examples=150, deadline=None)
@given(process_runs(), st.integers(0, 2**31 - 1))
def test_without_a_clock_only_rewinds_are_restarts(procs, seed):
    _, bounds = restarts_in_place(procs, with_clock=False, seed=seed)
    expected = [cur[0] for prev, cur in zip(procs, procs[1:]) if cur[0] <= prev[1]]
    assert [b.step for b in bounds] == expected


@settings(max_examples=100, deadline=None)
@given(process_runs(), st.integers(0, 2**31 - 1))
def test_one_tracker_run_per_process_gives_one_boundary_per_new_run(procs, seed):
    rng = np.random.default_rng(seed)
    segs = []
    t = 1e9
    for k, (a, b) in enumerate(procs):
        steps = np.arange(a, b + 1)
        wall = t + np.cumsum(rng.uniform(0.8, 1.6, len(steps)))
        t = float(wall[-1]) + 300
        segs.append(Segment(kind="wandb-offline", ref=f"run-{k}", source="s", run_id=f"id{k}",
                            series={"kl": Series(steps, rng.uniform(0.01, 0.02, len(steps)), wall)}))
    pieces = [p for i, s in enumerate(segs) for p in split_segment(s, i, prefer="kl", config=CFG)]
    bounds = infer_boundaries(segs, pieces, metric="kl", checkpoint_steps=[], declared_steps=[], config=CFG)
    assert [b.step for b in bounds] == [a for a, _ in procs[1:]]
    assert all("new_tracker_run" in b.evidence and "time_gap" in b.evidence for b in bounds)


def test_jittery_step_times_and_a_slow_eval_step_are_not_restarts():
    rng = np.random.default_rng(0)
    steps = np.arange(1, 500)
    dt = rng.lognormal(0.0, 0.4, len(steps))
    dt[250] *= 8  # an evaluation pause
    seg = Segment(kind="tensorboard", ref="f", source="s", series={"kl": Series(steps, np.ones(len(steps)), 1e9 + np.cumsum(dt))})
    assert len(split_segment(seg, 0, prefer="kl", config=CFG)) == 1


def test_runtime_counter_restarting_marks_a_restart():
    steps = np.arange(1, 41)
    wall = 1e9 + steps * 1.0
    runtime = np.concatenate([np.arange(1, 21) * 1.0, np.arange(1, 21) * 1.0])
    seg = Segment(kind="wandb-offline", ref="f", source="s",
                  series={"kl": Series(steps, np.ones(40), wall), "_runtime": Series(steps, runtime, wall)})
    pieces = split_segment(seg, 0, prefer="kl", config=CFG)
    assert len(pieces) == 2
    assert pieces[1].cut_evidence == ["runtime_reset"]


def test_checkpoint_folder_names_the_step_resumed_from():
    segs = [Segment(kind="tensorboard", ref=f"e{k}", source="s", series={"kl": Series(np.arange(a, b), np.ones(b - a))})
            for k, (a, b) in enumerate([(1, 48), (41, 80)])]
    pieces = [p for i, s in enumerate(segs) for p in split_segment(s, i, prefer="kl", config=CFG)]
    [b] = infer_boundaries(segs, pieces, metric="kl", checkpoint_steps=[20, 40], declared_steps=[], config=CFG)
    assert b.step == 41 and b.resumed_from_step == 40
    assert set(b.evidence) >= {"new_event_file", "step_rewind", "duplicate_steps", "checkpoint"}


def test_a_declared_restart_cuts_a_seamless_run():
    seg = Segment(kind="table", ref="t", source="s", series={"kl": Series(np.arange(1, 81), np.ones(80))})
    pieces = split_segment(seg, 0, prefer="kl", config=CFG)
    [b] = infer_boundaries([seg], pieces, metric="kl", checkpoint_steps=[], declared_steps=[41], config=CFG)
    assert b.step == 41 and b.evidence == ["declared"]
    assert len(pieces) == 2 and pieces[1].series["kl"].steps[0] == 41


def _one_file_with_a_pause(folder, *, collapse: bool) -> None:
    """One tensorboardX writer (one process) logging 80 steps, its clock stalling 10 minutes once at
    step 41 (a slow save, a busy machine); with ``collapse`` the KL restarts from ~0 there too."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(folder), flush_secs=3600)
    wall = 1_700_000_000.0
    for step in range(1, 81):
        wall += 600.0 if step == 41 else 1.0
        since = step - 40 if collapse and step > 40 else step
        writer.add_scalar("train/kl_penalty", 0.05 * (1 - np.exp(-since / 8)) + 1e-4 * (step % 3), step, walltime=wall)
        writer.add_scalar("train/loss", 1.0 / step, step, walltime=wall)
    writer.close()


def test_a_lone_pause_inside_one_event_file_is_no_restart(tmp_path):
    """A TensorBoard event file is one process (every launch opens a new writer): a clock gap in it alone
    is a pause, not a resume boundary."""
    from klwatch.pipeline import scan

    _one_file_with_a_pause(tmp_path / "run", collapse=False)
    (result,) = scan([str(tmp_path)]).results
    assert result.lineage.boundaries == [] and result.status == "ok"


def test_a_pause_inside_one_event_file_where_the_kl_collapses_is_still_judged(tmp_path):
    """Where the KL restarts from zero at the pause, the pause is kept as a boundary and judged."""
    from klwatch.pipeline import scan

    _one_file_with_a_pause(tmp_path / "run", collapse=True)
    (result,) = scan([str(tmp_path)]).results
    assert [b.step for b in result.lineage.boundaries] == [41]
    assert result.status == "reference_reset"


@settings(max_examples=200, deadline=None)
@given(columns=st.lists(st.lists(st.integers(0, 30), min_size=0, max_size=40), min_size=1, max_size=5),
       ascending=st.lists(st.booleans(), min_size=5, max_size=5))
def test_relogged_steps_skips_series_whose_steps_only_go_up_without_changing_its_answer(columns, ascending):
    """A series whose steps only go up repeats no step, so it is not counted (no ``np.unique``); the
    answer is the one counting every series gives."""
    from klwatch.boundaries import relogged_steps

    series = {}
    for k, col in enumerate(columns):
        steps = sorted(set(col)) if ascending[k] else col
        series[f"m{k}"] = Series(np.asarray(steps, dtype=np.int64), np.zeros(len(steps)), None)
    keyed = [s for s in series.values() if len(s) > 1]
    counts: dict[int, int] = {}
    for s in keyed:
        u, c = np.unique(s.steps, return_counts=True)
        for step in u[c > 1]:
            counts[int(step)] = counts.get(int(step), 0) + 1
    assert relogged_steps(series) == {step for step, n in counts.items() if 2 * n > len(keyed)}


def _two_launch_lineage(kind: str, run_ids: tuple[str | None, str | None], *, evidence: list[str],
                        resumed_from: int | None = 10, first: int = 11) -> Lineage:
    segs = [Segment(kind=kind, ref=f"part{k}", source=".", run_id=run_ids[k]) for k in range(2)]  # type: ignore[arg-type]
    return Lineage(id="r", name="r", segments=segs, pieces=[{}, {}], piece_segments=[0, 1],
                   boundaries=[Boundary(step=first, resumed_from_step=resumed_from, evidence=evidence, piece_index=1)])


def test_a_checkpoint_folder_names_the_reset_step():
    lin = _two_launch_lineage("wandb-offline", ("a", "a"), evidence=["checkpoint"])
    assert named_reset_step(lin, lin.boundaries[0]) == 10


def test_the_step_before_the_first_after_is_named_where_the_tracker_keeps_every_step():
    for kind, ids in (("tensorboard", (None, None)), ("mlflow", ("m", "m")), ("wandb-offline", ("a", "b"))):
        lin = _two_launch_lineage(kind, ids, evidence=["new_tracker_run"])
        assert named_reset_step(lin, lin.boundaries[0]) == 10, kind


def test_a_wandb_run_resumed_under_its_id_or_a_table_names_no_reset_step():
    """W&B drops the steps a resumed run already has: an older checkpoint could hide behind them."""
    for kind, ids in (("wandb-offline", ("a", "a")), ("table", (None, None))):
        lin = _two_launch_lineage(kind, ids, evidence=["new_tracker_run"])
        assert named_reset_step(lin, lin.boundaries[0]) is None, kind
    lin = _two_launch_lineage("tensorboard", (None, None), evidence=["new_event_file"], resumed_from=None)
    assert named_reset_step(lin, lin.boundaries[0]) is None


def test_a_run_logged_every_ten_steps_names_no_reset_step_from_the_first_step_after():
    """With logging every L > 1 steps the first step logged after a resume is the next multiple of L: the step
    before it is not where the run saved."""
    lin = _two_launch_lineage("tensorboard", (None, None), evidence=["step_rewind", "duplicate_steps"],
                              resumed_from=79, first=80)
    lin.kl_metric = "kl"
    lin.pieces = [{"kl": Series(np.arange(10, 111, 10), np.ones(11))},
                  {"kl": Series(np.arange(80, 201, 10), np.ones(13))}]
    assert named_reset_step(lin, lin.boundaries[0]) is None
    lin.pieces = [{"kl": Series(np.arange(1, 90), np.ones(89))}, {"kl": Series(np.arange(80, 201), np.ones(121))}]
    assert named_reset_step(lin, lin.boundaries[0]) == 79
