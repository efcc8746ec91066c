#!/usr/bin/env bash
# Run a command (default: the CI entry point, .ci/run) while two busy processes keep both cores
# occupied, to prove the suite does not depend on an idle machine. The busy processes are stopped
# when the command ends, whatever its outcome; the command's exit code is this script's.
#     bash scripts/stress-test.sh                 # CI=true bash .ci/run under load
#     bash scripts/stress-test.sh bash scripts/test.sh tests/test_watch.py
set -uo pipefail
cd "$(dirname "$0")/.."
BUSY="${KLWATCH_STRESS_PROCS:-$(nproc 2>/dev/null || echo 2)}"
pids=()
for _ in $(seq "$BUSY"); do
  # a pure-CPU spin at normal priority, like another job on the machine
  python3 -c 'while True: pass' & pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null' EXIT
echo "stress-test: $BUSY busy process(es) (${pids[*]}) on $(nproc) core(s)" >&2
start=$(date +%s)
if [ $# -eq 0 ]; then set -- env CI=true bash .ci/run; fi
"$@"
code=$?
echo "stress-test: exit $code after $(( $(date +%s) - start )) s under load" >&2
exit $code
