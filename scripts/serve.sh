#!/usr/bin/env bash
# Start carbonflow's real stack without Docker, in the background, under .carbonflow/:
#   MLflow tracking server, Airflow api-server, scheduler, dag-processor and triggerer.
# Every process runs in its own session (its PID is its process-group id) with a PID file in
# .carbonflow/run/; scripts/stop.sh stops each group by that PID. Health-checked before returning.
#
# Settings (environment):
#   CARBONFLOW_HOME            state folder (default: <repo>/.carbonflow)
#   CARBONFLOW_AIRFLOW_PORT    Airflow api-server port (default 8080)
#   CARBONFLOW_MLFLOW_PORT     MLflow server port (default 5000)
#   CARBONFLOW_AIRFLOW_DB_URL  Airflow metadata DB (default: SQLite under $CARBONFLOW_HOME/airflow;
#                              e.g. postgresql+psycopg2://postgres@127.0.0.1:5432/airflow)
#   CARBONFLOW_MLFLOW_BACKEND_URI  MLflow backend store (default: sqlite:///$CARBONFLOW_HOME/mlflow.db)
#   CARBONFLOW_VENV            virtualenv with carbonflow installed (default: <repo>/.venv)
#   CARBONFLOW_START_TIMEOUT_S seconds to wait for health (default 240)
#   CARBONFLOW_GPU_POOL, CARBONFLOW_GPU_POOL_SLOTS  the Airflow pool modelling GPU capacity (carbonflow_gpu, 2)
#   CARBONFLOW_DAGS_FOLDER     the DAGs to serve (default: <repo>/dags); `carbonflow serve --dags DIR` sets it
#   CARBONFLOW_DAGS_PAUSED_AT_CREATION  False (default: a local stack runs a DAG as soon as it is parsed, so a
#                              triggered run never sits queued behind a pause) or True
#   CARBONFLOW_REPLAY          1 (default: the shipped NESO GB replay, offline, as `carbonflow dags test`) or 0
#                              (live carbon APIs and the wall clock); the tasks and the Carbon page both use it
#   CARBONFLOW_EXECUTOR        local (default: LocalExecutor) or celery (CeleryExecutor: needs a PostgreSQL
#                              CARBONFLOW_AIRFLOW_DB_URL and a broker)
#   CARBONFLOW_CELERY_BROKER_URL   the Celery broker (default redis://127.0.0.1:6379/0)
#   CARBONFLOW_CELERY_WORKERS  how many Celery workers to start (default 2); worker N and the triggerer each get
#                              their own CARBONFLOW_HOME under $CARBONFLOW_HOME/hosts/, as if on separate hosts
#   CARBONFLOW_SERVE_AUTH      password (default) or all-admins (see Auth)
# Every port is bound to 127.0.0.1 only. stack.env and every secret are written mode 0600.
# Auth: SimpleAuthManager with one user, admin, whose password serve.sh generates at first start into
#   $CARBONFLOW_HOME/airflow/simple_auth_manager_passwords.json (mode 0600; printed where, never what). A REST
#   API token: POST {"username": "admin", "password": ...} to http://127.0.0.1:$PORT/auth/token.
#   CARBONFLOW_SERVE_AUTH=all-admins: no login, every local user who can reach the port is admin (tests only).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOME_DIR="${CARBONFLOW_HOME:-$REPO/.carbonflow}"
mkdir -p "$HOME_DIR"
HOME_DIR="$(cd "$HOME_DIR" && pwd)"
VENV="${CARBONFLOW_VENV:-$REPO/.venv}"
AIRFLOW_PORT="${CARBONFLOW_AIRFLOW_PORT:-8080}"
MLFLOW_PORT="${CARBONFLOW_MLFLOW_PORT:-5000}"
TIMEOUT_S="${CARBONFLOW_START_TIMEOUT_S:-240}"
RUN_DIR="$HOME_DIR/run"
LOG_DIR="$HOME_DIR/logs"
AIRFLOW_HOME_DIR="$HOME_DIR/airflow"
mkdir -p "$RUN_DIR" "$LOG_DIR" "$AIRFLOW_HOME_DIR" "$HOME_DIR/mlartifacts"

if [[ ! -x "$VENV/bin/airflow" || ! -x "$VENV/bin/mlflow" ]]; then
  echo "serve: $VENV has no airflow/mlflow; run 'make demo' or 'make test' first to create it" >&2
  exit 2
fi

for pidfile in "$RUN_DIR"/*.pid; do
  [[ -e "$pidfile" ]] || continue
  if kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "serve: already running ($(basename "$pidfile" .pid) pid $(cat "$pidfile")); run scripts/stop.sh first" >&2
    exit 1
  fi
  rm -f "$pidfile"
done

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$AIRFLOW_PORT" "$MLFLOW_PORT"; do
  if port_busy "$port"; then
    echo "serve: port $port is already in use; set CARBONFLOW_AIRFLOW_PORT / CARBONFLOW_MLFLOW_PORT" >&2
    exit 1
  fi
done

DAGS_FOLDER="${CARBONFLOW_DAGS_FOLDER:-$REPO/dags}"
if [[ ! -d "$DAGS_FOLDER" ]]; then
  echo "serve: CARBONFLOW_DAGS_FOLDER=$DAGS_FOLDER is not a folder; give the folder holding your DAG files" >&2
  exit 2
fi
DAGS_FOLDER="$(cd "$DAGS_FOLDER" && pwd)"
case "${CARBONFLOW_DAGS_PAUSED_AT_CREATION:-False}" in
  False|false|0) PAUSED=False ;;
  True|true|1) PAUSED=True ;;
  *) echo "serve: CARBONFLOW_DAGS_PAUSED_AT_CREATION='$CARBONFLOW_DAGS_PAUSED_AT_CREATION' is not allowed; use False or True" >&2; exit 2 ;;
esac
case "${CARBONFLOW_REPLAY:-1}" in
  1|true|yes) REPLAY=1; CARBON_WORDS="replay of the shipped NESO GB data (March 2023)" ;;
  0|false|no) REPLAY=0; CARBON_WORDS="live carbon APIs, falling back to climatology and a static annual average" ;;
  *) echo "serve: CARBONFLOW_REPLAY='$CARBONFLOW_REPLAY' is not allowed; use 1 (replay) or 0 (live)" >&2; exit 2 ;;
esac

EXECUTOR="${CARBONFLOW_EXECUTOR:-local}"
case "$EXECUTOR" in
  local) EXECUTOR_CLASS=LocalExecutor ;;
  celery)
    EXECUTOR_CLASS=CeleryExecutor
    case "${CARBONFLOW_AIRFLOW_DB_URL:-}" in
      postgresql*) ;;
      *) echo "serve: CARBONFLOW_EXECUTOR=celery needs CARBONFLOW_AIRFLOW_DB_URL=postgresql+psycopg2://… (got '${CARBONFLOW_AIRFLOW_DB_URL:-}')" >&2; exit 2 ;;
    esac
    [[ -x "$VENV/bin/celery" ]] || { echo "serve: $VENV has no celery; install apache-airflow-providers-celery" >&2; exit 2; } ;;
  *) echo "serve: CARBONFLOW_EXECUTOR='$EXECUTOR' is not allowed; use local or celery" >&2; exit 2 ;;
esac

# A JWT secret shared by every Airflow process (tokens issued by the api-server are checked by the others).
SECRET_FILE="$AIRFLOW_HOME_DIR/jwt_secret"
if [[ ! -s "$SECRET_FILE" ]]; then
  (umask 077 && "$VENV/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))' > "$SECRET_FILE")
fi
chmod 0600 "$SECRET_FILE"

# Who may log in: one admin with a generated password (Airflow would print a password it generates to its log).
AUTH="${CARBONFLOW_SERVE_AUTH:-password}"
ADMIN_USER=admin
PASSWORDS_FILE="$AIRFLOW_HOME_DIR/simple_auth_manager_passwords.json"
case "$AUTH" in
  password)
    ALL_ADMINS=False
    "$VENV/bin/python" - "$PASSWORDS_FILE" "$ADMIN_USER" <<'PY' || exit 2
import json, os, secrets, sys
path, user = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        users = json.loads(f.read().strip() or "{}")
except FileNotFoundError:
    users = {}
if not isinstance(users, dict):
    sys.exit(f"serve: {path} is not a JSON object of user: password; move it away and start again")
if not users.get(user):
    users[user] = secrets.token_urlsafe(18)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(users) + "\n")
    os.replace(path + ".tmp", path)
os.chmod(path, 0o600)
PY
    ;;
  all-admins) ALL_ADMINS=True ;;
  *) echo "serve: CARBONFLOW_SERVE_AUTH='$AUTH' is not allowed; use password or all-admins" >&2; exit 2 ;;
esac

# A task's supervisor gives up on the api-server after 5 retries of AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT (5 s by
# default): on a busy laptop (load 25 on 2 cores) a task was SIGKILLed before it started; 30 s rides that out.
# The environment of every process, also written to stack.env so that `source .carbonflow/stack.env`
# points a shell's airflow/mlflow/carbonflow commands at this stack. It holds the JWT secret: mode 0600.
rm -f "$HOME_DIR/stack.env"
(umask 077 && : > "$HOME_DIR/stack.env")
cat > "$HOME_DIR/stack.env" <<EOF
export CARBONFLOW_HOME="$HOME_DIR"
export AIRFLOW_HOME="$AIRFLOW_HOME_DIR"
export AIRFLOW__CORE__DAGS_FOLDER="$DAGS_FOLDER"
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=$PAUSED
export CARBONFLOW_REPLAY=$REPLAY
export AIRFLOW__CORE__PLUGINS_FOLDER="$REPO/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=$EXECUTOR_CLASS
export AIRFLOW__CORE__PARALLELISM=4
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$AIRFLOW_PORT/execution/"
export AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT=30
export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=$ALL_ADMINS
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="$ADMIN_USER:admin"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$PASSWORDS_FILE"
export AIRFLOW__API__PORT="$AIRFLOW_PORT"
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__BASE_URL="http://127.0.0.1:$AIRFLOW_PORT"
export AIRFLOW__API__WORKERS=1
export AIRFLOW__API_AUTH__JWT_SECRET="$(cat "$SECRET_FILE")"
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="${CARBONFLOW_AIRFLOW_DB_URL:-sqlite:///$AIRFLOW_HOME_DIR/airflow.db}"
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=20
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=30
export AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK=False
export AIRFLOW__LOGGING__BASE_LOG_FOLDER="$LOG_DIR/airflow"
export MLFLOW_TRACKING_URI="http://127.0.0.1:$MLFLOW_PORT"
export CARBONFLOW_UI_AUTH=airflow
export PYTHONPATH="$REPO\${PYTHONPATH:+:\$PYTHONPATH}"
EOF
if [[ "$EXECUTOR" == celery ]]; then
  cat >> "$HOME_DIR/stack.env" <<EOF
export AIRFLOW__CELERY__BROKER_URL="${CARBONFLOW_CELERY_BROKER_URL:-redis://127.0.0.1:6379/0}"
export AIRFLOW__CELERY__RESULT_BACKEND="db+${CARBONFLOW_AIRFLOW_DB_URL}"
EOF
fi
# shellcheck disable=SC1091
source "$HOME_DIR/stack.env"

started=()
start() {  # start NAME CMD...: own session, output to logs/NAME.log, PID file run/NAME.pid
  local name="$1"; shift
  setsid "$@" >"$LOG_DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN_DIR/$name.pid"
  started+=("$name")
  echo "serve: started $name (pid $!, log $LOG_DIR/$name.log)"
}

fail() {
  echo "serve: $*" >&2
  for name in "${started[@]}"; do
    echo "---- last lines of $LOG_DIR/$name.log" >&2
    tail -n 15 "$LOG_DIR/$name.log" >&2 || true
  done
  "$REPO/scripts/stop.sh" >&2 || true
  exit 1
}

echo "serve: migrating the Airflow metadata DB ($AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)"
"$VENV/bin/airflow" db migrate >"$LOG_DIR/airflow-db-migrate.log" 2>&1 || {
  tail -n 30 "$LOG_DIR/airflow-db-migrate.log" >&2; exit 1; }

# Pools model GPU capacity (the DAGs' tasks name the pool); a missing pool would leave tasks unscheduled.
"$VENV/bin/airflow" pools set "${CARBONFLOW_GPU_POOL:-carbonflow_gpu}" "${CARBONFLOW_GPU_POOL_SLOTS:-2}" \
  "GPUs available to carbonflow training (slots = GPUs)" >>"$LOG_DIR/airflow-db-migrate.log" 2>&1 || {
  tail -n 30 "$LOG_DIR/airflow-db-migrate.log" >&2; exit 1; }

start mlflow "$VENV/bin/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
  --backend-store-uri "${CARBONFLOW_MLFLOW_BACKEND_URI:-sqlite:///$HOME_DIR/mlflow.db}" \
  --artifacts-destination "$HOME_DIR/mlartifacts"
start airflow-api-server "$VENV/bin/airflow" api-server --port "$AIRFLOW_PORT" --host 127.0.0.1 --workers 1
start airflow-scheduler "$VENV/bin/airflow" scheduler
start airflow-dag-processor "$VENV/bin/airflow" dag-processor
if [[ "$EXECUTOR" == celery ]]; then  # the triggerer and each worker with its own CARBONFLOW_HOME: other hosts
  mkdir -p "$HOME_DIR/hosts/triggerer"
  start airflow-triggerer env CARBONFLOW_HOME="$HOME_DIR/hosts/triggerer" "$VENV/bin/airflow" triggerer
  for i in $(seq 1 "${CARBONFLOW_CELERY_WORKERS:-2}"); do
    mkdir -p "$HOME_DIR/hosts/worker-$i"
    start "airflow-celery-worker-$i" env CARBONFLOW_HOME="$HOME_DIR/hosts/worker-$i" "$VENV/bin/airflow" celery \
      worker --celery-hostname "worker-$i@%h" --concurrency 2 --skip-serve-logs
  done
else
  start airflow-triggerer "$VENV/bin/airflow" triggerer
fi

health_json() { curl -fsS --max-time 3 "http://127.0.0.1:$AIRFLOW_PORT/api/v2/monitor/health" 2>/dev/null || true; }
all_healthy() {
  "$VENV/bin/python" -c '
import json, sys
try:
    h = json.loads(sys.argv[1])
except ValueError:
    sys.exit(1)
parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
sys.exit(0 if all((h.get(p) or {}).get("status") == "healthy" for p in parts) else 1)' "$1"
}

deadline=$((SECONDS + TIMEOUT_S))
mlflow_ok=0
airflow_ok=0
while (( SECONDS < deadline )); do
  for name in "${started[@]}"; do
    kill -0 "$(cat "$RUN_DIR/$name.pid")" 2>/dev/null || fail "$name exited during start-up"
  done
  if (( !mlflow_ok )) && curl -fsS --max-time 3 "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null 2>&1; then
    mlflow_ok=1; echo "serve: MLflow healthy at http://127.0.0.1:$MLFLOW_PORT"
  fi
  if (( !airflow_ok )) && all_healthy "$(health_json)"; then
    airflow_ok=1; echo "serve: Airflow healthy (metadatabase, scheduler, triggerer, dag-processor)"
  fi
  (( mlflow_ok && airflow_ok )) && break
  sleep 2
done
(( mlflow_ok && airflow_ok )) || fail "not healthy after ${TIMEOUT_S}s (mlflow=$mlflow_ok airflow=$airflow_ok): $(health_json)"

if [[ "$AUTH" == password ]]; then
  WHO="user $ADMIN_USER, password in $PASSWORDS_FILE (mode 0600)"
  TOKEN="curl -s -X POST -H 'Content-Type: application/json' -d '{\"username\": \"$ADMIN_USER\", \"password\": \"…\"}' http://127.0.0.1:$AIRFLOW_PORT/auth/token"
else
  WHO="no login: every local user who can reach 127.0.0.1:$AIRFLOW_PORT is admin (CARBONFLOW_SERVE_AUTH=all-admins)"
  TOKEN="curl -s http://127.0.0.1:$AIRFLOW_PORT/auth/token"
fi
cat <<EOF
serve: stack is up (listening on 127.0.0.1 only)
  Airflow UI      http://127.0.0.1:$AIRFLOW_PORT   (Carbon page under Browse → Carbon)
  Airflow admin   $WHO
  Carbon page     http://127.0.0.1:$AIRFLOW_PORT/carbonflow/carbon
  DAGs folder     $DAGS_FOLDER   (new DAGs start unpaused: $( [[ $PAUSED == False ]] && echo yes || echo no ))
  carbon source   $CARBON_WORDS (CARBONFLOW_REPLAY=$REPLAY; tasks and Carbon page alike)
  MLflow          http://127.0.0.1:$MLFLOW_PORT   (no login: reachable from this machine only)
  REST API token  $TOKEN
  environment     source $HOME_DIR/stack.env
  stop            ${CARBONFLOW_STOP_HINT:-make stop (scripts/stop.sh)}
EOF
