#!/usr/bin/env bash
# The install a user makes without the lock: a plain 'pip install .' into a fresh venv, resolving
# today's releases, then the main job's core on the committed samples (exit 1: they hold resets).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip
"$tmp/venv/bin/python" -m pip install -q . 2>&1 | grep -v "^WARNING: Location" || true
"$tmp/venv/bin/klwatch" --help >/dev/null
set +e
(cd "$tmp" && "$tmp/venv/bin/klwatch" scan "$OLDPWD/sample_runs" --format json > "$tmp/report.json")
code=$?
set -e
[ "$code" = 1 ] || { echo "smoke-unlocked: klwatch scan sample_runs/ exited $code, expected 1" >&2; exit 1; }
"$tmp/venv/bin/python" -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['schema']=='klwatch.report/1' and any(l['status']=='reference_reset' for l in r['lineages'])" "$tmp/report.json"
(cd "$tmp" && "$tmp/venv/bin/python" -c "import klwatch.dashboard.data, klwatch.dashboard.charts")  # the dashboard's modules import
echo "smoke-unlocked: plain 'pip install .' works ($("$tmp/venv/bin/pip" show klwatch | sed -n 2p))"
