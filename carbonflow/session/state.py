"""The session's typed state: the wait state of a deferred training task, and the night's joint plan.

The wait state travels in the trigger's kwargs and the task's ``next_kwargs`` (Airflow's metadata DB), so a task
resumed on another worker, or after an upgrade, finds its group, plans and forecast there and nowhere
else. ``format_version`` says which shape was written; what carbonflow 0.1.0 wrote (an untyped dict
with ``job``, ``plan``, ``forecast``, ``replans``…) is still read by :meth:`WaitState.read`.

The night plan (:class:`NightPlan`) travels through XCom from the night's planning task to its training
tasks; ``version`` says which shape was written, and :meth:`NightPlan.from_xcom` also reads the untyped
dict that carbonflow 0.1.0 wrote (no ``version`` key), so a night planned before an upgrade still trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from carbonflow.domain import EnergyLabel, Forecast, JobSpec, Plan, Profile, UtcDatetime

WAIT_STATE_VERSION = 2
"""1: carbonflow 0.1.0's untyped dict (no version field); 2: this model."""


class GroupMember(BaseModel):
    """One job of a GPU group: its spec, its plan, the profile it was planned from."""

    model_config = ConfigDict(extra="forbid")

    job: JobSpec
    plan: Plan
    profile: Profile | None = Field(default=None, description="None only in states written by 0.1.0")
    min_kept_speed: float | None = Field(
        default=None, description="the early-observation guard: below this kept speed the pair is separated"
    )
    note: str = Field(default="", description="what the night plan knew (e.g. why the job runs alone)")
    would_have: Plan | None = Field(default=None, description="observe-only: the plan carbonflow would have run")


class WaitState(BaseModel):
    """A GPU group waiting for its start: one job alone, or a pair sharing one GPU."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = WAIT_STATE_VERSION
    members: list[GroupMember] = Field(min_length=1, max_length=2)
    first_now: UtcDatetime = Field(description="when the group was first planned: the run-now counterfactual")
    forecast: Forecast | None = None

    @property
    def shared(self) -> bool:
        """Two jobs on one GPU (their start is the night plan's and is not re-planned alone)."""
        return len(self.members) == 2

    @property
    def label(self) -> str:
        """The group's name: its jobs joined by ``+`` (the map label in Airflow's UI)."""
        return "+".join(m.job.name for m in self.members)

    @property
    def start(self) -> Any:
        return self.members[0].plan.start

    @property
    def replans(self) -> int:
        """How often a re-plan on waking has moved the start (the plan counts its own moves)."""
        return self.members[0].plan.replans

    def with_plan(self, plan: Plan, forecast: Forecast | None) -> WaitState:
        """This state with the (single) member re-planned (``plan.replans`` counts the move)."""
        member = self.members[0].model_copy(update={"plan": plan})
        return self.model_copy(update={"members": [member], "forecast": forecast})

    @classmethod
    def read(cls, raw: dict[str, Any]) -> WaitState:
        """A state as stored: this version, or carbonflow 0.1.0's untyped dict."""
        if "members" in raw:
            return cls.model_validate(raw)
        return cls._from_v1(raw)

    @classmethod
    def _from_v1(cls, raw: dict[str, Any]) -> WaitState:
        plan = Plan.model_validate(raw["plan"])
        moves = int(raw.get("replans", 0))  # 0.1.0 counted the moves beside the plan
        if moves > plan.replans:
            plan = plan.model_copy(update={"replans": moves})
        lead = GroupMember(
            job=raw["job"], plan=plan, profile=raw.get("profile"),
            min_kept_speed=raw.get("min_kept_speed"), note=raw.get("note", ""),
        )  # fmt: skip
        members = [lead]
        if raw.get("partner"):
            partner = raw["partner"]
            members.append(GroupMember(job=partner["job"], plan=partner["plan"], profile=partner.get("profile"),
                                       min_kept_speed=partner.get("min_kept_speed")))  # fmt: skip
        return cls(members=members, first_now=raw["first_now"], forecast=raw.get("forecast"))


NIGHT_PLAN_VERSION = 2
"""1: carbonflow 0.1.0's untyped dict (no version key); 2: :class:`NightPlan`. Both have the same keys."""


class NightPair(BaseModel):
    """Two jobs measured together on one GPU (a pair profile, as the night plan stores it)."""

    model_config = ConfigDict(extra="forbid")

    job_a: str
    job_b: str
    speed_a: float = Field(gt=0, le=2, description="fraction of its solo speed job_a kept")
    speed_b: float = Field(gt=0, le=2, description="fraction of its solo speed job_b kept")
    power_w: float = Field(gt=0, description="the GPU's power while both ran")
    label: EnergyLabel = "measured"
    power_limit_w: float | None = None

    def profile(self) -> Any:
        """The planner's :class:`~carbonflow.planning.pairs.PairProfile` (imported here: it needs numpy)."""
        from carbonflow.planning.pairs import PairProfile

        return PairProfile(**self.model_dump())


class NightPlan(BaseModel):
    """The night's joint plan: every job's spec, plan and profile, its GPU groups, and the pairs' guards.

    Through XCom as ``model_dump(mode="json")``; read back with :meth:`from_xcom`.
    """

    model_config = ConfigDict(extra="forbid")

    version: int = NIGHT_PLAN_VERSION
    now: UtcDatetime = Field(description="when the night was planned (on the replayed clock in replay)")
    groups: list[list[str]] = Field(description="the GPU groups by start: a job alone or a co-located pair")
    jobs: dict[str, JobSpec] = Field(description="job name → its spec (finish_by filled in from the deadline)")
    plans: dict[str, Plan] = Field(description="job name → its plan")
    profiles: dict[str, Profile] = Field(description="job name → the profile it was planned from")
    forecasts: dict[str, Forecast] = Field(default_factory=dict, description="region → the forecast planned on")
    min_kept_speed: dict[str, float] = Field(
        default_factory=dict, description="job name → the early-observation guard of a co-located pair's member"
    )
    notes: dict[str, str] = Field(default_factory=dict, description="job name → why it runs alone")
    pairs: list[NightPair] = Field(default_factory=list, description="the pair profiles planned from")

    @model_validator(mode="after")
    def _every_plan_has_its_job_and_profile(self) -> NightPlan:
        for name, plan in self.plans.items():
            if plan.job != name:
                raise ValueError(f"plans[{name!r}] is the plan of job {plan.job!r}; key each plan by its job")
            for key, table in (("jobs", self.jobs), ("profiles", self.profiles)):
                if name not in table:
                    raise ValueError(f"{key} has no entry for job {name!r}; the night plan needs one per planned job")
        return self

    def to_xcom(self) -> dict[str, Any]:
        """The plan as XCom stores it (JSON)."""
        return self.model_dump(mode="json")

    def pair_profiles(self) -> list[Any]:
        """The pairs as the planner's :class:`~carbonflow.planning.pairs.PairProfile`."""
        return [pair.profile() for pair in self.pairs]

    @classmethod
    def from_xcom(cls, raw: NightPlan | Mapping[str, Any]) -> NightPlan:
        """A night plan as XCom holds it: this version, or carbonflow 0.1.0's untyped dict (no ``version``)."""
        if isinstance(raw, NightPlan):
            return raw
        if not isinstance(raw, Mapping):
            raise ValueError(f"a night plan is a JSON object, not {type(raw).__name__}: {raw!r:.80}")
        unknown = sorted(set(raw) - set(cls.model_fields))
        if unknown:
            allowed = ", ".join(cls.model_fields)
            raise ValueError(f"night plan key {unknown[0]!r} is not known (value {raw[unknown[0]]!r:.80}); "
                             f"allowed keys: {allowed}")  # fmt: skip
        version = raw.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= NIGHT_PLAN_VERSION:
            raise ValueError(
                f"night plan version={version!r} is not allowed; this carbonflow reads versions 1 to "
                f"{NIGHT_PLAN_VERSION} (a newer release wrote it? upgrade every worker before planning with it)"
            )
        return cls.model_validate({**raw, "version": NIGHT_PLAN_VERSION})  # version 1 has the same keys
