#!/usr/bin/env bash
# Stop the stack started by scripts/serve.sh: each process group by the PID in .carbonflow/run/*.pid
# (SIGTERM, then SIGKILL after CARBONFLOW_STOP_TIMEOUT_S), then check that nothing of it is left.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOME_DIR="${CARBONFLOW_HOME:-$REPO/.carbonflow}"
RUN_DIR="$HOME_DIR/run"
TIMEOUT_S="${CARBONFLOW_STOP_TIMEOUT_S:-30}"

group_alive() { kill -0 -- "-$1" 2>/dev/null; }

shopt -s nullglob
pidfiles=("$RUN_DIR"/*.pid)
if (( ${#pidfiles[@]} == 0 )); then
  echo "stop: nothing to stop (no PID files in $RUN_DIR)"
  exit 0
fi

# Stop the scheduler / triggerer / dag-processor before the api-server (their task runners report to it),
# and MLflow last (a finishing task may still log to it).
order=(airflow-scheduler airflow-triggerer airflow-dag-processor airflow-api-server mlflow)
sorted=()
for name in "${order[@]}"; do [[ -e "$RUN_DIR/$name.pid" ]] && sorted+=("$RUN_DIR/$name.pid"); done
for f in "${pidfiles[@]}"; do [[ " ${sorted[*]} " == *" $f "* ]] || sorted+=("$f"); done

left=0
for pidfile in "${sorted[@]}"; do
  name="$(basename "$pidfile" .pid)"
  pid="$(cat "$pidfile")"
  if [[ ! "$pid" =~ ^[0-9]+$ ]]; then
    echo "stop: $pidfile does not hold a PID; removing it" >&2
    rm -f "$pidfile"; continue
  fi
  if ! group_alive "$pid"; then
    echo "stop: $name (pid $pid) was not running"
    rm -f "$pidfile"; continue
  fi
  kill -TERM -- "-$pid" 2>/dev/null || true
  waited=0
  while group_alive "$pid" && (( waited < TIMEOUT_S * 10 )); do sleep 0.1; waited=$((waited + 1)); done
  if group_alive "$pid"; then
    echo "stop: $name (pid $pid) ignored SIGTERM for ${TIMEOUT_S}s; sending SIGKILL" >&2
    kill -KILL -- "-$pid" 2>/dev/null || true
    waited=0  # a killed group is gone once its processes are reaped: give a busy machine a few seconds
    while group_alive "$pid" && (( waited < 100 )); do sleep 0.1; waited=$((waited + 1)); done
  fi
  if group_alive "$pid"; then
    echo "stop: $name (process group $pid) is still running" >&2
    left=1
  else
    echo "stop: stopped $name (pid $pid)"
    rm -f "$pidfile"
  fi
done
exit "$left"
