#!/usr/bin/env bash
# Lean MLflow tracking server for a laptop: SQLite store, artifacts on local disk served through the
# server, bound to 127.0.0.1 only (the same setup as pipelines.services.LocalMlflowServer).
#
#   infra/mlflow/local.sh [ROOT_DIR]          # default ROOT_DIR: .capt/mlflow in the repository
#   export MLFLOW_TRACKING_URI=http://127.0.0.1:5000
#
# Environment: MLFLOW_PORT (default 5000), PYTHON (default: the repository's .venv, else python3).
# Lean mode (no job-execution workers, one web worker) starts in seconds and uses about 0.5 GB.
# Stop with Ctrl-C. From another machine, tunnel instead of binding wider:
#   ssh -N -L 5000:127.0.0.1:5000 user@this-machine
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
root="${1:-$repo/.capt/mlflow}"
port="${MLFLOW_PORT:-5000}"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python="python3"; fi
fi

mkdir -p "$root/artifacts"
root="$(cd "$root" && pwd)"
echo "MLflow: http://127.0.0.1:$port  (store $root/mlflow.db, artifacts $root/artifacts)" >&2

export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
exec "$python" -m mlflow server \
  --backend-store-uri "sqlite:///$root/mlflow.db" \
  --serve-artifacts --artifacts-destination "$root/artifacts" \
  --host 127.0.0.1 --port "$port" --workers 1
