"""The typed night plan: what XCom carries from the night's planning task to its training tasks.

``fixtures/night_plan_0_1_0.json`` is what carbonflow 0.1.0's ``NightPlanOperator.execute`` returned (an
untyped 9-key dict, no ``version``): two jobs co-located on one simulated V100 with their pair profile,
planned on the shipped NESO GB replay. A night planned before an upgrade must still train.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from carbonflow.planning.pairs import PairProfile
from carbonflow.session import CarbonSource, RunSession
from carbonflow.session.state import NIGHT_PLAN_VERSION, NightPlan

OLD_NIGHT = Path(__file__).parent / "fixtures" / "night_plan_0_1_0.json"
OLD_KEYS = {"now", "groups", "jobs", "plans", "profiles", "forecasts", "min_kept_speed", "notes", "pairs"}


def _old() -> dict[str, Any]:
    return json.loads(OLD_NIGHT.read_text())


def test_the_fixture_is_the_old_untyped_shape() -> None:
    assert set(_old()) == OLD_KEYS  # no version key: what 0.1.0 wrote


def test_a_night_plan_round_trips_through_xcom_json() -> None:
    night = NightPlan.from_xcom(_old())
    stored = json.loads(json.dumps(night.to_xcom()))  # XCom keeps JSON
    assert stored["version"] == NIGHT_PLAN_VERSION
    assert set(stored) == OLD_KEYS | {"version"}
    again = NightPlan.from_xcom(stored)
    assert again == night
    assert again.to_xcom() == stored


def test_the_old_untyped_dict_is_read_with_every_field() -> None:
    raw = _old()
    night = NightPlan.from_xcom(raw)
    assert night.version == NIGHT_PLAN_VERSION
    assert night.groups == [["pair-a", "pair-b"]]
    assert night.plans["pair-a"].colocated_with == ["pair-b"]
    assert night.plans["pair-b"].config.colocation_group == "pair-a+pair-b"
    assert night.jobs["pair-a"].name == "pair-a" and night.profiles["pair-b"].job == "pair-b"
    assert night.min_kept_speed == raw["min_kept_speed"] and 0 < night.min_kept_speed["pair-a"] <= 0.95
    assert night.forecasts["GB"].replay is True
    assert night.now.isoformat() == raw["now"]
    (pair,) = night.pair_profiles()
    assert isinstance(pair, PairProfile) and pair.speeds("pair-b", "pair-a") == (0.9, 0.95)


def test_a_night_planned_before_the_upgrade_still_trains_its_groups(tmp_path: Path) -> None:
    session = RunSession(source=CarbonSource(replay=True), workdir=tmp_path)
    raw = _old()
    state = session.from_night_plan(raw, ["pair-a", "pair-b"])
    assert state.shared and state.label == "pair-a+pair-b"
    assert [m.min_kept_speed for m in state.members] == [raw["min_kept_speed"][n] for n in ("pair-a", "pair-b")]
    assert state.first_now.isoformat() == raw["now"]
    assert state.forecast is not None and state.forecast.replay
    # the typed plan gives the same wait state as its XCom JSON
    assert session.from_night_plan(NightPlan.from_xcom(raw), ["pair-a", "pair-b"]) == state


def test_an_old_dict_without_pairs_or_notes_is_read_with_empty_ones() -> None:
    raw = {k: v for k, v in _old().items() if k not in {"pairs", "notes", "min_kept_speed", "forecasts"}}
    night = NightPlan.from_xcom(raw)
    assert (night.pairs, night.notes, night.min_kept_speed, night.forecasts) == ([], {}, {}, {})


def test_an_unknown_key_is_refused_naming_it() -> None:
    with pytest.raises(
        ValueError, match=r"night plan key 'gpu_plan' is not known \(value 3\); allowed keys: version, now"
    ):
        NightPlan.from_xcom({**_old(), "gpu_plan": 3})
    raw = _old()
    raw["plans"]["pair-a"]["surprise"] = True  # inside a plan: the model's own check names the path
    with pytest.raises(ValueError, match=r"plans\.pair-a\.surprise"):
        NightPlan.from_xcom(raw)


@pytest.mark.parametrize("version", [NIGHT_PLAN_VERSION + 1, 0, "2", True, None])
def test_a_version_this_release_cannot_read_is_refused(version: object) -> None:
    with pytest.raises(ValueError, match=rf"night plan version={version!r} is not allowed; this carbonflow reads "
                                         rf"versions 1 to {NIGHT_PLAN_VERSION}"):  # fmt: skip
        NightPlan.from_xcom({**_old(), "version": version})


def test_the_versions_this_release_reads_are_accepted() -> None:
    for version in range(1, NIGHT_PLAN_VERSION + 1):
        assert NightPlan.from_xcom({**_old(), "version": version}).version == NIGHT_PLAN_VERSION


def test_a_plan_without_its_job_or_profile_is_refused() -> None:
    raw = _old()
    del raw["profiles"]["pair-b"]
    with pytest.raises(ValueError, match="profiles has no entry for job 'pair-b'"):
        NightPlan.from_xcom(raw)
    raw = _old()
    raw["plans"]["pair-c"] = raw["plans"].pop("pair-b")
    with pytest.raises(ValueError, match=r"plans\['pair-c'\] is the plan of job 'pair-b'"):
        NightPlan.from_xcom(raw)


def test_what_is_not_a_json_object_is_refused() -> None:
    with pytest.raises(ValueError, match="a night plan is a JSON object, not list"):
        NightPlan.from_xcom([["pair-a", "pair-b"]])  # type: ignore[arg-type]


def test_the_dags_gpu_groups_task_reads_an_old_night_plan_and_refuses_a_newer_one() -> None:
    from carbonflow.operators.night import night_gpu_groups  # the public API a DAG maps its training over

    assert night_gpu_groups.function(_old()) == [["pair-a", "pair-b"]]
    with pytest.raises(ValueError, match="night plan version=99 is not allowed"):
        night_gpu_groups.function({**_old(), "version": 99})
