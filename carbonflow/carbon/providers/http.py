"""What the HTTP carbon providers share: timeouts, retries that honour ``Retry-After``, an on-disk cache, errors.

:class:`HttpSettings`: per-request timeouts, urllib3 ``Retry`` with backoff that honours ``Retry-After`` on 429/503
(capped, so a DAG never sleeps for an hour), and an optional on-disk requests-cache per provider whose entries
expire at the end of the current slot (the URL names the region). Every failure becomes a
:class:`~carbonflow.carbon.base.ProviderError` whose text holds no credential.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from carbonflow.carbon.base import (
    ProviderUnavailable,
    floor_to,
)
from carbonflow.domain import ForecastPoint

log = logging.getLogger(__name__)
USER_AGENT = "carbonflow (+https://github.com/carbonflow)"
_SECRET_HEADERS = ["auth-token", "Authorization", "X-BLOBR-KEY"]


@dataclass(frozen=True)
class HttpSettings:
    """Timeouts, retries and cache shared by the HTTP providers."""

    timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5
    max_retry_after_s: float = 60.0
    cache_dir: Path | None = None
    cache_slot_s: float = 1800.0


class _CappedRetry(Retry):
    """urllib3 Retry that honours Retry-After but gives up (falls back) when the server asks to wait too long."""

    max_retry_after_s: float = 60.0

    def new(self, **kw: Any) -> _CappedRetry:
        new = super().new(**kw)
        new.max_retry_after_s = self.max_retry_after_s
        return new

    def sleep_for_retry(self, response: Any = None) -> bool:
        retry_after = self.get_retry_after(response) if response is not None else None
        if retry_after is not None and retry_after > self.max_retry_after_s:
            raise _RetryAfterTooLong(retry_after)
        return super().sleep_for_retry(response)


class _RetryAfterTooLong(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"the server asked to retry after {seconds:.0f} s")
        self.seconds = seconds


def _mount(session: requests.Session, settings: HttpSettings) -> requests.Session:
    retry = _CappedRetry(
        total=settings.retries,
        connect=settings.retries,
        read=settings.retries,
        status=settings.retries,
        backoff_factor=settings.backoff_s,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods={"GET"},
        respect_retry_after_header=True,
        raise_on_status=False,
    )
    retry.max_retry_after_s = settings.max_retry_after_s
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers.update({"Accept": "application/json", "User-Agent": USER_AGENT})
    return session


def make_session(provider: str, settings: HttpSettings, *, cached: bool = True) -> requests.Session:
    """A session with retries, and an on-disk cache per provider when ``settings.cache_dir`` is set."""
    if cached and settings.cache_dir is not None:
        import requests_cache

        settings.cache_dir.mkdir(parents=True, exist_ok=True)
        session: requests.Session = requests_cache.CachedSession(
            cache_name=str(settings.cache_dir / f"{provider}.sqlite"),
            backend="sqlite",
            allowable_codes=(200,),
            allowable_methods=("GET",),
            match_headers=False,
            ignored_parameters=_SECRET_HEADERS,
            expire_after=settings.cache_slot_s,
            stale_if_error=False,
        )
    else:
        session = requests.Session()
    return _mount(session, settings)


def _error_text(response: requests.Response) -> str:
    """A short description of an error body in any of the documented shapes (never the request headers)."""
    try:
        body = response.json()
    except ValueError:
        return (response.text or "").strip()[:200]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):  # NESO {"error":{"code","message"}}
            return f"{err.get('code', '')}: {err.get('message', '')}".strip(": ")
        if "title" in body:  # RFC 7807 (Carbon Aware SDK)
            return f"{body.get('title')}: {body.get('detail') or body.get('errors') or ''}".strip(": ")
        msg = body.get("message") or body.get("msg")
        if err and msg:
            return f"{err}: {msg}"
        if err or msg:
            return str(err or msg)
    return json.dumps(body)[:200]


class HttpProvider:
    name = "http"
    key = "http"
    zone_key = "grid"

    def __init__(self, base_url: str, settings: HttpSettings | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.settings = settings or HttpSettings()
        self._session: requests.Session | None = None

    @property
    def session(self) -> requests.Session:
        if self._session is None:
            self._session = make_session(self.key, self.settings)
        return self._session

    def secrets(self) -> list[str]:
        return []

    def _slot_expiry_s(self, now: datetime) -> float:
        slot = self.settings.cache_slot_s
        end = floor_to(now, slot) + timedelta(seconds=slot)
        return max(1.0, (end - datetime.now(UTC)).total_seconds()) if end > datetime.now(UTC) else slot

    def _get(
        self,
        path: str,
        *,
        params: dict | None = None,
        headers: dict | None = None,
        auth: Any = None,
        session: requests.Session | None = None,
        expire_after: float | None = None,
    ) -> requests.Response:
        url = f"{self.base_url}{path}"
        kwargs: dict[str, Any] = {
            "params": params,
            "headers": headers,
            "auth": auth,
            "timeout": self.settings.timeout_s,
        }
        sess = session or self.session
        if expire_after is not None and hasattr(sess, "cache"):
            kwargs["expire_after"] = expire_after
        try:
            return sess.get(url, **kwargs)
        except _RetryAfterTooLong as exc:
            raise ProviderUnavailable(f"{self.name}: HTTP 429/503 and {exc}; not waiting that long") from None
        except requests.exceptions.RetryError as exc:
            raise ProviderUnavailable(f"{self.name}: gave up after retries ({_reason(exc)})") from None
        except requests.exceptions.Timeout:
            raise ProviderUnavailable(
                f"{self.name}: timed out after {self.settings.timeout_s:g} s requesting {path}"
            ) from None
        except requests.exceptions.RequestException as exc:
            if _is_timeout(exc):
                raise ProviderUnavailable(
                    f"{self.name}: timed out after {self.settings.timeout_s:g} s requesting {path}"
                ) from None
            cause = exc.__context__ if isinstance(exc.__context__, _RetryAfterTooLong) else None
            if cause is not None:
                raise ProviderUnavailable(f"{self.name}: {cause}; not waiting that long") from None
            raise ProviderUnavailable(f"{self.name}: request to {path} failed ({type(exc).__name__})") from None

    def _json(self, response: requests.Response, what: str) -> Any:
        if response.status_code >= 400:
            text = _error_text(response)
            for secret in sorted((s for s in self.secrets() if s), key=len, reverse=True):
                text = text.replace(secret, "***")  # a server may echo a key back; never pass it on
            raise ProviderUnavailable(f"{self.name}: HTTP {response.status_code} for {what}: {text}")
        if response.status_code == 204 or not response.content:
            raise ProviderUnavailable(f"{self.name}: empty answer (HTTP {response.status_code}) for {what}")
        try:
            return response.json()
        except ValueError:
            raise ProviderUnavailable(f"{self.name}: malformed JSON for {what}") from None


def _is_timeout(exc: BaseException) -> bool:
    """True when a requests error is a (retried) read/connect timeout, not a refused connection."""
    from urllib3.exceptions import MaxRetryError, NewConnectionError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    for arg in getattr(exc, "args", ()):
        reason = arg.reason if isinstance(arg, MaxRetryError) else arg
        if isinstance(reason, Urllib3Timeout) and not isinstance(reason, NewConnectionError):
            return True
    return False


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "too many 429" in text:
        return "HTTP 429 Too Many Requests"
    for code in ("500", "502", "503", "504"):
        if f"too many {code}" in text:
            return f"HTTP {code}"
    return type(exc).__name__


def slot_points(pairs: list[tuple[datetime, float | None]], period_s: float) -> list[ForecastPoint]:
    """Points of the provider's period from (start, value) pairs; a point never runs past the next start (so a
    gap in the answer stays a gap, never filled with the previous value); null/negative/non-numeric dropped."""
    pairs = sorted(pairs, key=lambda p: p[0])
    out = []
    for i, (start, value) in enumerate(pairs):
        length = period_s
        if i + 1 < len(pairs):
            length = min(period_s, (pairs[i + 1][0] - start).total_seconds())
        if length <= 0:
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            continue
        if value < 0:
            continue
        out.append(ForecastPoint(start=start, length_s=length, gco2_per_kwh=float(value)))
    return out


_HttpProvider = HttpProvider  # the 0.2 name
_points = slot_points
