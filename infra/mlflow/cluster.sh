#!/usr/bin/env bash
# Shared MLflow tracking server for a cluster: PostgreSQL backend store, S3-compatible artifact store
# served through the server (clients need no bucket credentials), basic auth with no access by default.
#
#   export MLFLOW_BACKEND_STORE_URI='postgresql://mlflow:DB_PASSWORD@db.internal:5432/mlflow'
#   export MLFLOW_ARTIFACTS_DESTINATION='s3://my-bucket/mlflow'
#   export MLFLOW_FLASK_SERVER_SECRET_KEY="$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
#   export MLFLOW_AUTH_ADMIN_USERNAME=admin MLFLOW_AUTH_ADMIN_PASSWORD='at-least-12-characters'
#   export MLFLOW_HOST=127.0.0.1       # where it listens: 127.0.0.1 behind a TLS proxy on this host (default)
#   infra/mlflow/cluster.sh            # or: infra/mlflow/cluster.sh --check (validate only)
#
# MLFLOW_HOST is the one address the server binds (default 127.0.0.1): keep the default and put a TLS
# reverse proxy on the same host in front (infra/README.md, "MLflow behind TLS"), or name a private
# address the cluster's security group alone can reach. 0.0.0.0 is refused unless
# MLFLOW_ALLOW_ALL_INTERFACES=1, because basic auth over plain HTTP sends passwords in clear.
#
# Optional: MLFLOW_S3_ENDPOINT_URL (MinIO or another S3-compatible store; then AWS_ACCESS_KEY_ID and
# AWS_SECRET_ACCESS_KEY are required too; on AWS prefer an instance role), MLFLOW_PORT (5000),
# MLFLOW_WORKERS (4), MLFLOW_ALLOWED_HOSTS (Host headers besides localhost and private IPs, e.g. the
# proxy's name mlflow.internal.example), MLFLOW_AUTH_DATABASE_URI (users and permissions; default SQLite in
# MLFLOW_STATE_DIR, default ~/.mlflow-server), PYTHON (default python3; needs mlflow[auth], psycopg2, boto3).
#
# Permissions: default_permission is NO_PERMISSIONS: a user sees and changes only what it created or was
# granted (per experiment, per registered model); the admin grants (infra/README.md, "MLflow users").
# Clients (Ray nodes) set MLFLOW_TRACKING_URI=https://HOST plus MLFLOW_TRACKING_USERNAME and
# MLFLOW_TRACKING_PASSWORD from a secret of the node (never in a Ray runtime_env). The database URI stays
# in the environment (mlflow reads MLFLOW_BACKEND_STORE_URI), never on the command line where `ps` shows it.
set -euo pipefail

usage_hint="See the header of infra/mlflow/cluster.sh."

declare -A what=(
  [MLFLOW_BACKEND_STORE_URI]="PostgreSQL URI of the tracking database, postgresql://USER:PASSWORD@HOST:5432/DB"
  [MLFLOW_ARTIFACTS_DESTINATION]="S3 URI where the server stores artifacts, s3://BUCKET/PREFIX"
  [MLFLOW_FLASK_SERVER_SECRET_KEY]="random secret that signs sessions (CSRF), e.g. 64 hex characters"
  [MLFLOW_AUTH_ADMIN_USERNAME]="name of the admin user that basic auth creates on first start"
  [MLFLOW_AUTH_ADMIN_PASSWORD]="password of that admin user, 12 characters or more"
  [AWS_ACCESS_KEY_ID]="access key of the S3-compatible store (needed with MLFLOW_S3_ENDPOINT_URL)"
  [AWS_SECRET_ACCESS_KEY]="secret key of the S3-compatible store (needed with MLFLOW_S3_ENDPOINT_URL)"
)
required=(MLFLOW_BACKEND_STORE_URI MLFLOW_ARTIFACTS_DESTINATION MLFLOW_FLASK_SERVER_SECRET_KEY
  MLFLOW_AUTH_ADMIN_USERNAME MLFLOW_AUTH_ADMIN_PASSWORD)
if [[ -n "${MLFLOW_S3_ENDPOINT_URL:-}" ]]; then
  required+=(AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY)
fi

missing=()
for name in "${required[@]}"; do
  [[ -n "${!name:-}" ]] || missing+=("$name")
done
if ((${#missing[@]})); then
  {
    echo "infra/mlflow/cluster.sh: missing required environment variables: ${missing[*]}"
    for name in "${missing[@]}"; do echo "  $name: ${what[$name]}"; done
    echo "$usage_hint"
  } >&2
  exit 2
fi

problems=()
[[ "$MLFLOW_BACKEND_STORE_URI" =~ ^postgresql(\+[a-z0-9]+)?:// ]] ||
  problems+=("MLFLOW_BACKEND_STORE_URI must be a PostgreSQL URI (postgresql://USER:PASSWORD@HOST:5432/DB)")
[[ "$MLFLOW_ARTIFACTS_DESTINATION" == s3://?* ]] ||
  problems+=("MLFLOW_ARTIFACTS_DESTINATION must be an S3 URI (s3://BUCKET/PREFIX), got '$MLFLOW_ARTIFACTS_DESTINATION'")
((${#MLFLOW_AUTH_ADMIN_PASSWORD} >= 12)) ||
  problems+=("MLFLOW_AUTH_ADMIN_PASSWORD must have 12 characters or more (it has ${#MLFLOW_AUTH_ADMIN_PASSWORD})")
host="${MLFLOW_HOST:-127.0.0.1}"
if [[ "$host" == "0.0.0.0" || "$host" == "::" ]] && [[ "${MLFLOW_ALLOW_ALL_INTERFACES:-}" != 1 ]]; then
  problems+=("MLFLOW_HOST=$host listens on every interface, where basic auth sends passwords in clear; keep 127.0.0.1 behind a TLS proxy, name a private address, or set MLFLOW_ALLOW_ALL_INTERFACES=1 if a firewall and TLS terminator already guard the port")
fi
((${#MLFLOW_FLASK_SERVER_SECRET_KEY} >= 32)) ||
  problems+=("MLFLOW_FLASK_SERVER_SECRET_KEY must have 32 characters or more; generate one with: python3 -c 'import secrets; print(secrets.token_hex(32))'")
if ((${#problems[@]})); then
  printf 'infra/mlflow/cluster.sh: %s\n' "${problems[@]}" >&2
  echo "$usage_hint" >&2
  exit 2
fi

python="${PYTHON:-python3}"
driver=psycopg2 driver_pkg=psycopg2-binary
if [[ "$MLFLOW_BACKEND_STORE_URI" == postgresql+psycopg://* ]]; then driver=psycopg driver_pkg='psycopg[binary]'; fi
if ! "$python" -c "import mlflow, flask_wtf, $driver, boto3" 2>/dev/null; then
  echo "infra/mlflow/cluster.sh: $python lacks mlflow[auth], $driver or boto3: pip install 'mlflow[auth]==3.17.2' '$driver_pkg' boto3" >&2
  exit 2
fi

args=(
  --serve-artifacts --artifacts-destination "$MLFLOW_ARTIFACTS_DESTINATION"
  --app-name basic-auth
  --host "$host" --port "${MLFLOW_PORT:-5000}" --workers "${MLFLOW_WORKERS:-4}"
)
if [[ -n "${MLFLOW_ALLOWED_HOSTS:-}" ]]; then
  args+=(--allowed-hosts "$MLFLOW_ALLOWED_HOSTS")
fi
if [[ "${1:-}" == "--check" ]]; then
  echo "infra/mlflow/cluster.sh: configuration OK; would run: $python -m mlflow server ${args[*]}"
  exit 0
fi

# Users and permissions of basic auth live in their own database (the admin comes from the environment);
# nobody but the admin reads or writes what was not created by or granted to them.
state_dir="${MLFLOW_STATE_DIR:-$HOME/.mlflow-server}"
mkdir -p "$state_dir"
chmod 700 "$state_dir"
auth_config="$state_dir/basic_auth.ini"
cat >"$auth_config" <<INI
[mlflow]
default_permission = NO_PERMISSIONS
database_uri = ${MLFLOW_AUTH_DATABASE_URI:-sqlite:///$state_dir/basic_auth.db}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
chmod 600 "$auth_config"
export MLFLOW_AUTH_CONFIG_PATH="$auth_config" MLFLOW_BACKEND_STORE_URI
exec "$python" -m mlflow server "${args[@]}"
