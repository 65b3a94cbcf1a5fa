"""Moving the night planner (issue #22 item 4: planning/night.py and planning/pairs.py, pairs' starts from the one
start search) changed no plan: 120 seeded random nights planned now equal, exactly, the plans the former
``planning/colocation.py`` made, recorded in ``fixtures/pair_plans_before_start_search.json`` by running this file
as a script with that module's path (``git show 07c1adb:carbonflow/planning/colocation.py > /tmp/former.py``, then
``python tests/planning/test_pair_plans_unchanged.py /tmp/former.py``, in a tree of the commit it is recorded on).
A planning change made on purpose changes these plans too: record them again from the planner before it (its
``planning/night.py``, or ``planning/colocation.py`` before 8be0c7a) and say so in the commit.

Each night mixes the five objectives, deadlines or none, one or two regions, a forecast or none, recent actuals
(the robust search) and a run history on some nights; about a third of the nights co-locate a pair, most of those
starting it later than now (see :mod:`random_nights`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from random_nights import NIGHTS, plan_random_night

FIXTURE = Path(__file__).parent / "fixtures" / "pair_plans_before_start_search.json"


def _recorded() -> dict[str, list[dict]]:
    return json.loads(FIXTURE.read_text())


def test_the_fixture_covers_pairs_started_later() -> None:
    nights = _recorded()
    assert len(nights) == NIGHTS
    paired = [p for night in nights.values() for p in night if p["colocated_with"]]
    assert len(paired) >= 30
    assert sum("start now" not in p["reason"] for p in paired) >= 15


@pytest.mark.parametrize("seed", range(NIGHTS))
def test_a_random_night_plans_as_before(seed: int) -> None:
    assert plan_random_night(seed) == _recorded()[str(seed)]


if __name__ == "__main__":
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("former_planner", sys.argv[1])
    assert spec is not None and spec.loader is not None
    former = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = former
    spec.loader.exec_module(former)
    nights = {str(s): plan_random_night(s, former.plan_night) for s in range(NIGHTS)}
    FIXTURE.write_text(json.dumps(nights, indent=1) + "\n")
