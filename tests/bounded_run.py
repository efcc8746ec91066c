"""Run klwatch in a child process whose memory is capped and measured: how the hostile-input tests (issue 24)
show a read costs memory bounded by what it keeps, not by the size of what it is given.

The child runs under an address-space limit (``RLIMIT_AS``), so a regression fails the test with a
MemoryError instead of taking the machine down; its peak resident set and wall time are reported, read from
an intermediate process whose only child it is."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

GIB = 1 << 30

_WRAPPER = """
import json, resource, subprocess, sys, time
limit = int(sys.argv[1])
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
t = time.monotonic()
r = subprocess.run(sys.argv[2:], capture_output=True, text=True, preexec_fn=cap)
print(json.dumps([r.returncode, r.stdout, r.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  time.monotonic() - t]))
"""


@dataclass(frozen=True)
class BoundedRun:
    returncode: int
    stdout: str
    stderr: str
    peak_mib: float
    seconds: float


def klwatch_bounded(*args: str, address_space: int = 3 * GIB, timeout: float = 300) -> BoundedRun:
    """``klwatch ARGS`` in a child capped at ``address_space`` bytes; its exit code, output, peak RSS, time."""
    out = subprocess.run([sys.executable, "-c", _WRAPPER, str(address_space), sys.executable, "-m", "klwatch.cli",
                          *args], capture_output=True, text=True, timeout=timeout)
    code, stdout, stderr, peak_kib, seconds = json.loads(out.stdout)
    return BoundedRun(code, stdout, stderr, peak_kib / 1024, seconds)
