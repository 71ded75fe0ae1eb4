-- A second database for the MLflow tracking server, beside Airflow's metadata database.
CREATE USER mlflow WITH PASSWORD 'mlflow';
CREATE DATABASE mlflow OWNER mlflow;
