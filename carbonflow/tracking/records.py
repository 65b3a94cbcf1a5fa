"""What carbonflow writes to MLflow, as plain data that can wait in the spool during an outage."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from carbonflow.domain import UtcDatetime, utcnow


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArtifactFile(_Record):
    """A local file to upload; ``artifact_path`` is the folder inside the run (None: the run's root)."""

    file: str
    artifact_path: str | None = None


class RegistryRequest(_Record):
    """Register the run's ``artifact_path`` folder as a new version of ``model_name``."""

    model_name: str
    artifact_path: str
    version_tags: dict[str, str] = Field(default_factory=dict)
    description: str | None = None


class RunRecord(_Record):
    """One MLflow run (and its nested runs), complete, identified by a client-made idempotency key."""

    idempotency_key: str
    job: str
    kind: Literal["training", "profile", "profile-point"]
    experiment: str
    run_name: str
    start_time_ms: int
    end_time_ms: int
    status: Literal["FINISHED", "FAILED", "KILLED"] = "FINISHED"
    params: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    artifacts: list[ArtifactFile] = Field(default_factory=list)
    children: list[RunRecord] = Field(default_factory=list)
    registry: RegistryRequest | None = None
    assign_recurrence: bool = Field(default=False, description="give the run the job's next recurrence index on write")


class SpoolEntryMeta(_Record):
    """Bookkeeping of a spooled record: where it was meant to go and how replay attempts went."""

    tracking_uri: str
    spooled_at: UtcDatetime = Field(default_factory=utcnow)
    reason: str = ""
    attempts: int = 0
    last_error: str | None = None
    last_attempt_at: datetime | None = None
    record: RunRecord
    format_version: int = Field(default=1, description="1: written by carbonflow 0.1.0 (no version field); 2: now")


class TrackingOutcome(_Record):
    """What happened to a run's tracking: written (``run_id``) or spooled for later replay."""

    tracking_uri: str
    idempotency_key: str
    run_id: str | None = None
    experiment_id: str | None = None
    spooled: bool = False
    reason: str | None = None
    spool_path: str | None = None
    model_version: str | None = None
    replayed_from_spool: int = Field(default=0, description="older spooled runs written first")

    @property
    def message(self) -> str:
        """One line for the task log; an outage says so plainly. A password in a URI shows as ``***``."""
        from carbonflow.tracking.uri import redacted_text, redacted_uri

        uri = redacted_uri(self.tracking_uri)
        if self.spooled:
            return redacted_text(
                f"MLflow tracking unavailable ({self.reason}); run kept in the local spool at {self.spool_path} "
                f"and will be replayed when {uri} is back (idempotency key {self.idempotency_key})"
            )
        extra = f", model version {self.model_version}" if self.model_version else ""
        replayed = f"; replayed {self.replayed_from_spool} spooled run(s) first" if self.replayed_from_spool else ""
        return f"logged MLflow run {self.run_id} to {uri}{extra}{replayed}"
