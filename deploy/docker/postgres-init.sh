#!/bin/bash
# One PostgreSQL server, two databases: Airflow's metadata (POSTGRES_DB) and MLflow's tracking store.
# Run once by the postgres image on an empty data volume (/docker-entrypoint-initdb.d).
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v mlflow_password="${MLFLOW_DB_PASSWORD:-mlflow}" <<'SQL'
CREATE USER mlflow WITH PASSWORD :'mlflow_password';
CREATE DATABASE mlflow OWNER mlflow;
SQL
