"""Stitching tracker pieces into training runs."""

from __future__ import annotations

import numpy as np

from klwatch.model import Segment, Series
from klwatch.launch_config import configs_agree
from klwatch.stitching import StitchConfig, base_name, stitch


def seg(run_id, name, first, last, t0, *, group=None, config=None, kind="mlflow", store="db"):
    steps = np.arange(first, last + 1)
    return Segment(kind=kind, ref=run_id, source="src", run_id=run_id, name=name, group=group,
                   config=config or {"lr": 1e-6, "model": "qwen"}, store=store,
                   series={"kl": Series(steps, np.ones(len(steps)), t0 + steps * 1.0)})


def groups(segments, **kw):
    return sorted(sorted(s.ref for s in segs) for _, _, segs in stitch(segments, **kw))


def test_new_tracker_run_per_restart_is_one_training_run():
    segs = [seg("a", "grpo", 1, 40, 0), seg("b", "grpo", 41, 80, 1000), seg("c", "grpo", 81, 120, 2000)]
    assert groups(segs) == [["a", "b", "c"]]


def test_launch_suffixes_do_not_split_a_run():
    assert base_name("grpo-7b-resume-2") == "grpo-7b"
    assert base_name("grpo-7b_restart3") == "grpo-7b"
    segs = [seg("a", "grpo-7b", 1, 40, 0), seg("b", "grpo-7b-resume-1", 41, 80, 1000)]
    assert groups(segs) == [["a", "b"]]


def test_a_rerun_from_scratch_with_the_same_name_is_another_training_run():
    segs = [seg("a", "grpo", 1, 40, 0), seg("b", "grpo", 1, 40, 1000)]
    assert groups(segs) == [["a"], ["b"]]


def test_runs_at_the_same_time_are_different_training_runs():
    segs = [seg("a", "sweep", 1, 40, 0), seg("b", "sweep", 20, 60, 10)]
    assert groups(segs) == [["a"], ["b"]]


def test_a_different_config_is_a_different_training_run():
    segs = [seg("a", "grpo", 1, 40, 0), seg("b", "grpo", 41, 80, 1000, config={"lr": 5e-6, "model": "llama"})]
    assert groups(segs) == [["a"], ["b"]]


def test_per_launch_config_keys_are_ignored():
    assert configs_agree({"lr": 1, "resume_from_checkpoint": None, "output_dir": "/a", "model_name_or_path": "base"},
                         {"lr": 1, "resume_from_checkpoint": "/a/checkpoint-40", "output_dir": "/b",
                          "model_name_or_path": "base"})


def test_unrelated_stores_are_never_stitched():
    segs = [seg("a", "grpo", 1, 40, 0, store="one.db"), seg("b", "grpo", 41, 80, 1000, store="two.db")]
    assert groups(segs) == [["a"], ["b"]]


def test_group_by_and_lineage_file_override_the_heuristics():
    # two unrelated names, and b starts over at step 1: the heuristics keep them apart
    segs = [seg("a", "x", 1, 40, 0, config={"exp": "e1"}), seg("b", "y", 1, 80, 1000, config={"exp": "e1"})]
    assert groups(segs) == [["a"], ["b"]]
    assert groups(segs, config=StitchConfig(group_by="exp")) == [["a", "b"]]
    assert groups(segs, config=StitchConfig(lineage_map={"mine": ["a", "b"]})) == [["a", "b"]]


def test_checkpoint_folder_joins_the_only_run_of_its_source():
    ck = Segment(kind="checkpoints", ref="ckpts", source="src", name="results", checkpoint_steps=[20, 40])
    out = stitch([seg("a", "grpo", 1, 40, 0), seg("b", "grpo", 41, 80, 1000), ck])
    assert len(out) == 1 and ck in out[0][2]


def test_an_unreadable_run_stays_its_own_entry():
    bad = Segment(kind="tensorboard", ref="x/events.out.tfevents.1", source="src", error="x: bad CRC")
    out = stitch([seg("a", "grpo", 1, 40, 0), bad])
    assert [segs for _, _, segs in out if bad in segs] == [[bad]]


def test_a_new_tensorboard_folder_per_launch_is_one_training_run():
    segs = [seg("e1", None, 1, 40, 0, kind="tensorboard", group="logs/exp_001/tensorboard"),
            seg("e2", None, 41, 80, 1000, kind="tensorboard", group="logs/exp_002/tensorboard")]
    for s in segs:
        s.store = f"/abs/{s.group}"
    out = stitch(segs)
    assert [sorted(x.ref for x in segs) for _, _, segs in out] == [["e1", "e2"]]
    assert out[0][1] == "logs/exp_001/tensorboard"


def test_seeds_in_numbered_folders_stay_separate_runs():
    segs = [seg("s1", None, 1, 40, 0, kind="tensorboard", group="sweep/seed_1"),
            seg("s2", None, 1, 40, 1000, kind="tensorboard", group="sweep/seed_2")]
    assert groups(segs) == [["s1"], ["s2"]]


def test_a_relaunch_with_a_random_name_joins_the_run_it_continues():
    segs = [seg("a", "happy-sky-12", 1, 40, 0), seg("b", "brave-moon-13", 41, 80, 1000),
            seg("c", "other-run-3", 1, 30, 5000, config={"lr": 9.0, "model": "other"})]
    assert groups(segs) == [["a", "b"], ["c"]]


def test_a_continuation_with_two_possible_parents_is_left_alone():
    segs = [seg("a", "x1", 1, 40, 0), seg("b", "y1", 1, 45, 10), seg("c", "z1", 41, 80, 1000)]
    assert groups(segs) == [["a"], ["b"], ["c"]]


def _with_setup_keys(segment: Segment) -> Segment:
    """NeMo-RL logs its setup timings at step 0 in every launch."""
    t0 = float(segment.series["kl"].wall_times[0]) - 30.0
    for k in ("timing/setup/total", "timing/setup/vllm"):
        segment.series[k] = Series(np.array([0]), np.array([12.5]), np.array([t0]))
    return segment


def test_setup_keys_logged_at_step_0_by_every_launch_do_not_make_a_launch_a_fresh_start():
    segs = [_with_setup_keys(seg("a", "grpo", 1, 40, 0)), _with_setup_keys(seg("b", "grpo", 41, 80, 1000)),
            _with_setup_keys(seg("c", "happy-sky-12", 81, 120, 2000))]
    assert groups(segs) == [["a", "b", "c"]]
    assert segs[1].extent(("kl",)) == (41, 80) and segs[1].step_range() == (0, 80)


def test_launches_in_sibling_folders_with_sparse_logging_are_one_training_run():
    """HF/TRL: a new W&B run per launch in a folder beside the last (attempt1/, attempt2/), logging every
    5 steps, the resumed launch's first point one interval after the checkpoint."""
    def sparse(run_id: str, first: int, last: int, t0: float, store: str) -> Segment:
        s = seg(run_id, None, first, last, t0, kind="wandb-offline", store=store)
        kl = s.series["kl"]
        s.series["kl"] = kl.take(kl.steps % 5 == 0)
        return s

    segs = [sparse("a", 1, 40, 0, "src/attempt1/wandb"), sparse("b", 31, 80, 1000, "src/attempt2/wandb")]
    assert groups(segs) == [["a", "b"]]
    notes: dict[int, list[str]] = {}
    stitch(segs, notes=notes)
    assert any("launch folder beside it" in n for n in notes[id(segs[1])])


def test_numbered_sibling_runs_each_from_their_first_step_stay_apart():
    """run-0000 ... run-0011: a number that numbers runs is not a launch counter."""
    segs = [seg(f"r{i}", f"run-{i:04d}", i % 2, 60 + i, 1000.0 * i, kind="tensorboard") for i in range(12)]
    assert base_name("run-0007") == "run-0007" and base_name("lr-1e-5") == "lr-1e-5"
    assert len(groups(segs)) == 12


def ids(segments, **kw):
    return {tuple(sorted(s.ref for s in segs)): lid for lid, _, segs in stitch(segments, **kw)}


def test_a_lineage_keeps_its_id_when_a_same_named_run_from_scratch_appears_later():
    """Ids come from the chain itself, never from how many siblings share its key: an alert keyed on
    it is not sent again, and a dashboard link to it keeps working."""
    first = [seg("a", "grpo", 1, 40, 0), seg("b", "grpo", 41, 80, 1000)]
    alone = ids(first)
    assert alone == {("a", "b"): "mlflow:db:grpo"}  # a run with no sibling: the key alone, as before
    later = ids(first + [seg("c", "grpo", 1, 40, 5000)])
    assert later[("a", "b")] == alone[("a", "b")]
    assert later[("c",)] == "mlflow:db:grpo#c"  # the newcomer: the key and its own first run id
    third = ids(first + [seg("c", "grpo", 1, 40, 5000), seg("d", "grpo", 1, 40, 9000)])
    assert third[("a", "b")] == "mlflow:db:grpo" and third[("c",)] == "mlflow:db:grpo#c"
    assert third[("d",)] == "mlflow:db:grpo#d"
    names = sorted(name for _, name, _ in stitch(first + [seg("c", "grpo", 1, 40, 5000)]))
    assert names == ["grpo", "grpo #2"]


def test_sibling_event_files_in_one_folder_are_told_apart_by_their_own_file():
    segs = [seg("runs/x/events.out.tfevents.1.h.p0", "x", 1, 40, 0, kind="tensorboard"),
            seg("runs/x/events.out.tfevents.2.h.p0", "x", 1, 40, 1000, kind="tensorboard")]
    for s in segs:
        s.run_id = s.group = "runs/x"
    got = sorted(ids(segs).values())
    assert got == ["tensorboard:src:runs/x", "tensorboard:src:runs/x#events.out.tfevents.2.h.p0"]


def test_kl_candidates_kept_per_names_are_a_fresh_list_equal_to_ranking_them_again():
    """``kl_candidates`` is kept per (names, patterns), as every piece of a fleet asks it for the same
    names: the answer is the ranking's, and a caller changing its list changes no later answer."""
    from klwatch.metrics import _rank_kl_candidates, kl_candidates

    cases = [
        (["train/kl", "train/loss", "kl", "objective/kl", "ref_kl_coef", "_runtime"], None),
        (["actor/kl_loss", "actor/ppo_kl", "critic/kl", "kl_ctl"], None),
        (["a/kl", "b/kl", "loss"], ["b/*", "a/kl"]),
        (["loss", "reward"], None),
        ([], ["kl"]),
    ]
    for names, patterns in cases:
        first = kl_candidates(names, patterns=patterns)
        assert first == _rank_kl_candidates(names, patterns=patterns)
        first.append("mutated")
        assert kl_candidates(list(names), patterns=patterns) == _rank_kl_candidates(names, patterns=patterns)
        assert kl_candidates(dict.fromkeys(names), patterns=patterns) == _rank_kl_candidates(names, patterns=patterns)


def _nemo(exp: int, name: str, ckpt_dir: str, **extra) -> dict:
    """The part of NeMo-RL's logged config that matters here: a new logs/exp_NNN per launch."""
    return {"policy": {"model_name": extra.get("model", "Qwen/Qwen2.5-1.5B"), "max_total_sequence_length": 512,
                       "train_global_batch_size": 512, "optimizer": {"name": "AdamW", "kwargs": {"lr": 5e-6}}},
            "grpo": {"num_prompts_per_step": 32, "num_generations_per_prompt": 16, "val_period": 10},
            "loss_fn": {"beta": 0.01, "ratio_clip_min": 0.2, "ratio_clip_max": 0.2},
            "checkpointing": {"checkpoint_dir": ckpt_dir},
            "logger": {"log_dir": f"logs/exp_{exp:03d}", "wandb": {"name": name}}}


def wandb_seg(run_id, name, first, last, t0, *, exp, config):
    s = seg(run_id, name, first, last, t0, kind="wandb-offline", store=f"/abs/logs/exp_{exp:03d}/wandb", config=config)
    return s


def test_launches_that_differ_only_in_a_per_launch_folder_join_and_the_note_names_the_key():
    segs = [wandb_seg("a1", "grpo", 1, 6, 0, exp=1, config=_nemo(1, "grpo", "results/grpo")),
            wandb_seg("a2", "grpo", 7, 12, 100, exp=2, config=_nemo(2, "grpo", "results/grpo"))]
    notes: dict = {}
    out = stitch(segs, notes=notes)
    assert [sorted(x.ref for x in m) for _, _, m in out] == [["a1", "a2"]]
    (note,) = notes[id(segs[1])]
    assert "joined a1" in note and "logger.log_dir" in note


def test_nemo_rl_default_layout_pairs_each_relaunch_with_its_own_run():
    """NeMo-RL's default log_dir puts every run's launches side by side (logs/exp_001, exp_002, ...)."""
    segs = [wandb_seg("a1", "run-a", 1, 6, 0, exp=1, config=_nemo(1, "run-a", "results/a")),
            wandb_seg("b1", "run-b", 1, 6, 10, exp=2, config=_nemo(2, "run-b", "results/b")),
            wandb_seg("a2", "run-a", 7, 12, 100, exp=3, config=_nemo(3, "run-a", "results/a")),
            wandb_seg("b2", "run-b", 7, 12, 110, exp=4, config=_nemo(4, "run-b", "results/b"))]
    assert groups(segs) == [["a1", "a2"], ["b1", "b2"]]


def test_two_runs_of_different_base_models_under_one_display_name_stay_apart_and_say_why():
    segs = [seg("m1", "grpo", 1, 40, 0, config={"model_name_or_path": "Qwen/Qwen2.5-7B", "beta": 0.1}),
            seg("m2", "grpo", 41, 80, 1000, config={"model_name_or_path": "meta-llama/Llama-3.1-8B", "beta": 0.1})]
    notes: dict = {}
    assert groups(segs, notes=notes) == [["m1"], ["m2"]]
    (why,) = notes[id(segs[1])]
    assert "was not joined to m1" in why and "model_name_or_path" in why and "Llama-3.1-8B" in why


def test_a_model_moved_into_the_earlier_launchs_checkpoint_joins_and_the_boundary_carries_it():
    from klwatch.pipeline import ScanConfig, build_lineages

    base = {"model_name_or_path": "/models/base", "output_dir": "/work/out/grpo", "beta": 0.1}
    segs = [seg("t1", "grpo", 1, 6, 0, config=base),
            seg("t2", "grpo", 7, 12, 100, config={**base, "model_name_or_path": "/work/out/grpo/checkpoint-6"})]
    (lin,) = build_lineages(segs, config=ScanConfig())
    (b,) = lin.boundaries
    assert b.step == 7 and "model_from_checkpoint" in b.evidence
    assert any("checkpoint-6" in n and "as the model" in n for n in lin.notes)


def test_a_launch_that_starts_over_is_refused_in_words():
    segs = [seg("r1", "grpo", 1, 40, 0), seg("r2", "grpo", 1, 40, 1000)]
    notes: dict = {}
    assert groups(segs, notes=notes) == [["r1"], ["r2"]]
    assert any("starts over at step 1" in n for n in notes[id(segs[1])])


def _tb(ref: str, folder: str, *, first=None, last=None, t0=0.0, config=None):
    s = seg(ref, None, first or 1, last or 1, t0, kind="tensorboard")
    s.group, s.store, s.config = folder, None, config or {}
    if first is None:
        s.series = {}
        s.start_time = t0
    return s


def test_tensorboard_hparams_sidecar_is_the_runs_config_not_a_run():
    main1 = _tb("logs/exp_001/tensorboard/ev1", "logs/exp_001/tensorboard", first=1, last=6)
    car1 = _tb("logs/exp_001/tensorboard/1796320613.1995046/ev", "logs/exp_001/tensorboard/1796320613.1995046", t0=1, config=_nemo(1, "g", "results/g"))
    main2 = _tb("logs/exp_002/tensorboard/ev2", "logs/exp_002/tensorboard", first=7, last=12, t0=100)
    car2 = _tb("logs/exp_002/tensorboard/1796320715.4431/ev", "logs/exp_002/tensorboard/1796320715.4431", t0=101, config=_nemo(2, "g", "results/g"))
    other = _tb("logs/exp_003/tensorboard/ev3", "logs/exp_003/tensorboard", first=7, last=12, t0=50)
    car3 = _tb("logs/exp_003/tensorboard/1796320650.9/ev", "logs/exp_003/tensorboard/1796320650.9", t0=51,
               config=_nemo(3, "g", "results/g", model="another/model"))
    notes: dict = {}
    out = stitch([main1, car1, main2, car2, other, car3], notes=notes)
    runs = sorted(sorted(m.ref for m in members) for _, _, members in out)
    assert runs == [sorted([main1.ref, car1.ref, main2.ref, car2.ref]), sorted([other.ref, car3.ref])]
    assert any("add_hparams" in n for n in notes[id(car1)])
    assert any("policy.model_name" in n for n in notes[id(other)])


def test_checkpoints_beside_the_logs_join_the_run_whose_config_names_them():
    a = wandb_seg("a1", "run-a", 1, 6, 0, exp=1, config=_nemo(1, "run-a", "results/a"))
    b = wandb_seg("b1", "run-b", 1, 6, 10, exp=2, config=_nemo(2, "run-b", "results/b"))
    ck = Segment(kind="checkpoints", ref="results/b", source="/abs", name="something-else", checkpoint_steps=[3, 6])
    a.source = b.source = "/abs"
    notes: dict = {}
    out = stitch([a, b, ck], notes=notes)
    (owner,) = [members for _, _, members in out if ck in members]
    assert b in owner and a not in owner
    assert "its config names that folder" in notes[id(ck)][0]


def test_a_sparse_config_is_no_evidence_of_kinship_between_launches():
    """Of two runs a relaunch continues, one with an empty config does not win the tie by having nothing
    to differ in: the relaunch is left apart, as with no configs at all."""
    a = seg("a", "grpo-a", 1, 500, 0, config={**_nemo(1, "grpo-a", "out/a"), "resume_from_checkpoint": None})
    b = seg("b", "sweet-river-3", 1, 500, 10, config={})
    h = seg("h", "happy-sky-12", 501, 800, 2000, config={**_nemo(1, "grpo-a", "out/a"),
                                                          "resume_from_checkpoint": "out/a/checkpoint-500"})
    notes: dict = {}
    assert groups([a, b, h], notes=notes) == [["a"], ["b"], ["h"]]
    assert any("left apart" in n for n in notes[id(h)])


def test_a_sweep_of_same_named_runs_says_a_few_refusals_and_counts_the_rest():
    segs = [seg(f"r{i}", "sweep", 1, 40, i * 100.0) for i in range(12)]
    notes: dict = {}
    assert len(groups(segs, notes=notes)) == 12
    last = notes[id(segs[-1])]
    assert len(last) == 4 and last[-1].startswith("8 more runs of the same name") and "8 started over" in last[-1]
