#!/usr/bin/env bash
# Set up klwatch in ./.venv (Python >= 3.11). With --test, also what the test suite needs:
# the dev extras and Debian's chromium for the dashboard's browser test.
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
pipi() { .venv/bin/python -m pip install -q "${LOCK[@]}" "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
pipi --upgrade pip

if [ "${1:-}" = "--test" ]; then
  pipi -e '.[dev]'
  if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
else
  pipi -e .
fi
.venv/bin/python -c 'import detectors' || { echo "klwatch did not install" >&2; exit 1; }
