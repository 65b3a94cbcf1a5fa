"""The forecast chain: ask providers in a configurable order per region, fall back, and say why.

A missing key, a dead API, a malformed answer or an uncovered region never raises to the caller: the chain
moves on (down to climatology and codecarbon's static annual average) and records in ``Forecast.notes``
which provider decided and why each earlier one was skipped. Provider error texts are redacted of every
credential the chain knows before they reach a log line or a note.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from carbonflow.carbon.base import ForecastProvider, NotConfigured, ProviderError, require_utc
from carbonflow.carbon.fallbacks import ClimatologyProvider, StaticProvider
from carbonflow.carbon.regions import ResolvedRegion, resolve_region
from carbonflow.carbon.replay import ReplayProvider
from carbonflow.domain import Forecast, ForecastPoint, SignalKind
from carbonflow.settings import provider_credential

log = logging.getLogger(__name__)


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every non-trivial secret replaced by ``***``."""
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def provider_key(provider: Any) -> str:
    """The short name used in chain orders: the part of the provider name before ':' (``replay:...`` → replay)."""
    return str(getattr(provider, "key", None) or provider.name.split(":")[0])


def zone_for(provider: Any, region: ResolvedRegion) -> str | None:
    """The zone code ``provider`` understands for ``region`` (None: not covered)."""
    custom = getattr(provider, "zone_for", None)
    if callable(custom):
        return custom(region)
    key = getattr(provider, "zone_key", "grid")
    if key == "grid":
        return region.grid_zone
    if key == "country":
        return region.name if region.kind == "cloud" else region.country_iso3
    return region.zone(key)


class ForecastChain:
    """Ask ``providers`` in order (per region if ``order`` says so) until one answers for the window.

    ``order`` maps a region name (or ``*``) to provider keys (``neso``, ``electricitymaps``, ``watttime``,
    ``carbon-aware-sdk``, ``replay``, ``climatology``, ``static``). ``signal_kind``, if set, skips answers of
    another kind (marginal and average are never mixed silently); the static last resort is then still
    accepted, and the note says the kind differs.
    """

    def __init__(
        self,
        providers: Sequence[ForecastProvider],
        order: Mapping[str, Sequence[str]] | None = None,
        *,
        signal_kind: SignalKind | None = None,
    ) -> None:
        if not providers:
            raise ValueError("providers=[] is not allowed; give at least one provider (e.g. StaticProvider())")
        self.providers = list(providers)
        self.order = {k.upper(): list(v) for k, v in (order or {}).items()}
        known = {provider_key(p) for p in self.providers}
        for region, names in self.order.items():
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(
                    f"order[{region!r}]={list(names)} names unknown providers {unknown}; allowed: {sorted(known)}"
                )
        self.signal_kind = signal_kind

    def _secrets(self) -> list[str]:
        out: list[str] = []
        for p in self.providers:
            fn = getattr(p, "secrets", None)
            if callable(fn):
                out.extend(fn())
        return out

    def providers_for(self, region: ResolvedRegion) -> list[ForecastProvider]:
        names = self.order.get(region.name.upper()) or self.order.get("*")
        if not names:
            return list(self.providers)
        by_key = {provider_key(p): p for p in self.providers}
        return [by_key[n] for n in names]

    def history(self, region: str, start: datetime, end: datetime) -> list[ForecastPoint]:
        """Recent actuals for ``region`` from the first provider that has them (replay, NESO, Electricity Maps).

        Used by the robust window choice (``choose_start(..., history=...)``). Never raises for provider
        failures: returns ``[]`` (the choice then takes the forecast at face value and says so).
        """
        resolved = resolve_region(region)
        start = require_utc("start", start)
        end = require_utc("end", end)
        secrets = self._secrets()
        for provider in self.providers_for(resolved):
            fetch = getattr(provider, "actuals", None) or getattr(provider, "history", None)
            if not callable(fetch) or isinstance(provider, ClimatologyProvider):
                continue
            zone = zone_for(provider, resolved)
            if zone is None:
                continue
            history_zone = getattr(provider, "history_zone", None)  # e.g. NESO: only the national series
            if callable(history_zone):
                zone = history_zone(zone)
                if zone is None:
                    continue
            try:
                points = fetch(zone, start, end)
            except NotConfigured:
                continue
            except Exception as exc:  # history is optional: never fail the caller
                log.warning(
                    "carbon history from %s for %s unavailable: %s",
                    provider.name,
                    resolved.name,
                    redact(f"{exc}", secrets),
                )
                continue
            points = [p for p in points if p.end > start and p.start < end]
            if points:
                return points
        return []

    def forecast(self, region: str, start: datetime, end: datetime, now: datetime | None = None) -> Forecast:
        """The best forecast for ``region`` covering ``[start, end)`` as known at ``now`` (default: ``start``).

        ``region`` is validated first (ValueError names it and lists allowed values); after that the chain
        never raises: every provider failure becomes a note and a warning.
        """
        resolved = resolve_region(region)
        start = require_utc("start", start)
        end = require_utc("end", end)
        if end <= start:
            raise ValueError(f"end={end.isoformat()} is not allowed; it must be after start={start.isoformat()}")
        now = require_utc("now", now) if now is not None else start
        horizon_s = max((end - now).total_seconds(), 3600.0)
        notes: list[str] = []
        secrets = self._secrets()
        providers = self.providers_for(resolved)
        for i, provider in enumerate(providers):
            name = provider.name
            last = i == len(providers) - 1
            zone = zone_for(provider, resolved)
            if zone is None:
                notes.append(f"skipped {name}: it has no zone for {resolved.name}")
                continue
            try:
                answer = provider.forecast(zone, now, horizon_s)
            except NotConfigured as exc:
                notes.append(f"skipped {name}: {redact(str(exc), secrets)}")
                continue
            except ProviderError as exc:
                msg = redact(str(exc), secrets)
                log.warning("carbon provider %s failed for %s, falling back: %s", name, resolved.name, msg)
                notes.append(f"skipped {name}: {msg}")
                continue
            except Exception as exc:  # a bug or surprise in a provider must not fail the DAG
                msg = redact(f"{type(exc).__name__}: {exc}", secrets)
                log.warning("carbon provider %s raised unexpectedly for %s, falling back: %s", name, resolved.name, msg)
                notes.append(f"skipped {name}: unexpected error {msg}")
                continue
            points = [p for p in answer.points if p.end > start and p.start < end]
            if not points:
                msg = f"its answer has no slot between {start.isoformat()} and {end.isoformat()}"
                log.warning("carbon provider %s for %s: %s", name, resolved.name, msg)
                notes.append(f"skipped {name}: {msg}")
                continue
            if self.signal_kind and answer.signal_kind != self.signal_kind:
                if not (last and provider_key(provider) == "static"):
                    notes.append(f"skipped {name}: signal {answer.signal_kind}, the chain wants {self.signal_kind}")
                    continue
                notes.append(f"{name} gives {answer.signal_kind}, not the wanted {self.signal_kind}: compare with care")
            covered_until = max(p.end for p in points)
            if covered_until < end:
                notes.append(f"{name} covers until {covered_until.isoformat()}, short of {end.isoformat()}")
            if notes:
                log.warning("carbon forecast for %s from %s after fallbacks: %s", resolved.name, name, "; ".join(notes))
            decided = f"decided by {name} for {resolved.name} (zone {zone})"
            return answer.model_copy(
                update={
                    "region": resolved.name,
                    "points": points,
                    "notes": [decided, *notes, *[redact(n, secrets) for n in answer.notes]],
                }
            )
        # Nothing answered (e.g. a chain without static): an empty forecast; windows then start at once.
        notes.append("no provider answered: start at once")
        log.warning("no carbon forecast for %s: %s", resolved.name, "; ".join(notes))
        return Forecast(
            region=resolved.name,
            provider="none",
            signal_kind=self.signal_kind or "average-lifecycle",
            issued_at=now,
            points=[],
            notes=notes,
        )


_FIELD_ALIASES = {"url": ("url", "base_url", "host")}


def _cred(credentials: Mapping[str, Mapping[str, Any]], provider: str, field: str, env: str) -> str | None:
    values = credentials.get(provider) or {}
    for name in _FIELD_ALIASES.get(field, (field,)):
        if values.get(name):
            return str(values[name])
    return provider_credential(env)


def _replay_kind(providers: Sequence[Any], zone: str) -> SignalKind:
    for p in providers:
        if isinstance(p, ReplayProvider):
            try:
                return p.trace(zone).signal_kind
            except ProviderError:
                continue
    return "average-lifecycle"


def default_chain(
    credentials: dict[str, dict] | None = None,
    *,
    replay: bool = False,
    cache_dir: str | Path | None = None,
    order: Mapping[str, Sequence[str]] | None = None,
    timeout_s: float = 10.0,
    retries: int = 3,
    replay_traces: Sequence[str | Path] | None = None,
) -> ForecastChain:
    """The standard chain: free keyless sources first, keyed APIs when configured, then the fallbacks.

    ``credentials`` come from Airflow connections (the operator passes plain values), e.g.
    ``{"electricitymaps": {"token": ...}, "watttime": {"username": ..., "password": ...},
    "carbon-aware-sdk": {"url": ...}, "neso": {"url": ...}}`` (``carbon_aware_sdk`` and ``base_url`` are
    accepted too; empty values count as missing); missing values are read from
    ``CARBONFLOW_ELECTRICITYMAPS_TOKEN``, ``CARBONFLOW_WATTTIME_USERNAME``/``_PASSWORD`` and
    ``CARBONFLOW_CARBON_AWARE_SDK_URL``. ``replay=True`` serves the shipped NESO replay (and ``replay_traces``)
    instead of live APIs, labelled as replay.
    """
    # provider keys as the operators' hooks or credentials.py give them: carbon_aware_sdk == carbon-aware-sdk
    creds: dict[str, dict] = {k.lower().replace("_", "-"): dict(v or {}) for k, v in (credentials or {}).items()}
    if replay:
        rp = ReplayProvider.default()
        if replay_traces:
            extra = ReplayProvider(list(replay_traces))
            providers: list[Any] = [rp, extra]
            extra.key = "replay-traces"  # type: ignore[attr-defined]
        else:
            providers = [rp]

        replays = list(providers)

        def history(zone: str, start: datetime, end: datetime):
            for p in replays:
                try:
                    return p.actuals(zone, start, end)
                except ProviderError:
                    continue
            raise NotConfigured(f"no replayed actuals for {zone}")

        providers += [
            ClimatologyProvider(
                history,
                signal_kind=lambda z: _replay_kind(replays, z),
                source="replayed actuals",
                name="climatology:replay",
            ),
            StaticProvider(),
        ]
        return ForecastChain(providers, order=order)

    from carbonflow.carbon.providers import PROVIDERS, HttpSettings

    settings = HttpSettings(timeout_s=timeout_s, retries=retries, cache_dir=Path(cache_dir) if cache_dir else None)
    live: dict[str, Any] = {}
    for key, entry in PROVIDERS.items():  # every registered provider, in registration order
        plain = dict(creds.get(key) or {})  # extras such as emission_factor pass through as given
        plain.update({field: _cred(creds, key, field, env) for field, env in entry.env.items()})
        live[key] = entry.build(plain, settings)
    neso, em = live.get("neso"), live.get("electricitymaps")

    def live_history(zone: str, start: datetime, end: datetime):
        if zone.upper() == "GB" and neso is not None:
            return neso.actuals("national", start, end)
        if em is None:
            raise NotConfigured(f"no live history source for {zone}")
        return em.history(zone, start, end)

    climatology = ClimatologyProvider(
        live_history,
        signal_kind=lambda z: "average-direct" if z.upper() == "GB" or em is None else em.signal_kind,
        source="NESO actuals (GB) or Electricity Maps history",
    )
    return ForecastChain([*live.values(), climatology, StaticProvider()], order=order)
