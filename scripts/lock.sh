#!/usr/bin/env bash
# Refresh requirements/lock.txt: every package, transitive ones included, pinned to what a fresh
# install of klwatch with the extras given resolves to today. Run it deliberately (a dependency bump is
# a reviewed commit), then run the tests:
#     bash scripts/lock.sh && bash scripts/test.sh
# Extras locked by default: dev (the test suite) and trl (the real-framework corpus and the training
# callback). PyTorch is pinned to the CPU build torch==2.13.0, never a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${KLWATCH_LOCK_EXTRAS:-dev,trl}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
torch_pin=()
if grep -q '^trl' <<<"$(tr ',' '\n' <<<"$EXTRAS")"; then torch_pin=("torch==2.13.0"); fi
"$tmp/venv/bin/python" -m pip install -q ".[$EXTRAS]" "${torch_pin[@]}"
{
  echo "# klwatch's lock: every package a fresh install of .[${EXTRAS}] resolved to on $(date -u +%Y-%m-%d),"
  echo "# Python $("$tmp/venv/bin/python" -c 'import platform; print(platform.python_version(), platform.machine())')."
  echo "# scripts/setup.sh installs with '-c' this file; refresh it with: bash scripts/lock.sh"
  "$tmp/venv/bin/python" -m pip freeze --all | grep -viE '^klwatch( |=|@)' | sed 's/+cpu$/+cpu/'
} > requirements/lock.txt.new
mv requirements/lock.txt.new requirements/lock.txt
echo "requirements/lock.txt: $(grep -vc '^#' requirements/lock.txt) packages"
