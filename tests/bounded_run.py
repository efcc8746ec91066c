"""Run klwatch in a child process whose memory is capped and measured: how the hostile-input tests (issue 24)
show a read costs memory bounded by what it keeps, not by the size of what it is given.

The child runs under an address-space limit (``RLIMIT_AS``, each of its worker processes too), so a
regression fails the test with a MemoryError instead of taking the machine down; its peak resident set (the
sum over it and its worker processes, sampled every 20 ms, and at least the largest of them as the kernel
counted it) and wall time are reported by an intermediate process whose only child it is."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

GIB = 1 << 30

_WRAPPER = r"""
import json, os, resource, subprocess, sys, time
limit = int(sys.argv[1])

def cap():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

def tree_rss_kib(root):
    parent, rss = {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/statm") as f:
                rss[int(pid)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        except (OSError, ValueError, IndexError):
            continue
    tree, todo = set(), [root]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo += [c for c, pp in parent.items() if pp == p and c not in tree]
    return sum(rss.get(p, 0) for p in tree)

t = time.monotonic()
proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap)
peak = 0
import threading
out = {}
reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate())))
reader.start()
while reader.is_alive():
    peak = max(peak, tree_rss_kib(proc.pid))
    reader.join(0.02)
peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps([proc.returncode, out["stdout"], out["stderr"], peak, time.monotonic() - t]))
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
