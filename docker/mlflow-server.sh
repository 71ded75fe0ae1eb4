#!/usr/bin/env bash
# The MLflow tracking server + model registry of docker-compose.yml: PostgreSQL backend (database mlflow, password
# from PGPASSWORD), artifacts proxied by the server (--serve-artifacts) into $MLFLOW_ARTIFACTS_DESTINATION (the
# mlflow-artifacts volume, or s3://bucket/prefix with AWS_* and MLFLOW_S3_ENDPOINT_URL set), basic auth
# (docker/mlflow-basic-auth.ini) and the Host headers MLflow 3 accepts in $MLFLOW_SERVER_ALLOWED_HOSTS.
set -euo pipefail

: "${PGPASSWORD:?PGPASSWORD (the password of the mlflow role: MLFLOW_DB_PASSWORD in .env) is not set}"
: "${MLFLOW_AUTH_ADMIN_PASSWORD:?MLFLOW_AUTH_ADMIN_PASSWORD (MLFLOW_ADMIN_PASSWORD in .env) is not set}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?MLFLOW_FLASK_SERVER_SECRET_KEY (MLFLOW_FLASK_SECRET_KEY in .env) is not set}"
: "${MLFLOW_SERVER_ALLOWED_HOSTS:?MLFLOW_SERVER_ALLOWED_HOSTS is not set}"
export MLFLOW_AUTH_CONFIG_PATH=${MLFLOW_AUTH_CONFIG_PATH:-/opt/abpo/docker/mlflow-basic-auth.ini}

db_host=${MLFLOW_DB_HOST:-postgres}
destination=${MLFLOW_ARTIFACTS_DESTINATION:-/mlflow/artifacts}
case "$destination" in
    /*) mkdir -p "$destination" ;;
esac

# every interface of the container (compose publishes the port on 127.0.0.1 only); run on a host, as
# tests/test_stack_services.py does, MLFLOW_HOST=127.0.0.1 keeps it on the loopback
echo "[mlflow] backend postgresql://mlflow@${db_host}/mlflow, artifacts ${destination}, allowed hosts ${MLFLOW_SERVER_ALLOWED_HOSTS}"
exec mlflow server \
    --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT_INTERNAL:-5000}" --workers "${MLFLOW_WORKERS:-2}" \
    --app-name basic-auth \
    --backend-store-uri "postgresql+psycopg2://mlflow@${db_host}/mlflow" \
    --serve-artifacts --artifacts-destination "$destination" \
    --allowed-hosts "$MLFLOW_SERVER_ALLOWED_HOSTS"
