import atexit
import os
import shutil
import tempfile

# Airflow reads AIRFLOW_HOME when first imported: keep the tests' Airflow state out of ~/airflow (a throw-away
# directory, removed when this test process exits).
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="abpo-airflow-home-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], True)
