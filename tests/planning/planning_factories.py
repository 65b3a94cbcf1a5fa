"""Builders of profiles and forecasts for the planning tests (shapes as the profiler and carbon chain give them)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from carbonflow.domain import Config, Forecast, ForecastPoint, JobSpec, Profile, ProfilePoint
from carbonflow.planning import RealisedRun

NOW = datetime(2024, 3, 1, 18, 0, tzinfo=UTC)

# (power limit W, samples/s, W) per device: the shape of Zeus's V100 cifar100/shufflenetv2 b1024 rows.
V100_LIKE = [(250, 100.0, 236.0), (225, 98.0, 214.0), (200, 93.0, 188.0), (175, 84.0, 163.0), (150, 71.0, 141.0)]


def make_profile(
    rows: Sequence[tuple[float, float, float]] = V100_LIKE,
    containers: Sequence[int] = (1,),
    scaling: float = 0.9,
    job: str = "job-a",
    samples_per_epoch: int = 50_000,
    batch_sizes: Sequence[int | None] = (None,),
    bs_speed: dict[int, float] | None = None,
) -> Profile:
    points = []
    for bs in batch_sizes:
        for c in containers:
            for pl, tput, pw in rows:
                speed = tput * c * scaling ** (c - 1) * ((bs_speed or {}).get(bs, 1.0) if bs else 1.0)
                points.append(
                    ProfilePoint(
                        config=Config(containers=c, power_limit_w=pl, batch_size=bs),
                        throughput_samples_per_s=speed,
                        power_per_device_w={f"gpu{i}": pw for i in range(c)},
                        energy_per_sample_j=pw * c / speed,
                        duration_s=30.0,
                        samples=int(speed * 30),
                        label="simulated",
                    )
                )
    return Profile(
        job=job,
        device_model="V100",
        device_kind="gpu",
        label="simulated",
        default_power_limit_w=max(r[0] for r in rows),
        max_power_w=max(r[0] for r in rows),
        samples_per_epoch=samples_per_epoch,
        points=points,
        measured_at=NOW - timedelta(days=1),
    )


def make_forecast(
    values: Sequence[float], start: datetime = NOW, slot_s: float = 1800.0, region: str = "GB"
) -> Forecast:
    return Forecast(
        region=region,
        provider="test",
        signal_kind="average-direct",
        issued_at=start,
        points=[
            ForecastPoint(start=start + timedelta(seconds=slot_s * i), length_s=slot_s, gco2_per_kwh=v)
            for i, v in enumerate(values)
        ],
    )


def make_spec(name: str = "job-a", hours: float = 12.0, **kw: object) -> JobSpec:
    args: dict[str, object] = {
        "name": name,
        "workload": "digits_cnn",
        "epochs": 10,
        "region": "GB",
        "finish_by": NOW + timedelta(hours=hours),
    }
    args.update(kw)
    return JobSpec(**args)


def make_target_run(job: str, day: float, bs: int, epochs: float, energy_j: float = 1e6, **kw: object) -> RealisedRun:
    """A realised run of a target-trained job ``day`` days before NOW: ``epochs`` to its target at batch size
    ``bs``, energy as predicted, duration not recorded (the fixed-cost fit skips it)."""
    return RealisedRun(
        job=job,
        config_key=kw.pop("config_key", f"c1-pl250-b{bs}"),
        finished_at=NOW - timedelta(days=day),
        predicted_duration_s=0.0,
        realised_duration_s=0.0,
        predicted_energy_j=energy_j,
        realised_energy_j=energy_j,
        batch_size=bs,
        epochs=epochs,
        reached_target=True,
        **kw,
    )
