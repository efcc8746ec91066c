"""Writers shared by the source tests: real TensorBoard writers into a test's own folder."""

from __future__ import annotations

from pathlib import Path

import pytest


def only_event_file(folder: Path) -> Path:
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    return files[0]


def write_tensorboardx(folder: Path, points: list[tuple[str, int, float, float]]) -> Path:
    """(tag, step, value, wall_time) as torch / tensorboardX write them: ``simple_value`` scalars."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(folder), flush_secs=3600)
    for tag, step, value, wall in points:
        writer.add_scalar(tag, value, step, walltime=wall)
    writer.close()
    return only_event_file(folder)


def write_summary_writer(folder: Path, points: list[tuple[str, int, float, float]]) -> Path:
    """(tag, step, value, wall_time) as ``tensorboard.summary.Writer`` writes them: v2 tensor scalars."""
    from tensorboard.summary import Writer

    writer = Writer(str(folder))
    for tag, step, value, wall in points:
        writer.add_scalar(tag, value, step, wall_time=wall)
    writer.close()
    return only_event_file(folder)


@pytest.fixture
def write_tbx():
    """``write(folder, [(tag, step, value, wall_time)]) -> event file``, via tensorboardX."""
    return write_tensorboardx


@pytest.fixture
def write_v2():
    """``write(folder, [(tag, step, value, wall_time)]) -> event file``, via tensorboard.summary.Writer."""
    return write_summary_writer


@pytest.fixture(params=["tensorboardX", "summary.Writer"])
def scalar_writer(request: pytest.FixtureRequest):
    """Each test that takes it runs once per scalar kind (simple_value, v2 tensor)."""
    return write_tensorboardx if request.param == "tensorboardX" else write_summary_writer
