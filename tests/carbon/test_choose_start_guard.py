"""choose_start_guard: the guard's z and the nowcast variant are chosen by the written rule, on simulated data."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("choose_start_guard", ROOT / "benchmarks" / "choose_start_guard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rule_takes_the_best_fraction_within_the_share_limit_and_confirms_upward(monkeypatch):
    m = _load()
    screen = [
        {"variant": "a", "z": 1.0, "fraction_of_oracle_mean": 0.75, "share_worse_by_1pct_max": 0.099},
        {"variant": "b", "z": 1.0, "fraction_of_oracle_mean": 0.80, "share_worse_by_1pct_max": 0.12},
        {"variant": "b", "z": 1.1, "fraction_of_oracle_mean": 0.74, "share_worse_by_1pct_max": 0.098},
    ]
    assert m.choose(screen)["variant"] == "a"  # b at 1.0 keeps more but breaks the share limit
    full = {("a", 1.0): (0.70, 0.101), ("a", 1.1): (0.68, 0.095), ("b", 1.1): (0.69, 0.097)}

    def fake(traces, variant, z, seeds, every_h):
        frac, share = full[(variant, round(z, 3))]
        return {"variant": variant, "z": z, "fraction_of_oracle_mean": frac, "share_worse_by_1pct_max": share}

    monkeypatch.setattr(m, "evaluate", fake)
    confirmed = m.confirm([], screen, 3, 1.0, 0.1, 3)
    assert [(c["variant"], c["z"]) for c in confirmed] == [("a", 1.0), ("a", 1.1), ("b", 1.1)]
    assert (m.choose(confirmed)["variant"], m.choose(confirmed)["z"]) == ("b", 1.1)


def test_shipped_choice_is_the_products_setting():
    import json

    import carbonflow.carbon.windows as windows

    doc = json.loads((ROOT / "benchmarks" / "results" / "start_guard_choice.json").read_text())
    chosen = doc["chosen"]
    assert chosen["share_worse_by_1pct_max"] <= 0.10
    assert chosen["z"] == windows.START_GUARD_Z
    assert m_variant(chosen["variant"]) == (windows.NOWCAST, windows.NOWCAST_GUARD)


def m_variant(name: str) -> tuple[bool, bool]:
    return _load().VARIANTS[name]
