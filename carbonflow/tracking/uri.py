"""Where carbonflow's MLflow memory lives, and how hard to knock before calling it down.

Embedded default (``make demo``, tests): ``sqlite:///<home>/mlflow.db`` with artifacts under
``<home>/mlartifacts``, where ``<home>`` is ``$CARBONFLOW_HOME`` or ``./.carbonflow``.
Production: ``$MLFLOW_TRACKING_URI`` (an ``http(s)://`` MLflow server, e.g. the docker-compose one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from carbonflow.settings import home_dir

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"

#: MLflow's own defaults (7 retries with back-off factor 2, 120 s timeout) take minutes to notice a
#: dead server; carbonflow wants to know in seconds, spool the run, and move on.
HTTP_MAX_RETRIES = 1
HTTP_TIMEOUT_S = 5
HTTP_BACKOFF_FACTOR = 1


def carbonflow_home() -> Path:
    """carbonflow's local state folder: :func:`carbonflow.settings.home_dir`, the one resolver."""
    return home_dir()


def default_tracking_uri(home: Path | None = None) -> str:
    """The embedded SQLite store under ``home``."""
    home = home or carbonflow_home()
    return f"sqlite:///{home / 'mlflow.db'}"


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` when set, otherwise the embedded SQLite store under the carbonflow home."""
    return os.environ.get(TRACKING_URI_ENV) or default_tracking_uri()


def resolve_tracking_uri(uri: str | None) -> str:
    """``uri`` if given, else :func:`tracking_uri`; local SQLite stores get their folder created."""
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    return uri


def is_server_uri(uri: str) -> bool:
    """True when ``uri`` names a tracking *server* (HTTP), which can be down."""
    return uri.startswith(("http://", "https://"))


def artifact_root(home: Path | None = None) -> Path:
    """Where experiments of a local (non-server) store keep their artifacts."""
    return (home or carbonflow_home()) / "mlartifacts"


def experiment_artifact_location(uri: str, experiment_name: str, home: Path | None = None) -> str | None:
    """Artifact location to give a new experiment, or None to let the server decide.

    A tracking server decides itself (``--default-artifact-root`` / ``--artifacts-destination``); a
    local database store gets ``<home>/mlartifacts/<experiment>`` so artifacts never land in ``./mlruns``.
    """
    if is_server_uri(uri):
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", experiment_name).strip("-") or "experiment"
    path = artifact_root(home) / safe
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


@contextmanager
def short_http_timeouts(
    max_retries: int = HTTP_MAX_RETRIES, timeout_s: int = HTTP_TIMEOUT_S, backoff_factor: int = HTTP_BACKOFF_FACTOR
) -> Iterator[None]:
    """Make MLflow's REST client give up on a dead server within seconds (values the user set win)."""
    wanted = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(max_retries),
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(backoff_factor),
    }
    previous = {key: os.environ.get(key) for key in wanted}
    for key, value in wanted.items():
        if previous[key] is None:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)


def use_short_http_timeouts(
    max_retries: int = HTTP_MAX_RETRIES, timeout_s: int = HTTP_TIMEOUT_S, backoff_factor: int = HTTP_BACKOFF_FACTOR
) -> None:
    """:func:`short_http_timeouts` for the whole process, set once at its start (values the user set win).

    For a long-lived server (the Carbon page in Airflow's api-server): MLflow's client reads these settings
    only from the environment, at each request, and a per-request change of ``os.environ`` races between the
    server's threads (one request's ``finally`` removes what another is relying on).
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(max_retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", str(backoff_factor))


REDACTED = "***"
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*):[^\s@/]*@")
_SECRET_QUERY_KEYS = {"password", "passwd", "pwd", "token", "access_token", "secret", "key", "api_key", "apikey"}


def redacted_uri(uri: str) -> str:
    """``uri`` fit to show: a password becomes ``***`` (``user:***@host``), as do secret query parameters."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:  # not a URI urllib can read: scrub what looks like user:password@
        return redacted_text(uri)
    netloc = parts.netloc
    if password is not None:
        netloc = f"{parts.username or ''}:{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_QUERY_KEYS for k, _ in pairs):
            query = urlencode([(k, REDACTED if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return redacted_text(uri)
    head = f"{parts.scheme}://" if "://" in uri else f"{parts.scheme}:"
    tail = (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")
    return redacted_text(f"{head}{netloc}{parts.path}{tail}")


def redacted_text(text: str) -> str:
    """``text`` (a log line, an error message) with the password of every ``scheme://user:password@`` in it
    replaced by ``***``."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)


def server_reachable(uri: str, timeout_s: float = 3.0) -> tuple[bool, str]:
    """Probe an MLflow server's ``/health`` endpoint; local stores are always reachable."""
    if not is_server_uri(uri):
        return True, "local store"
    import requests

    url = uri.rstrip("/") + "/health"
    try:
        response = requests.get(url, timeout=timeout_s)
    except requests.RequestException as exc:
        return False, f"{url} unreachable: {type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return False, f"{url} answered HTTP {response.status_code}"
    return True, "ok"
