#!/usr/bin/env bash
# Set up klwatch in ./.venv (Python >= 3.11). With --test, also what the test suite needs:
# the dev extras and Debian's chromium for the dashboard's browser test. With --trl, the trl extra
# (the real-TRL corpus generator: torch==2.13.0 CPU, trl, transformers, peft) and verl's logger.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PY="$cand"; break
    fi
  done
fi
[ -n "$PY" ] || { echo "klwatch needs Python >= 3.11 (set PYTHON=...)" >&2; exit 2; }

# Every package, transitive ones included, comes from the committed lock (refresh it deliberately with
# scripts/lock.sh), so a clean machine today and in a month installs the same versions.
# KLWATCH_NO_LOCK=1 resolves afresh instead (what a plain 'pip install .' does).
LOCK=(); [ "${KLWATCH_NO_LOCK:-}" = 1 ] || LOCK=(-c requirements/lock.txt)

[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip's own exit code counts; only its notes about this machine's extra index folders are filtered out
pipi() { .venv/bin/python -m pip install -q "${LOCK[@]}" "$@" 2> >(grep -v "^WARNING: Location" >&2); }
pipi --upgrade pip

TEST=0; TRL=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    --trl) TRL=1 ;;  # the real-framework corpus generator: TRL on the CPU build of PyTorch, verl's logger
    *) echo "usage: scripts/setup.sh [--test] [--trl]" >&2; exit 2 ;;
  esac
done
extras=()
[ "$TEST" = 1 ] && extras+=(dev)
[ "$TRL" = 1 ] && extras+=(trl)
if [ ${#extras[@]} -gt 0 ]; then
  pipi -e ".[$(IFS=,; echo "${extras[*]}")]"
else
  pipi -e .
fi
if [ "$TRL" = 1 ]; then
  # verl's real Tracking logger, without its GPU stack (ray, vllm, ...): it needs only orjson here
  pipi --no-deps verl==0.9.1 orjson==3.13.0
fi
if [ "$TEST" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
.venv/bin/python -c 'import klwatch.cli, klwatch.dashboard.data' || { echo "klwatch did not install" >&2; exit 1; }
