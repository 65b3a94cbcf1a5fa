-- Mounted into the postgres service at /docker-entrypoint-initdb.d/ (runs once, on an empty data volume):
-- the MLflow tracking server's own role and database, separate from Airflow's metadata database.
CREATE USER mlflow WITH PASSWORD 'mlflow';
CREATE DATABASE mlflow OWNER mlflow;
