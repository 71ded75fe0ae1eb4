# The Airflow image of docker-compose.yml, with abpo installed against the pinned constraints.
# CPU build; for GPU workers add the `gpu` extra on a CUDA base image.
FROM apache/airflow:3.3.2-python3.11
USER root
COPY --chown=airflow:root . /opt/abpo
USER airflow
RUN pip install --no-cache-dir -c /opt/abpo/constraints.txt -e "/opt/abpo" psycopg2-binary \
 && echo '{"admin": "admin"}' > /opt/airflow/passwords.json
WORKDIR /opt/abpo
