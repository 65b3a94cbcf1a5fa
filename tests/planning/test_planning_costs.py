"""Cost metrics (Koszczał et al., Zeus), the carbon integral and the Pareto set."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from planning_factories import NOW, make_forecast

from carbonflow.carbon.windows import held_window_means, mean_intensity_gco2_per_kwh
from carbonflow.planning.costs import (
    Reference,
    carbon_g,
    edp,
    eds,
    energy_gain_minus_time_loss_pct,
    objective_cost,
    pareto_front,
    zeus_cost,
)


def test_eds_is_one_at_the_reference_and_weighs_energy_with_k():
    assert eds(1000.0, 10.0, 2.0, 1000.0, 10.0) == pytest.approx(1.0)
    # k = 2: alpha = 1/(2 E_ref), beta = 1/(2 t_ref); 25 % less energy for 10 % more time is better.
    assert eds(750.0, 11.0, 2.0, 1000.0, 10.0) == pytest.approx(0.375 + 0.55)
    assert eds(750.0, 11.0, 1.0, 1000.0, 10.0) == pytest.approx(1.1)  # k = 1: time only
    with pytest.raises(ValueError, match=r"k=0\.5"):
        eds(1, 1, 0.5, 1, 1)


def test_gain_minus_loss_zeus_cost_and_edp():
    assert energy_gain_minus_time_loss_pct(750.0, 11.0, 1000.0, 10.0) == pytest.approx(25.0 - 10.0)
    assert zeus_cost(1000.0, 10.0, 0.5, 250.0) == pytest.approx(500.0 + 1250.0)
    assert edp(3.0, 4.0) == 12.0
    with pytest.raises(ValueError, match=r"eta=1\.5"):
        zeus_cost(1, 1, 1.5, 1)


def test_objective_cost_dispatch():
    ref = Reference(energy_j=1000.0, time_s=10.0, max_power_w=250.0)
    kw = {"energy_j": 750.0, "time_s": 11.0, "emissions_g": 3.0, "reference": ref}
    assert objective_cost("carbon", **kw) == 3.0
    assert objective_cost("energy", **kw) == 750.0
    assert objective_cost("time", **kw) == 11.0
    assert objective_cost("edp", **kw) == 8250.0
    assert objective_cost("eds:2", **kw) == pytest.approx(0.925)
    assert objective_cost("zeus:0.5", **kw) == pytest.approx(375.0 + 1375.0)
    assert objective_cost("gain", **kw) == pytest.approx(-15.0)
    with pytest.raises(ValueError, match="objective='fast'"):
        objective_cost("fast", **kw)


def test_carbon_window_mean_is_exact_over_partial_slots_and_holds_the_edges():
    forecast = make_forecast([100.0, 300.0])  # 18:00-18:30 at 100, 18:30-19:00 at 300
    # 15 min at 100 + 30 min at 300 = (15*100 + 30*300)/45
    assert float(held_window_means(forecast, NOW, 900.0, 2700.0)[0]) == pytest.approx((15 * 100 + 30 * 300) / 45)
    assert float(held_window_means(forecast, NOW, 3600.0, 3600.0)[0]) == pytest.approx(300.0)  # last value held
    assert float(held_window_means(forecast, NOW, -600.0, 0.0)[0]) == pytest.approx(100.0)  # first value held
    # 1 kW for 1 h at a mean of 200 g/kWh over 18:00-19:00 = 200 g
    assert carbon_g(1000.0, NOW, 3600.0, forecast) == pytest.approx(200.0)


def test_held_means_match_the_exact_mean_inside_the_forecast():
    values = [float(v) for v in np.linspace(50, 400, 48)]
    forecast = make_forecast(values)
    for start_min, dur_min in [(0, 60), (45, 200), (300, 777)]:
        start = NOW + timedelta(minutes=start_min)
        exact = mean_intensity_gco2_per_kwh(forecast.points, start, start + timedelta(minutes=dur_min))
        assert float(held_window_means(forecast, NOW, start_min * 60.0, dur_min * 60.0)[0]) == pytest.approx(exact)


def test_pareto_front_keeps_only_non_dominated_points():
    pts = [(1.0, 5.0, 5.0), (2.0, 4.0, 4.0), (2.0, 5.0, 5.0), (3.0, 3.0, 6.0), (1.0, 5.0, 5.0)]
    assert pareto_front(pts) == [0, 1, 3, 4]
    assert pareto_front([]) == []
