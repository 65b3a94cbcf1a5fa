"""carbonflow: train deep-learning models with less energy and less carbon, from Airflow."""

__version__ = "0.1.0"
