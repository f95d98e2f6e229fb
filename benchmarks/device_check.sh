#!/usr/bin/env bash
# Ready for a GPU (#34, item 5): step-cost table at real sizes, packed capsules per hour, a 1,000-capsule serving
# run and a 4-trial sweep at 0.25 GPU each, in bf16 on one GPU (at most 10 minutes); --cpu-smoke: tiny shapes on CPU.
#
#   bash benchmarks/device_check.sh [--out DIR]                 # GPU mode (exit 2 when torch sees no GPU)
#   bash benchmarks/device_check.sh --cpu-smoke --out DIR       # CPU smoke run (CI)
#   bash benchmarks/device_check.sh --check-imports             # first, on a new machine: what the parts import
#   bash benchmarks/device_check.sh --merge DIR1 DIR2 --out DIR # several calls' folders as one
#   ... [--only device_step_cost ...] [--ray-address ADDR] [--tracking-uri URI]
#
# PYTHON picks the interpreter (default: .venv/bin/python, else python3). Options: benchmarks/device_check.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TQDM_DISABLE=1
echo "+ $PYTHON -m benchmarks.device_check $*" >&2
exec "$PYTHON" -m benchmarks.device_check "$@"
