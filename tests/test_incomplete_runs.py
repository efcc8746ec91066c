"""Issue 15 part 3: a training run with a file that could not be read, or was read only up to damage or
a cut-off end, is one run marked *incomplete* (the reasons name the file), not a healthy-looking run
beside a separate error row.

Every run here is written by a real writer (tensorboardX through ``tb_runs.write_run``; the wandb
client in offline mode) and then damaged the way disks and crashes damage files: bytes flipped in the
middle of a file, a tail cut off.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from klwatch.cli import app
from klwatch.model import LineageResult, ScanResult, is_damage_warning
from klwatch.pipeline import scan
from klwatch.report import EXIT_OK, EXIT_RESET, EXIT_UNREADABLE, exit_code, render_markdown, render_table, to_dict
from spec_shape import check_report
from tb_runs import write_run
from wandb_framing import in_payload
from wandb_offline import offline_env


def _event_files(folder: Path) -> list[Path]:
    """A run's event files in the order its processes wrote them (``write_run`` numbers them)."""
    return sorted(folder.glob("events.out.tfevents.*"), key=lambda p: int(p.name.rsplit(".", 1)[-1]))


def corrupt_mid_file(path: Path) -> None:
    """Flip a byte of the file's first record (its length header): no good record opens the file, so it is
    unreadable (damage further in is read around, naming the bytes skipped)."""
    data = bytearray(path.read_bytes())
    data[9] ^= 0xFF
    path.write_bytes(bytes(data))


def cut_tail(path: Path, n: int = 7) -> None:
    """Cut the last ``n`` bytes (a crash mid-write): the records before them are read, with a warning."""
    path.write_bytes(path.read_bytes()[:-n])


def only(result: ScanResult) -> LineageResult:
    (r,) = result.results
    return r


@pytest.fixture()
def post_resume_corrupt(tmp_path: Path) -> Path:
    """A run resumed at step 40 whose post-resume event file is corrupt in the middle."""
    run = tmp_path / "runs" / "grpo-7b"
    write_run(run, resumes=[40], buggy=True)
    corrupt_mid_file(_event_files(run)[1])
    return tmp_path / "runs"


def test_an_unreadable_event_file_joins_its_run_folders_training_run(post_resume_corrupt: Path) -> None:
    result = scan([str(post_resume_corrupt)])
    r = only(result)  # one row: the unreadable file is a member of the run, not a run of its own
    bad = _event_files(post_resume_corrupt / "grpo-7b")[1]
    assert r.lineage.name == "grpo-7b"
    assert [s.ref for s in r.lineage.segments if s.error] == [f"grpo-7b/{bad.name}"]
    assert r.error is not None and "corrupt event file" in r.error
    assert any(f"grpo-7b/{bad.name} could not be read" in n for n in r.lineage.notes)


def test_an_unreadable_first_launch_joins_the_one_run_of_its_folder_though_older_than_every_file_read(
        tmp_path: Path) -> None:
    """Issue 25, 3: the unreadable file is the run's first launch, older than any file that could be read: still a
    member of the only run its folder holds (it was a run of its own, status error, beside an ``ok`` run whose
    ``error`` was None)."""
    import time

    run = tmp_path / "runs" / "resume-buggy"
    write_run(run, resumes=[40], buggy=True, start_wall=time.time())  # events stamped when their files are named
    first = _event_files(run)[0]
    corrupt_mid_file(first)
    result = scan([str(tmp_path / "runs")])
    r = only(result)
    assert r.lineage.name == "resume-buggy" and first.name in (r.error or "")
    assert any(first.name in why for why in r.incomplete)
    assert exit_code(result) == EXIT_UNREADABLE


def test_a_run_with_an_unreadable_member_is_incomplete_with_the_file_and_why(post_resume_corrupt: Path) -> None:
    result = scan([str(post_resume_corrupt)])
    r = only(result)
    bad = _event_files(post_resume_corrupt / "grpo-7b")[1]
    (why,) = r.incomplete
    assert why.startswith(f"unreadable: grpo-7b/{bad.name}: corrupt event file")
    lineage = to_dict(result)["lineages"][0]
    check_report(to_dict(result))
    assert lineage["incomplete"] == [why] and lineage["error"] == r.error
    assert f"grpo-7b/{bad.name}" in [m["ref"] for m in lineage["members"]]
    assert exit_code(result) == EXIT_UNREADABLE  # SPEC: 3, some runs could not be read (no reset in what was)


def test_a_whole_run_has_an_empty_incomplete_list(tmp_path: Path) -> None:
    write_run(tmp_path / "grpo", resumes=[40], buggy=False)
    result = scan([str(tmp_path)])
    assert only(result).incomplete == [] and to_dict(result)["lineages"][0]["incomplete"] == []
    assert exit_code(result) == EXIT_OK


def test_a_cut_off_event_file_makes_the_run_incomplete_and_keeps_its_verdict(tmp_path: Path) -> None:
    """Read up to the cut: the reset in what was read is still a reset (exit 1), and the run says it is
    incomplete, naming the file and the reader's warning."""
    write_run(tmp_path / "grpo", resumes=[40], buggy=True)
    last = _event_files(tmp_path / "grpo")[1]
    cut_tail(last)
    result = scan([str(tmp_path)])
    r = only(result)
    assert r.status == "reference_reset" and r.error is None
    (why,) = r.incomplete
    assert why.startswith(f"read in part: grpo/{last.name}: truncated event file")
    assert exit_code(result) == EXIT_RESET


def test_an_unreadable_member_of_a_run_without_a_kl_still_names_the_error_and_exits_3(tmp_path: Path) -> None:
    """``error`` is set whatever the status of what was read (before, only ok/reset/intentional runs
    carried it): a no_kl_metric run with an unreadable file is a partly unreadable run."""
    write_run(tmp_path / "sft", resumes=[40], buggy=False, metric="train/reward")
    corrupt_mid_file(_event_files(tmp_path / "sft")[1])
    result = scan([str(tmp_path)])
    r = only(result)
    assert r.status == "no_kl_metric"
    assert r.error is not None and "corrupt event file" in r.error and len(r.incomplete) == 1
    assert exit_code(result) == EXIT_UNREADABLE


def test_an_unreadable_file_of_a_folder_with_two_training_runs_joins_the_one_running_when_it_was_written(
        tmp_path: Path) -> None:
    """Two runs from scratch logged into one folder (stitching keeps them apart): the corrupt file
    joins the run started last before the file was created, never a guess between two."""
    folder = tmp_path / "shared"
    write_run(folder, resumes=[40], buggy=False, start_wall=1_600_000_000.0)
    older = set(folder.iterdir())
    write_run(folder, resumes=[40], buggy=False, seed=1, start_wall=1_700_000_000.0)
    newer = [p for p in _event_files(folder) if p not in older]
    corrupt_mid_file(newer[1])
    result = scan([str(folder)])
    holders = [r for r in result.results if any(s.error for s in r.lineage.segments)]
    assert len(result.results) == 2 and len(holders) == 1
    (holder,) = holders
    assert holder.lineage.segments[0].series["train/kl_penalty"].wall_times[0] == 1_700_000_000.0
    assert [r.incomplete == [] for r in result.results].count(True) == 1


def test_an_unreadable_file_alone_in_its_folder_stays_a_row_named_by_the_file(tmp_path: Path) -> None:
    write_run(tmp_path / "src", resumes=[], buggy=False)
    bad = tmp_path / "bad"
    bad.mkdir()
    data = bytearray(_event_files(tmp_path / "src")[0].read_bytes())
    data[9] ^= 0xFF  # in the first record's length header: nothing of the file is read
    (bad / "events.out.tfevents.456.host").write_bytes(bytes(data))
    r = only(scan([str(bad)]))
    assert r.status == "error" and r.lineage.name == "events.out.tfevents.456.host"
    assert r.incomplete == [f"unreadable: {r.error}"]


def test_table_markdown_and_check_say_which_run_is_incomplete_and_why(post_resume_corrupt: Path) -> None:
    result = scan([str(post_resume_corrupt)])
    bad = _event_files(post_resume_corrupt / "grpo-7b")[1].name
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    render_table(result, console)
    table = console.file.getvalue()
    assert f"warning: grpo-7b: incomplete, unreadable: grpo-7b/{bad}: corrupt event file" in table
    md = render_markdown(result)
    assert "Incomplete (judged on what could be read):" in md and f"- grpo-7b: incomplete, unreadable: grpo-7b/{bad}" in md
    out = CliRunner().invoke(app, ["check", str(post_resume_corrupt), "--no-cache"],
                             env={"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None}, catch_exceptions=False)
    assert out.exit_code == EXIT_UNREADABLE
    assert f"warning: grpo-7b: incomplete, unreadable: grpo-7b/{bad}: corrupt event file" in out.stderr
    gh = CliRunner().invoke(app, ["check", str(post_resume_corrupt), "--no-cache"],
                            env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": None}, catch_exceptions=False)
    assert any(ln.startswith("::warning title=klwatch%3A incomplete run::grpo-7b: incomplete") for ln in gh.stdout.splitlines())


# ---------------------------------------------------------------------------------------------- W&B

WRITER = r"""
import json, sys, time, wandb
for process in json.load(open(sys.argv[1])):
    time.sleep(1.05 - time.time() % 1)  # folders are named by the second: never reuse one
    run = wandb.init(project="klwatch-test", id="grpoa1", name="grpo-7b", resume="allow", config={"lr": 1e-6})
    for step in range(process["first"], process["last"] + 1):
        run.log({"train/kl_penalty": 0.05 * (1 - 0.9 ** (step - process["ref"])), "train/loss": 1.0 / step}, step=step)
    run.finish()
"""


@pytest.fixture(scope="module")
def wandb_resumed(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One W&B run resumed in place (the same run id, a second run folder), written by the real wandb
    client in offline mode: its two run folders in the order written."""
    root = tmp_path_factory.mktemp("wandb-incomplete")
    (root / "writer.py").write_text(WRITER)
    (root / "plan.json").write_text(json.dumps([{"first": 1, "last": 40, "ref": 0}, {"first": 41, "last": 80, "ref": 0}]))
    env = offline_env(root)
    subprocess.run([sys.executable, str(root / "writer.py"), str(root / "plan.json")], env=env, check=True,
                   timeout=240, cwd=root)
    folders = sorted((root / "wandb").glob("offline-run-*"))
    assert len(folders) == 2
    return folders


def _copy_runs(folders: list[Path], dest: Path) -> list[Path]:
    out = []
    for f in folders:
        target = dest / "wandb" / f.name
        target.mkdir(parents=True)
        for log in f.glob("*.wandb"):
            (target / log.name).write_bytes(log.read_bytes())
        out.append(target)
    return out


def test_an_unreadable_wandb_run_folder_joins_the_run_of_its_run_id(wandb_resumed: list[Path], tmp_path: Path) -> None:
    first, second = _copy_runs(wandb_resumed, tmp_path)
    log = next(second.glob("*.wandb"))
    data = log.read_bytes()
    assert len(data) < 32 * 1024  # one block: a flipped byte leaves no block to resume from, so it is an error
    # a byte of a record's payload near the middle, which its CRC covers (the middle byte itself may be a
    # chunk header's length, declaring a chunk that runs past the end of the file: a log cut short, not damage)
    at = in_payload(data, len(data) // 2)
    log.write_bytes(data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:])
    result = scan([str(tmp_path)])
    r = only(result)
    assert r.lineage.name == "grpo-7b"
    (err,) = [s for s in r.lineage.segments if s.error]
    assert err.run_id == "grpoa1" and err.ref == f"wandb/{second.name}" and "CRC mismatch" in err.error
    (why,) = r.incomplete
    assert why.startswith(f"unreadable: wandb/{second.name}") and exit_code(result) == EXIT_UNREADABLE


def test_a_cut_short_wandb_log_makes_its_run_incomplete(wandb_resumed: list[Path], tmp_path: Path) -> None:
    first, second = _copy_runs(wandb_resumed, tmp_path)
    log = next(second.glob("*.wandb"))
    data = log.read_bytes()
    log.write_bytes(data[:len(data.rstrip(b"\x00")) - 3])
    r = only(scan([str(tmp_path)]))
    assert r.error is None and len(r.lineage.segments) == 2
    (why,) = r.incomplete
    assert why.startswith(f"read in part: wandb/{second.name}: ") and "cut short" in why


def test_only_warnings_about_lost_data_count_as_damage() -> None:
    assert is_damage_warning("run.csv: truncated last line 41 (no newline after it: crash mid-write?); dropped")
    assert is_damage_warning("run-x.wandb: corrupt record at byte 40000: CRC mismatch; skipped to the next 32 KiB block")
    assert not is_damage_warning("events.out.tfevents.1.h: dropped 3 NaN/inf values of 'train/kl'")
    assert not is_damage_warning("run.csv: wall-time column 'time' holds neither numbers nor dates; ignored")
