"""The run session: plan → wait state → launch → account → log, for one GPU group, without Airflow.

A GPU group is one job alone or a co-located pair sharing one GPU. :class:`RunSession` does the
application work; the Airflow operator (:mod:`carbonflow.operators.carbon_aware_training`) only defers on the
session's :class:`WaitState` and resumes it. Tests drive the session directly.
"""

from carbonflow.session.clock import SessionClock
from carbonflow.session.run import GroupOutcome, JobOutcome, RunSession
from carbonflow.session.source import CarbonSource
from carbonflow.session.state import WAIT_STATE_VERSION, GroupMember, WaitState

__all__ = [
    "WAIT_STATE_VERSION",
    "CarbonSource",
    "GroupMember",
    "GroupOutcome",
    "JobOutcome",
    "RunSession",
    "SessionClock",
    "WaitState",
]
