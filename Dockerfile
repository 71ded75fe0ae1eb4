# The image of docker-compose.yml: Apache Airflow 3 with abpo installed against the pinned constraints.
# One Dockerfile, two flavours chosen by build arguments (docker-compose.yml builds both):
#   CPU (default)  torch from the CPU wheel index, no CUDA libraries: the api-server, scheduler, dag-processor,
#                  triggerer, airflow-init and the MLflow server.
#   GPU            TORCH_INDEX_URL=https://pypi.org/simple (PyPI's Linux torch wheel is the CUDA build),
#                  ABPO_EXTRAS=gpu (vLLM, DeepSpeed) and ABPO_CONSTRAINTS=constraints-gpu.txt (the GPU install set):
#                  the `gpu` profile's Celery worker. The CUDA runtime comes
#                  with the torch wheel; the host needs only the NVIDIA driver and the NVIDIA container toolkit.
# No secret is written into any layer: passwords, keys and the simple auth manager's passwords file come from the
# environment at run time (docker/airflow-init.sh writes the passwords file into a volume). .dockerignore keeps
# .venv/, var/, .git/ and any .env out of the build context.
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG ABPO_EXTRAS=""
ARG ABPO_CONSTRAINTS=constraints.txt
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# numeric users (hadolint DL3066): 0 is root, 50000 the image's `airflow` user
USER 0
# Directories the named volumes are mounted on, owned by the Airflow user (uid 50000, group 0) so that a fresh
# volume starts writable; docker/airflow-init.sh re-owns them to $AIRFLOW_UID:0 on every start.
RUN mkdir -p /opt/abpo /var/abpo /mlflow/artifacts /opt/airflow/auth /opt/airflow/logs /opt/airflow/config \
 && chown -R airflow:0 /opt/abpo /var/abpo /mlflow /opt/airflow/auth /opt/airflow/logs /opt/airflow/config \
 && chmod -R g+rwX /var/abpo /mlflow /opt/airflow/auth /opt/airflow/logs
USER 50000
WORKDIR /opt/abpo

# torch first, from the flavour's index (its own layer, so code changes do not re-download it); the version is the
# one pinned in constraints.txt (a local label such as +cpu satisfies the pin).
COPY --chown=airflow:0 constraints.txt /opt/abpo/constraints.txt
RUN pip install --no-cache-dir --no-deps --index-url "${TORCH_INDEX_URL}" "$(grep -E '^torch==' constraints.txt)"

COPY --chown=airflow:0 . /opt/abpo
# Cluster policy: routes the tasks of $ABPO_UPDATE_POOL to $ABPO_UPDATE_QUEUE on a GPU deployment (see the file).
COPY --chown=airflow:0 docker/airflow_local_settings.py /opt/airflow/config/airflow_local_settings.py
# apache-airflow is named so that pip never moves it. psycopg2 and asyncpg: Airflow 3 opens the metadata DB both
# ways (an async engine too). mlflow[auth]: Flask-WTF for `mlflow server --app-name basic-auth`. The Celery
# provider, celery and redis run the GPU worker (the provider's executor does not import with celery 5.7.0: it uses
# celery.backends.database.retry, gone there). boto3: the MLflow server's optional S3 artifact store.
RUN pip install --no-cache-dir -c "${ABPO_CONSTRAINTS}" \
        "$(grep -E '^apache-airflow==' constraints.txt)" \
        -e "/opt/abpo${ABPO_EXTRAS:+[${ABPO_EXTRAS}]}" \
        "$(grep -E '^mlflow==' constraints.txt | sed 's/^mlflow==/mlflow[auth]==/')" \
        psycopg2-binary asyncpg apache-airflow-providers-celery "celery[redis]>=5.5,<5.7" boto3 \
 && python -c "import torch, abpo; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
