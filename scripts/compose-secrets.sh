#!/usr/bin/env bash
# Generate docker-compose's secrets once, into files only their owner can read (folder 0700, files 0600):
#   scripts/compose-secrets.sh && docker compose up -d --build
#
# Each secret is made once with Python's secrets.token_urlsafe(32) and kept in its own file; a later run keeps
# it (PostgreSQL stores its passwords on first start, so a new one would lock the services out) and rewrites
# the three env files docker-compose.yml reads, each with only what its services need:
#   postgres.env  POSTGRES_PASSWORD, MLFLOW_DB_PASSWORD (the init script creates the mlflow role with it)
#   mlflow.env    MLFLOW_BACKEND_STORE_URI, MLFLOW_AUTH_ADMIN_USERNAME/PASSWORD, MLFLOW_FLASK_SERVER_SECRET_KEY
#   airflow.env   AIRFLOW__DATABASE__SQL_ALCHEMY_CONN, AIRFLOW__API_AUTH__JWT_SECRET,
#                 MLFLOW_TRACKING_USERNAME/PASSWORD (the workers and the Carbon page log in to MLflow)
#
# Settings (environment): CARBONFLOW_SECRETS_DIR  where to write (default <repo>/.carbonflow/compose-secrets;
# docker-compose.yml reads the same variable). The folder is git-ignored (.carbonflow/).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${CARBONFLOW_SECRETS_DIR:-$REPO/.carbonflow/compose-secrets}"
MLFLOW_ADMIN_USER="admin"
umask 077
mkdir -p "$DIR"
chmod 0700 "$DIR"

PYTHON="$(command -v python3 || true)"
[[ -n "$PYTHON" ]] || { echo "compose-secrets: python3 is needed to generate secrets (secrets.token_urlsafe)" >&2; exit 2; }

secret() {  # secret NAME: the secret in $DIR/NAME, generated on first use
  local file="$DIR/$1"
  if [[ ! -s "$file" ]]; then
    "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(32))' > "$file"
    echo "compose-secrets: generated $file" >&2
  fi
  chmod 0600 "$file"
  cat "$file"
}

postgres_password="$(secret postgres_password)"
mlflow_db_password="$(secret mlflow_db_password)"
mlflow_admin_password="$(secret mlflow_admin_password)"
mlflow_flask_secret="$(secret mlflow_flask_secret_key)"
jwt_secret="$(secret airflow_jwt_secret)"

write_env() {  # write_env NAME < lines: replace $DIR/NAME.env atomically, mode 0600
  local target="$DIR/$1.env" tmp
  tmp="$(mktemp "$DIR/.$1.env.XXXXXX")"
  cat > "$tmp"
  chmod 0600 "$tmp"
  mv -f "$tmp" "$target"
}

write_env postgres <<EOF
POSTGRES_PASSWORD=$postgres_password
MLFLOW_DB_PASSWORD=$mlflow_db_password
EOF

write_env mlflow <<EOF
MLFLOW_BACKEND_STORE_URI=postgresql+psycopg2://mlflow:$mlflow_db_password@postgres:5432/mlflow
MLFLOW_AUTH_ADMIN_USERNAME=$MLFLOW_ADMIN_USER
MLFLOW_AUTH_ADMIN_PASSWORD=$mlflow_admin_password
MLFLOW_FLASK_SERVER_SECRET_KEY=$mlflow_flask_secret
EOF

write_env airflow <<EOF
AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgresql+psycopg2://airflow:$postgres_password@postgres:5432/airflow
AIRFLOW__API_AUTH__JWT_SECRET=$jwt_secret
MLFLOW_TRACKING_USERNAME=$MLFLOW_ADMIN_USER
MLFLOW_TRACKING_PASSWORD=$mlflow_admin_password
EOF

echo "compose-secrets: secrets in $DIR (mode 0600); MLflow user '$MLFLOW_ADMIN_USER', password in $DIR/mlflow_admin_password"
