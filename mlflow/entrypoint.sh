#!/bin/sh
# carbonflow's MLflow tracking server (docker-compose service "mlflow"). No Python here on purpose:
# a Python file in a top-level mlflow/ folder would shadow the mlflow library.
#
# Environment (all optional except the backend store):
#   MLFLOW_BACKEND_STORE_URI      e.g. postgresql+psycopg2://mlflow:mlflow@postgres:5432/mlflow   (required)
#   MLFLOW_ARTIFACTS_DESTINATION  where proxied artifacts are stored            (default /mlartifacts, a volume)
#   MLFLOW_PORT                   listening port                                (default 5000)
#   MLFLOW_WORKERS                uvicorn workers                               (default 2)
#   MLFLOW_ALLOWED_HOSTS          Host headers accepted (DNS-rebinding guard)   (default mlflow, localhost, 127.0.0.1)
#   MLFLOW_DB_UPGRADE             run schema migrations of an existing store    (default true)
#   MLFLOW_SERVER_ENABLE_JOB_EXECUTION  MLflow's GenAI job runner, unused here  (default false)
#   MLFLOW_HOST                   listening address: 0.0.0.0 in a container, reached over the compose network
#                                 (the compose file publishes the port on 127.0.0.1 only)       (default 0.0.0.0)
#   MLFLOW_AUTH                   basic: MLflow's basic-auth app (every route but /health needs a user);
#                                 none: no authentication, only with MLFLOW_HOST=127.0.0.1      (default basic)
#   MLFLOW_AUTH_ADMIN_USERNAME, MLFLOW_AUTH_ADMIN_PASSWORD, MLFLOW_FLASK_SERVER_SECRET_KEY
#                                 required with MLFLOW_AUTH=basic (scripts/compose-secrets.sh makes them)
#   MLFLOW_AUTH_CONFIG_PATH       the basic-auth settings (the image: /etc/carbonflow-mlflow/basic_auth.ini)
set -eu

: "${MLFLOW_BACKEND_STORE_URI:?set MLFLOW_BACKEND_STORE_URI, e.g. postgresql+psycopg2://mlflow:mlflow@postgres:5432/mlflow}"
ARTIFACTS="${MLFLOW_ARTIFACTS_DESTINATION:-/mlartifacts}"
PORT="${MLFLOW_PORT:-5000}"
WORKERS="${MLFLOW_WORKERS:-2}"
ALLOWED_HOSTS="${MLFLOW_ALLOWED_HOSTS:-mlflow,mlflow:${PORT},localhost,localhost:${PORT},127.0.0.1,127.0.0.1:${PORT}}"
HOST="${MLFLOW_HOST:-0.0.0.0}"
AUTH="${MLFLOW_AUTH:-basic}"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"

case "$AUTH" in
    basic)
        : "${MLFLOW_AUTH_ADMIN_USERNAME:?MLFLOW_AUTH=basic needs MLFLOW_AUTH_ADMIN_USERNAME (run scripts/compose-secrets.sh)}"
        : "${MLFLOW_AUTH_ADMIN_PASSWORD:?MLFLOW_AUTH=basic needs MLFLOW_AUTH_ADMIN_PASSWORD (run scripts/compose-secrets.sh)}"
        : "${MLFLOW_FLASK_SERVER_SECRET_KEY:?MLFLOW_AUTH=basic needs MLFLOW_FLASK_SERVER_SECRET_KEY (run scripts/compose-secrets.sh)}"
        set -- --app-name basic-auth ;;
    none)
        if [ "$HOST" != "127.0.0.1" ]; then
            echo "carbonflow-mlflow: MLFLOW_AUTH=none is allowed only with MLFLOW_HOST=127.0.0.1 (got MLFLOW_HOST=$HOST)" >&2
            exit 2
        fi
        set -- ;;
    *)
        echo "carbonflow-mlflow: MLFLOW_AUTH='$AUTH' is not allowed; use basic or none" >&2
        exit 2 ;;
esac

mkdir -p "$ARTIFACTS" 2>/dev/null || true

# An existing store made by an older MLflow needs its migrations before the server starts; a new, empty
# database is initialised by the server itself. Retry while the database container is still starting.
if [ "${MLFLOW_DB_UPGRADE:-true}" = "true" ]; then
    tries=0
    until mlflow db upgrade "$MLFLOW_BACKEND_STORE_URI"; do
        tries=$((tries + 1))
        if [ "$tries" -ge 10 ]; then
            echo "carbonflow-mlflow: 'mlflow db upgrade' failed 10 times; starting the server anyway" >&2
            break
        fi
        echo "carbonflow-mlflow: database not ready (attempt $tries); retrying in 3 s" >&2
        sleep 3
    done
fi

exec mlflow server \
    --backend-store-uri "$MLFLOW_BACKEND_STORE_URI" \
    --serve-artifacts \
    --artifacts-destination "$ARTIFACTS" \
    --host "$HOST" \
    --port "$PORT" \
    --workers "$WORKERS" \
    --allowed-hosts "$ALLOWED_HOSTS" \
    "$@"
