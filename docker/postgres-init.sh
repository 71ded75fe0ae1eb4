#!/usr/bin/env bash
# PostgreSQL's first start (docker-entrypoint-initdb.d; it runs only while the data volume is empty): the role and
# database of Airflow's metadata, and the role and databases of the MLflow server (tracking + registry, and its
# basic-auth users), each owned by its own role. The passwords come from the container's environment
# (docker-compose.yml, from .env) and reach the server as psql variables (:'name' quotes them), never as literals.
# Changing a password later: ALTER ROLE ... PASSWORD in psql (this script does not run again).
set -eo pipefail  # (no -u: the postgres image sources non-executable scripts)

for var in AIRFLOW_DB_PASSWORD MLFLOW_DB_PASSWORD; do
    if [[ -z "${!var:-}" ]]; then
        echo "postgres-init: $var is not set (see .env.example)" >&2
        exit 1
    fi
done

psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" \
     -v airflow_password="$AIRFLOW_DB_PASSWORD" -v mlflow_password="$MLFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
CREATE ROLE mlflow LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE mlflow OWNER mlflow;
CREATE DATABASE mlflow_auth OWNER mlflow;
REVOKE ALL ON DATABASE airflow FROM PUBLIC;
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;
REVOKE ALL ON DATABASE mlflow_auth FROM PUBLIC;
SQL
echo "postgres-init: roles airflow, mlflow; databases airflow, mlflow, mlflow_auth"
