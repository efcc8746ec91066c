#!/usr/bin/env bash
# Make the NeMo-RL corpus's generation venv (default ./.venv-nemo-rl, gitignored): Python 3.11, the CPU build of
# torch 2.13.0 FIRST (so nothing later can pull a CUDA torch or nvidia-* wheels), then the packages shared with
# klwatch pinned by requirements/lock.txt, then what NeMo-RL's logger/checkpoint/config modules import on top,
# pinned in requirements.txt beside this script. NeMo-RL itself is NOT installed (it pins CUDA packages): the
# generator puts its source folder on sys.path at generation time (--nemo-rl DIR or KLWATCH_NEMO_RL_SRC).
#
#   bash sample_runs/nemo_rl_corpus/setup.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-nemo-rl}"
PY="${PYTHON:-python3.11}"
HERE=sample_runs/nemo_rl_corpus

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pipi() { "$VENV/bin/python" -m pip install -q "$@" 2> >(grep -v "^WARNING: Location" >&2); }
pipi -c requirements/lock.txt --upgrade pip
# 1. torch first, the CPU wheel (torch==2.13.0+cpu in the lock)
pipi -c requirements/lock.txt torch==2.13.0
# 2+3. the shared packages (lock) and NeMo-RL's extra imports (exact pins), kept compatible with that torch
pipi -c requirements/lock.txt -c "$HERE/constraints.txt" -r "$HERE/requirements.txt"
# No CUDA wheel may get in. nvidia-ml-py (pure-Python NVML bindings, no CUDA; swanlab -> pynvml needs it, and
# NeMo-RL lists it itself) is the one allowed name.
if "$VENV/bin/python" -m pip list 2>/dev/null | grep -i nvidia | grep -iv "^nvidia-ml-py "; then
  echo "a CUDA package got in (see above): the generation venv must stay CPU-only" >&2; exit 1
fi
"$VENV/bin/python" -c 'import torch, trl, wandb, mlflow, ray, swanlab, omegaconf, hydra, prometheus_client; assert "+cpu" in torch.__version__, torch.__version__'
echo "generation venv ready: $VENV (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
