"""Real carbonflow.domain objects for the tracking tests (the demo produces the same types)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from carbonflow.domain import (
    Config,
    DeviceEnergy,
    Forecast,
    ForecastPoint,
    JobSpec,
    Plan,
    PlanAlternative,
    Profile,
    ProfilePoint,
    RunResult,
)

T0 = datetime(2026, 11, 20, 22, 0, tzinfo=UTC)
POWER_LIMITS_W = (150.0, 200.0, 250.0)


def job_spec(name: str = "digits", **kw) -> JobSpec:
    base = dict(name=name, workload="digits_cnn", epochs=3, region="GB", min_accuracy=0.9, code_version="7")
    base.update(kw)
    return JobSpec(**base)


def profile(
    job: str = "digits",
    *,
    measured_at: datetime = T0,
    device_model: str = "NVIDIA A40",
    code_version="7",
    label="measured",
) -> Profile:
    points = []
    for i, pl in enumerate(POWER_LIMITS_W):
        tput = 900.0 + 150.0 * i
        power = pl * 0.9
        points.append(
            ProfilePoint(
                config=Config(containers=1, power_limit_w=pl, batch_size=64),
                throughput_samples_per_s=tput,
                power_per_device_w={"GPU-0": power},
                energy_per_sample_j=power / tput,
                duration_s=4.0 + i,
                samples=3000,
                label=label,
            )
        )
    return Profile(
        job=job,
        device_model=device_model,
        device_kind="gpu",
        label=label,
        code_version=code_version,
        measured_at=measured_at,
        default_power_limit_w=300.0,
        max_power_w=300.0,
        samples_per_epoch=1797,
        points=points,
    )


def forecast(start: datetime = T0, hours: int = 12, *, replay: bool = True) -> Forecast:
    pts = [
        ForecastPoint(
            start=start + timedelta(minutes=30 * i),
            length_s=1800,
            gco2_per_kwh=200.0 - 8.0 * i if i < 16 else 72.0 + 5 * (i - 16),
        )
        for i in range(hours * 2)
    ]
    return Forecast(
        region="GB",
        provider="neso-replay",
        signal_kind="average-direct",
        issued_at=start,
        points=pts,
        replay=replay,
        notes=["replayed from shipped data"],
    )


def plan(
    job: str = "digits",
    *,
    start: datetime | None = None,
    pl: float = 200.0,
    predicted_emissions_g: float = 3.0,
    colocated_with: list[str] | None = None,
) -> Plan:
    start = start or T0 + timedelta(hours=6)
    alts = []
    for i, p in enumerate(POWER_LIMITS_W):
        for h in (0, 6):
            alts.append(
                PlanAlternative(
                    config=Config(containers=1, power_limit_w=p, batch_size=64),
                    start=T0 + timedelta(hours=h),
                    predicted_duration_s=600.0 - 60 * i,
                    predicted_energy_j=60000.0 + 10000 * i,
                    predicted_emissions_g=(4.0 + i) * (1.0 if h == 0 else 0.6),
                    cost=(4.0 + i) * (1.0 if h == 0 else 0.6),
                )
            )
    baseline = PlanAlternative(
        config=Config(containers=1, power_limit_w=None, batch_size=64),
        start=T0,
        predicted_duration_s=420.0,
        predicted_energy_j=95000.0,
        predicted_emissions_g=5.5,
        cost=5.5,
    )
    return Plan(
        job=job,
        config=Config(containers=1, power_limit_w=pl, batch_size=64),
        start=start,
        finish_by=T0 + timedelta(hours=10),
        predicted_duration_s=540.0,
        predicted_energy_j=70000.0,
        predicted_emissions_g=predicted_emissions_g,
        objective="carbon",
        region="GB",
        forecast_provider="neso-replay",
        signal_kind="average-direct",
        replay=True,
        baseline=baseline,
        alternatives=alts,
        colocated_with=colocated_with or [],
        reason="lowest-carbon window 04:00-04:10 at 200 W",
    )


def result(
    job: str = "digits",
    *,
    started_at: datetime | None = None,
    duration_s: float = 560.0,
    energy_gpu_j: float = 65000.0,
    energy_cpu_j: float = 7000.0,
    emissions_g: float = 2.8,
    accuracy: float | None = 0.95,
    pl: float = 200.0,
    exit_code: int = 0,
) -> RunResult:
    started_at = started_at or T0 + timedelta(hours=6, minutes=1)
    total = energy_gpu_j + energy_cpu_j
    devices = [
        DeviceEnergy(
            device_id="GPU-0aa1",
            device_model="NVIDIA A40",
            kind="gpu",
            energy_j=energy_gpu_j,
            label="measured",
            power_limit_w=pl,
        ),
        DeviceEnergy(device_id="cpu0", device_model="Intel Xeon", kind="cpu", energy_j=energy_cpu_j, label="estimated"),
    ]
    return RunResult(
        job=job,
        config=Config(containers=1, power_limit_w=pl, batch_size=64),
        started_at=started_at,
        ended_at=started_at + timedelta(seconds=duration_s),
        duration_s=duration_s,
        devices=devices,
        energy_gpu_j=energy_gpu_j,
        energy_cpu_j=energy_cpu_j,
        energy_total_j=total,
        energy_labels=["measured", "estimated"],
        emissions_g=emissions_g,
        carbon_intensity_mean_gco2_per_kwh=emissions_g / (total / 3.6e6),
        samples=5391,
        throughput_samples_per_s=5391 / duration_s,
        metrics={} if accuracy is None else {"test_accuracy": accuracy},
        exit_code=exit_code,
        emissions_run_now_default_g=5.0,
        saving_g=5.0 - emissions_g,
        saving_fraction=(5.0 - emissions_g) / 5.0,
        notes=["CPU energy estimated (no RAPL)"],
    )


def actual_points(start: datetime | None = None) -> list[ForecastPoint]:
    start = start or T0 + timedelta(hours=6)
    return [
        ForecastPoint(start=start + timedelta(minutes=30 * i), length_s=1800, gco2_per_kwh=150.0 + 3 * i)
        for i in range(2)
    ]
