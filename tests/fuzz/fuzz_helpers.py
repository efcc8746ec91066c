"""What every reader fuzz test asks of a damaged input, and the damage itself (issue 12).

A damaged file, read through ``read_source`` as a user's scan reads it, must give a clear error or
warning naming the file (never a traceback, never an internal exception type as the whole message),
return within a bound (no hang), stay within a bound of memory (a huge declared length is never
allocated) and leave every input file as it was. ``check_read`` asserts all of it for one input and
counts the outcome in ``TOTALS``, which each fuzz module prints when it ends.

The damage (``damage``): a truncation, bit flips, a huge number written over the bytes where a length
may be, random bytes spliced in or a whole file of random bytes; the format's own mutators add a
huge *declared* length at a real length field, and a CRC fixer makes half the damaged inputs pass the
format's checksums, so that the decoding behind the framing is reached too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import resource
import signal
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from klwatch.model import SourceRead
from klwatch.sources import read_source

MiB = 1 << 20
SECONDS_PER_INPUT = 30.0
"""A hang, not a slow read: every input is a few KiB and reads in milliseconds."""
TOTALS: Counter[str] = Counter()
"""inputs, clear errors, warned, read clean, tracebacks, hangs, modified: over this session."""
INTERNAL = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)\b")
"""A message that is nothing but an exception type and its text, e.g. ``TypeError: ...``."""


def fuzz_settings(default: int) -> settings:
    """``default`` examples (``KLWATCH_FUZZ_EXAMPLES=N`` raises it for a long run); the loaded profile
    (tests/conftest.py) decides derandomisation, so CI runs are repeatable."""
    n = int(os.environ.get("KLWATCH_FUZZ_EXAMPLES", default))
    return settings(max_examples=n, deadline=None, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])


class Hang(Exception):
    """The read did not return within its bound."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``Hang`` in this (main) thread after ``seconds``, even inside a blocking system call."""
    def expire(signum: int, frame: object) -> None:
        raise Hang(f"no answer after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and the SHA-256 of its bytes: what reading must not change."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def messages(read: SourceRead) -> tuple[list[str], list[str]]:
    """(errors, warnings) of a read: the SOURCE's and its Segments'."""
    errors = [e.message for e in read.errors] + [s.error for s in read.segments if s.error]
    warnings = list(read.warnings) + [w for s in read.segments for w in s.warnings]
    return errors, warnings


def is_internal(message: str) -> bool:
    """The message is only an exception (its type first, once the ``path: `` prefixes are off)."""
    rest = message
    while ": " in rest and not INTERNAL.match(rest):
        head, rest = rest.split(": ", 1)
        if " " in head.strip():  # a sentence, not a path prefix: the message says something itself
            return False
    return bool(INTERNAL.match(rest))


def check_read(spec: Path, *, folder: Path, names: tuple[str, ...], size: int) -> SourceRead:
    """Read ``spec`` (inside ``folder``) as a scan does and assert what issue 12 asks of any input:
    returns within ``SECONDS_PER_INPUT``, allocates less than 64 MiB + 64 x ``size`` (the input's
    bytes), raises nothing, every error and warning names one of ``names`` and is more than an
    exception, and ``folder`` is byte for byte as it was."""
    before = snapshot(folder)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    TOTALS["inputs"] += 1
    tracemalloc.start()
    try:
        with time_limit(SECONDS_PER_INPUT):
            started = time.monotonic()
            read = read_source(str(spec))
    except Hang:
        TOTALS["hangs"] += 1
        raise
    except BaseException:
        TOTALS["tracebacks"] += 1
        raise
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.monotonic() - started < SECONDS_PER_INPUT
    assert peak < 64 * MiB + 64 * size, f"{peak / MiB:.0f} MiB allocated reading {size} bytes"
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss  # KiB on Linux
    assert grown < 512 * 1024, f"peak RSS grew by {grown / 1024:.0f} MiB"
    errors, warnings = messages(read)
    if any(map(is_internal, errors + warnings)):
        TOTALS["tracebacks"] += 1
    for m in errors + warnings:
        assert not is_internal(m), m
        assert any(n in m for n in names), (m, names)
    if snapshot(folder) != before:
        TOTALS["modified"] += 1
    assert snapshot(folder) == before, "reading changed its input"
    TOTALS["clear errors" if errors else "warned" if warnings else "read clean"] += 1
    return read


class Tally:
    """One module's share of ``TOTALS``: what its inputs gave since it started (the ``tally``
    fixture makes one before the module's first test)."""

    KEYS = ("inputs", "clear errors", "warned", "read clean", "tracebacks", "hangs", "modified")

    def __init__(self) -> None:
        self.start = Counter(TOTALS)

    def counts(self) -> Counter[str]:
        mine = Counter(TOTALS)
        mine.subtract(self.start)
        return mine

    def line(self, label: str) -> str:
        """``label: inputs N, clear errors N, ...`` for the end of the module (``-s`` shows it)."""
        mine = self.counts()
        return f"{label}: " + ", ".join(f"{k} {mine[k]}" for k in self.KEYS)



@pytest.fixture(scope="module", autouse=True)
def tally(request: pytest.FixtureRequest) -> Iterator[Tally]:
    """Import it into a fuzz module: what that module's inputs gave, printed at its end (``-s``)."""
    mine = Tally()
    yield mine
    print("\n" + mine.line(request.module.__name__.removeprefix("test_fuzz_") + " fuzz"))


Mutator = Callable[[bytes, int], bytes]
"""(file bytes, a position) -> damaged bytes: a format's own damage (a huge declared length)."""


@st.composite
def damage(draw: st.DrawFn, data: bytes, *, huge: Mutator | None = None,
           fix: Callable[[bytes], bytes] | None = None) -> tuple[str, bytes]:
    """(what was done, damaged bytes) for ``data``: cut, flipped, a huge number written over it, random
    bytes spliced in or in its place; ``huge`` for the format's real length fields; ``fix`` (the
    format's CRCs made right again) applied to half of them."""
    n = len(data)
    at = draw(st.integers(0, n - 1))
    kind = draw(st.sampled_from(["truncate", "flip", "huge", "splice", "random"]))
    if kind == "truncate":
        out = data[:at]
    elif kind == "flip":
        out = bytearray(data)
        for pos in draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8)):
            out[pos] ^= 1 << draw(st.integers(0, 7))
        out = bytes(out)
    elif kind == "huge":
        if huge is not None and draw(st.booleans()):
            out = huge(data, at)
        else:
            width = draw(st.sampled_from([2, 4, 8]))
            out = data[:at] + b"\xff" * width + data[at + width:]
    elif kind == "splice":
        out = data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at + draw(st.integers(0, 64)):]
    else:
        out = draw(st.binary(min_size=0, max_size=2048))
    if fix is not None and kind != "random" and draw(st.booleans()):
        kind += "+crc"
        out = fix(out)
    return kind, out
