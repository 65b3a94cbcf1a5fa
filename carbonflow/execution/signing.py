"""A run's result comes from its wrapper, never from the training: HMAC-signed with a per-run key.

The training's output shares the wrapper's stdout (the pod log, the local ``training.log``), and on some
paths its files sit beside the wrapper's; so a result is believed only when it carries an HMAC-SHA256 over
its exact bytes made with a key the backend generated for this run (:func:`new_result_key`) and handed to
the wrapper out of the training's reach: in the wrapper's environment (``CARBONFLOW_RESULT_KEY``), which the
wrapper removes before anything else runs and which a training running as another user
(``CARBONFLOW_TRAINING_UID``) cannot read from ``/proc/<pid>/environ``. A training running as the wrapper's
own user is inside the boundary: it could read the key, as it could ptrace the wrapper.

A signed result is one line of text, ``hmac-sha256=<64 hex> <JSON>``; in a log it follows
``CARBONFLOW_RESULT``. Anything else (an unsigned JSON, a line signed with another key, a truncated
message) is refused: the backend calls the run failed and restores the power limits on its restore path.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from carbonflow import settings

RESULT_KEY_ENV = settings.RESULT_KEY_ENV
RESULT_LINE_PREFIX = "CARBONFLOW_RESULT"
SIGNATURE_TAG = "hmac-sha256="
NOT_SIGNED = "result not signed by this run's wrapper"
_HEX_LENGTH = 64


class ResultNotSigned(ValueError):
    """A result without a valid signature of this run's key (its text is not to be believed)."""


def new_result_key() -> str:
    """A fresh per-run key (256 random bits, hex)."""
    return secrets.token_hex(32)


def take_result_key() -> str | None:
    """The wrapper's key, removed from its environment so no child (the training) inherits it."""
    return settings.take_result_key()


def _mac(payload: str, key: str) -> str:
    return hmac.new(key.encode("utf-8"), payload.encode("utf-8"), hashlib.sha256).hexdigest()


def sign_result(payload: str, key: str) -> str:
    """``hmac-sha256=<hex> <payload>``: the payload (one line of JSON) with its signature."""
    if "\n" in payload:
        raise ValueError("payload has a newline; a signed result is one line of JSON (model_dump_json())")
    return f"{SIGNATURE_TAG}{_mac(payload, key)} {payload}"


def result_line(payload: str, key: str) -> str:
    """The log form: ``CARBONFLOW_RESULT hmac-sha256=<hex> <payload>``."""
    return f"{RESULT_LINE_PREFIX} {sign_result(payload, key)}"


def verified_payload(text: str, key: str) -> str:
    """The payload of a signed result (whole text, surrounding whitespace ignored); ResultNotSigned otherwise."""
    stripped = text.strip()
    if stripped.startswith(RESULT_LINE_PREFIX + " "):
        stripped = stripped[len(RESULT_LINE_PREFIX) + 1 :]
    if not stripped.startswith(SIGNATURE_TAG):
        raise ResultNotSigned(f"{NOT_SIGNED}: it carries no signature")
    mac, _, payload = stripped[len(SIGNATURE_TAG) :].partition(" ")
    if len(mac) != _HEX_LENGTH or not payload:
        raise ResultNotSigned(f"{NOT_SIGNED}: its signature is malformed")
    if not hmac.compare_digest(mac, _mac(payload, key)):
        raise ResultNotSigned(f"{NOT_SIGNED}: its signature does not match this run's key (forged or truncated)")
    return payload


def find_signed_payload(text: str | None, key: str) -> tuple[str | None, list[str]]:
    """The signed payload of ``text``: the whole text, else its last ``CARBONFLOW_RESULT`` line that verifies.

    Returns ``(payload or None, why each result-looking candidate was refused)``: unsigned or wrongly signed
    results are never returned, whatever they claim.
    """
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    refused: list[str] = []
    if len(lines) == 1 and lines[0].startswith(("{", SIGNATURE_TAG)):  # a termination message: the whole text
        try:
            return verified_payload(lines[0], key), []
        except ResultNotSigned as err:
            refused.append(str(err))
    for line in reversed(lines):  # a log: its last result line that verifies
        if not line.startswith(RESULT_LINE_PREFIX):
            continue
        try:
            return verified_payload(line, key), refused
        except ResultNotSigned as err:
            refused.append(str(err))
    return None, refused
