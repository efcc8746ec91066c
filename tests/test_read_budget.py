"""The default read budget: half the machine's memory, within 1 GiB and 16 GiB."""

from __future__ import annotations

import os

import pytest

from klwatch import read_budget
from klwatch.read_budget import GIB, default_max_read_bytes


@pytest.mark.parametrize(("memory", "expected"), [(24 * GIB, 12 * GIB), (7 * GIB, 7 * GIB // 2),
                                                  (1 * GIB, GIB), (256 * GIB, 16 * GIB)])
def test_the_default_budget_is_half_the_memory_within_bounds(monkeypatch: pytest.MonkeyPatch, memory: int,
                                                              expected: int) -> None:
    pages = {"SC_PHYS_PAGES": memory // 4096, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(read_budget.os, "sysconf", lambda name: pages[name])
    assert default_max_read_bytes() == expected


def test_a_machine_that_does_not_say_its_memory_gets_16_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown(name: str) -> int:
        raise ValueError(name)

    monkeypatch.setattr(read_budget.os, "sysconf", unknown)
    assert default_max_read_bytes() == 16 * GIB


def test_this_machine_gets_a_budget_it_can_hold() -> None:
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert GIB <= read_budget.DEFAULT_MAX_READ_BYTES <= max(GIB, memory)
