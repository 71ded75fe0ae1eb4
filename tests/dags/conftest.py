import os
import tempfile

# Airflow reads AIRFLOW_HOME when first imported: keep the tests' Airflow state out of ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="abpo-airflow-home-"))
