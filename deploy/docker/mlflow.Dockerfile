# MLflow tracking server on PostgreSQL with proxied artifact storage (docker-compose service "mlflow").
# The server's options live in docker-compose.yml; mlflow/ holds the tracking-server deployment notes.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install "mlflow==3.17.2" "psycopg2-binary>=2.9,<3" \
    && useradd --create-home --uid 1000 mlflow \
    && mkdir -p /mlartifacts && chown mlflow /mlartifacts
USER mlflow
EXPOSE 5000
ENTRYPOINT ["mlflow"]
