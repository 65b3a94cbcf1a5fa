"""The wait state: everything a deferred training task needs to resume, as one small typed model.

It travels in the trigger's kwargs and the task's ``next_kwargs`` (Airflow's metadata DB), so a task
resumed on another worker, or after an upgrade, finds its group, plans and forecast there and nowhere
else. ``format_version`` says which shape was written; what carbonflow 0.1.0 wrote (an untyped dict
with ``job``, ``plan``, ``forecast``, ``replans``…) is still read by :meth:`WaitState.read`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from carbonflow.models import Forecast, JobSpec, Plan, Profile, UtcDatetime

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
