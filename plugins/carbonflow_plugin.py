"""Airflow plugin file: the Carbon page lives in the carbonflow package (carbonflow.web)."""

from carbonflow.web.plugin import CarbonflowPlugin

__all__ = ["CarbonflowPlugin"]
