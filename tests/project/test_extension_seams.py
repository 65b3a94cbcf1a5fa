"""Extension seams: a new carbon provider, GPU vendor or execution backend is one new file and one registration line.

Each test registers a toy part (here, in the test file: nothing fake ships in the product) and drives it through
the public entry point that a user's DAG reaches: ``default_chain`` for a provider, discovery and the wrapper's
pinning for a GPU vendor, ``make_backend`` and the run session for a backend. docs/architecture.md ("Extending
carbonflow") shows the same three.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from carbonflow.carbon.base import DEFAULT_HORIZON_S, NotConfigured
from carbonflow.carbon.chain import default_chain
from carbonflow.carbon.credentials import connection_types, credentials_from_connection
from carbonflow.carbon.providers import ConnectionType, register_provider, unregister_provider
from carbonflow.domain import Config, Forecast, ForecastPoint, JobSpec, Plan, SimulatedGpuSpec
from carbonflow.energy.device import Device
from carbonflow.energy.discovery import discover_devices
from carbonflow.energy.vendors import register_gpu_vendor, unregister_gpu_vendor
from carbonflow.execution.backend import (
    Backend,
    RunHandle,
    RunOptions,
    RunStatus,
    make_backend,
    register_backend,
    run_options,
    run_to_completion,
    unregister_backend,
    wait,
)
from carbonflow.execution.errors import ExecutionError
from carbonflow.execution.local import LocalBackend

NOW = datetime(2026, 11, 26, 18, 0, tzinfo=UTC)

# ---------------------------------------------------------------- a carbon provider


class ToyProvider:
    """A toy provider: a flat 123 gCO2/kWh everywhere, after checking its token (``zone_key = "grid"``: it takes
    the grid zone, so it needs no column in regions.csv)."""

    name = "toy"
    zone_key = "grid"
    signal_kind = "average-direct"

    def __init__(self, token: str | None) -> None:
        self.token = token

    @classmethod
    def from_credentials(cls, credentials: Mapping[str, Any], settings: Any) -> ToyProvider:
        return cls(credentials.get("token"))

    def secrets(self) -> list[str]:
        return [self.token] if self.token else []

    def forecast(self, region: str, now: datetime, horizon_s: float = DEFAULT_HORIZON_S) -> Forecast:
        if not self.token:
            raise NotConfigured("toy: no token")
        points = [ForecastPoint(start=now + timedelta(hours=h), length_s=3600, gco2_per_kwh=123.0) for h in range(48)]
        return Forecast(region=region, provider=self.name, signal_kind="average-direct", issued_at=now, points=points)


@pytest.fixture
def toy_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("CARBONFLOW_ELECTRICITYMAPS_TOKEN", "CARBONFLOW_WATTTIME_USERNAME", "CARBONFLOW_WATTTIME_PASSWORD",
                "CARBONFLOW_CARBON_AWARE_SDK_URL", "TOY_TOKEN"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    # The one registration line (in the provider's own module it is a decorator on the class):
    register_provider(
        "toy",
        env={"token": "TOY_TOKEN"},
        connection=ConnectionType(
            conn_type="carbonflow_toy", label="Toy", fields={"password": "token"}, from_fields={"password": "token"}
        ),
    )(ToyProvider)
    yield
    unregister_provider("toy")


def test_a_registered_provider_answers_through_the_default_chain(toy_provider: None) -> None:
    chain = default_chain(credentials={"toy": {"token": "toy-secret-1"}})
    forecast = chain.forecast("DE", NOW, NOW + timedelta(hours=6))
    assert forecast.provider == "toy" and forecast.points[0].gco2_per_kwh == 123.0
    assert forecast.notes[0] == "decided by toy for DE (zone DE)"
    assert "skipped electricitymaps" in " ".join(forecast.notes)  # the built-in ones were asked first, in order


def test_a_registered_provider_gets_its_credentials_from_env_and_its_connection_type(
    toy_provider: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOY_TOKEN", "from-env-1")
    assert default_chain().forecast("DE", NOW, NOW + timedelta(hours=6)).provider == "toy"
    assert connection_types()["carbonflow_toy"]["provider"] == "toy"
    assert credentials_from_connection("carbonflow_toy", password="k-123") == ("toy", {"token": "k-123"})
    chain = default_chain(order={"*": ["toy", "static"]})  # chain orders know the new key
    assert chain.forecast("DE", NOW, NOW + timedelta(hours=6)).provider == "toy"


def test_a_registered_providers_airflow_connection_reaches_the_chain_through_the_operators(
    toy_provider: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No line in carbonflow/operators: the provider's connection type gets a hook (form fields, Airflow's provider
    metadata) and an Airflow connection of that type becomes the chain's credentials, as an operator reads them."""
    import importlib
    import json

    from carbonflow.operators.common import carbon_source
    from carbonflow.operators.hooks import hook_classes, provider_credentials
    from carbonflow.operators.provider import get_provider_info

    listed = {t["connection-type"]: t["hook-class-name"] for t in get_provider_info()["connection-types"]}
    module, _, name = listed["carbonflow_toy"].rpartition(".")
    assert module == "carbonflow.operators.hooks" and name == hook_classes()["carbonflow_toy"].__name__ == "ToyHook"
    hook = getattr(importlib.import_module(module), name)  # as Airflow imports it by its path
    assert hook.conn_type == "carbonflow_toy" and hook.provider == "toy"
    assert "password" not in hook.get_ui_field_behaviour()["hidden_fields"]
    monkeypatch.setenv("AIRFLOW_CONN_CARBONFLOW_TOY", json.dumps({"conn_type": "carbonflow_toy", "password": "k-9"}))
    assert provider_credentials()["toy"] == {"token": "k-9"}
    monkeypatch.setenv("AIRFLOW_CONN_MY_TOY", json.dumps({"conn_type": "carbonflow_toy", "password": "k-10"}))
    assert provider_credentials({"toy": "my_toy"})["toy"] == {"token": "k-10"}
    monkeypatch.delenv("AIRFLOW_CONN_CARBONFLOW_TOY")
    source = carbon_source(replay=False, conn_ids={"toy": "my_toy"})  # as the operators build it
    assert source.forecast("DE", NOW, NOW + timedelta(hours=6)).provider == "toy"


def test_conn_ids_refuse_an_unknown_provider_and_take_either_spelling_of_a_known_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    from carbonflow.operators.hooks import provider_credentials

    with pytest.raises(ValueError, match=r"conn_ids has unknown provider keys \['toy'\]; allowed: .*watttime"):
        provider_credentials({"toy": "x"})
    monkeypatch.setenv(
        "AIRFLOW_CONN_SDK", json.dumps({"conn_type": "carbonflow_carbon_aware_sdk", "host": "http://sdk.example"})
    )
    for key in ("carbon_aware_sdk", "carbon-aware-sdk"):
        assert provider_credentials({key: "sdk"})["carbon-aware-sdk"] == {"url": "http://sdk.example"}


def test_without_the_registration_the_chain_does_not_know_it() -> None:
    with pytest.raises(ValueError, match="unknown providers"):
        default_chain(order={"*": ["toy", "static"]})


def test_a_provider_key_cannot_be_taken_twice(toy_provider: None) -> None:
    class Other(ToyProvider):
        pass

    with pytest.raises(ValueError, match="taken"):
        register_provider("toy")(Other)


# ---------------------------------------------------------------- an execution backend (a Slurm skeleton)


class SkeletonBatchBackend:
    """The skeleton of a batch-scheduler backend, such as Slurm, on the :class:`Backend` contract.

    A real one lives in its own module (``carbonflow/execution/slurm.py``) and is registered with one line,
    ``register_backend("slurm", "carbonflow.execution.slurm:SlurmBackend")``. Where it would call the
    scheduler, this skeleton hands the job to the local backend, so the test runs anywhere:

    * ``start``: submit the wrapper's command (Slurm: ``sbatch --parsable --wrap '<command>'``) and return a
      JSON handle naming the job (Slurm: the job id in ``details``);
    * ``poll``: ask the scheduler without waiting (Slurm: ``squeue -j <id>`` / ``sacct``);
    * ``collect``: read the result the wrapper wrote into the run directory (a shared file system);
    * ``cancel``: ``scancel <id>``; the wrapper restores power limits on SIGTERM;
    * ``supports_deferral = True``: a batch job outlives its caller, so its task defers on the poll trigger,
      which rebuilds the backend from ``rebuild_options()``.
    """

    name = "skeleton"
    supports_deferral = True
    supports_shared = False

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._submit = LocalBackend(workdir)  # stands in for the scheduler (sbatch/squeue/scancel)

    def start(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None) -> RunHandle:
        inner = self._submit.start(spec, plan, options)
        return RunHandle(backend=self.name, run_id=inner.run_id, jobs=inner.jobs,
                         details={"submitted": inner.model_dump_json()})  # fmt: skip

    def start_shared(self, request: Any, options: RunOptions | None = None) -> RunHandle:
        raise ExecutionError("the skeleton backend runs one job per allocation")

    def _inner(self, handle: RunHandle) -> RunHandle:
        return RunHandle.model_validate_json(handle.details["submitted"])

    def poll(self, handle: RunHandle) -> RunStatus:
        return self._submit.poll(self._inner(handle))

    def collect(self, handle: RunHandle) -> Any:
        return self._submit.collect(self._inner(handle))

    def cancel(self, handle: RunHandle) -> None:
        self._submit.cancel(self._inner(handle))

    def execute(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None, **fields: Any) -> Any:
        return run_to_completion(self, spec, plan, run_options(options, fields))

    def rebuild_options(self) -> dict[str, Any]:
        return {}

    def connection(self) -> dict[str, Any]:
        return {}

    def kill(self) -> None:
        return None


PROGRESS = (
    "import json, os, sys, time\n"
    "for step in range(1, int(sys.argv[1]) + 1):\n"
    "    time.sleep(0.02)\n"
    "    with open(os.environ['CARBONFLOW_PROGRESS_FILE'], 'a') as f:\n"
    "        f.write(json.dumps({'step': step, 'samples': 8 * step}) + '\\n')\n"
)


def _job(tmp_path: Path, steps: int = 10) -> tuple[JobSpec, Plan]:
    import sys

    script = tmp_path / "train.py"
    script.write_text(PROGRESS)
    spec = JobSpec(name="skeleton-job", command=[sys.executable, str(script), str(steps)], steps=steps, region="GB",
                   device_kind="cpu")  # fmt: skip
    plan = Plan(job="skeleton-job", config=Config(), start=datetime.now(UTC), predicted_duration_s=1,
                predicted_energy_j=1, predicted_emissions_g=1, region="GB", forecast_provider="t",
                reason="skeleton")  # fmt: skip
    return spec, plan


@pytest.fixture
def skeleton_backend() -> Iterator[None]:
    register_backend("skeleton", SkeletonBatchBackend)  # the one registration line
    yield
    unregister_backend("skeleton")


def test_a_registered_backend_is_built_by_make_backend_and_meets_the_contract(
    skeleton_backend: None, tmp_path: Path
) -> None:
    backend = make_backend("skeleton", tmp_path / "runs")
    assert isinstance(backend, SkeletonBatchBackend) and isinstance(backend, Backend)
    spec, plan = _job(tmp_path)
    handle = RunHandle.model_validate_json(backend.start(spec, plan, RunOptions(trace=False)).model_dump_json())
    assert handle.backend == "skeleton"
    assert wait(make_backend("skeleton", tmp_path / "runs"), handle, timeout_s=120).state == "finished"
    run = backend.collect(handle)
    assert run.exit_code == 0 and run.steps == 10


def test_the_run_session_drives_a_registered_backend_through_start_poll_collect(
    skeleton_backend: None, tmp_path: Path
) -> None:
    from carbonflow.session import CarbonSource, RunSession, SessionClock, WaitState
    from carbonflow.session.state import GroupMember

    spec, plan = _job(tmp_path)
    session = RunSession(source=CarbonSource(replay=False), workdir=tmp_path / "work", backend="skeleton",
                         tracking_uri=(tmp_path / "mlruns").as_uri())  # fmt: skip
    forecast = ToyProvider("t").forecast("GB", plan.start - timedelta(hours=1))  # accounts the run's emissions
    state = WaitState(members=[GroupMember(job=spec, plan=plan)], first_now=plan.start, forecast=forecast)
    handles = session.start_deferred(state)  # start: a backend that supports deferral
    assert handles is not None and len(handles) == 1
    assert session.backend_options() == {}  # what the poll trigger rebuilds it from
    backend = make_backend("skeleton", tmp_path / "work")
    assert wait(backend, handles[0], timeout_s=120).state == "finished"  # poll, as the trigger does
    outcome = session.finish(state, [h.model_dump(mode="json") for h in handles], SessionClock(0.0))  # collect
    [job] = outcome.jobs
    assert job.result is not None and job.result.succeeded and not outcome.failures
    assert job.result.samples == 80 and job.result.emissions_g > 0


def test_an_unregistered_backend_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="backend='skeleton' is not allowed"):
        make_backend("skeleton", Path("unused"))


# ---------------------------------------------------------------- a GPU vendor


class ToyAmdGpu(Device):
    """A GPU of the toy vendor: a fixed 100 W draw, a counter that never moves."""

    kind = "gpu"
    label = "measured"
    vendor = "toy-amd"

    def __init__(self, index: int) -> None:
        super().__init__()
        self.id = f"GPU-toy-amd-{index}"
        self.model = "Toy MI-100"

    def energy_j(self) -> float:
        return 0.0

    def power_w(self) -> float:
        return 100.0


class ToyAmdVendor:
    """An AMD-like vendor (what amdsmi would give): two GPUs, pinned through ``HIP_VISIBLE_DEVICES``.

    ``durable = False`` here only so the test takes no machine-wide lease; a real vendor whose power limits outlive
    the process says True, and its GPUs are leased like NVIDIA's."""

    name = "toy-amd"
    visible_devices_env = "HIP_VISIBLE_DEVICES"
    durable = False
    simulated = False

    def discover(self, *, visible: str | None = None, simulated: Any = None) -> list[Device]:
        return [ToyAmdGpu(i) for i in range(2)]

    def pin(self, env: Mapping[str, str], gpus: Sequence[Device]) -> dict[str, str]:
        return {**env, self.visible_devices_env: ",".join(g.id for g in gpus)}


@pytest.fixture
def toy_vendor(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from carbonflow.energy.vendors import GpuVendorUnavailable, gpu_vendor

    def no_nvml(**_: Any) -> list[Device]:
        raise GpuVendorUnavailable("no NVIDIA GPU on this (test) host")

    monkeypatch.setattr(gpu_vendor("nvidia"), "discover", no_nvml)  # a host with the toy vendor's GPUs only
    register_gpu_vendor(ToyAmdVendor())  # the one registration line
    yield
    unregister_gpu_vendor("toy-amd")


def test_discovery_picks_a_registered_vendor_and_the_run_is_pinned_through_its_variable(toy_vendor: None) -> None:
    from carbonflow.execution.gpus import lease_run_gpus, pinned_env

    devices = discover_devices(SimulatedGpuSpec(count=1), include_cpu=False)  # hardware before simulated
    assert [d.id for d in devices] == ["GPU-toy-amd-0", "GPU-toy-amd-1"]
    gpus, lease = lease_run_gpus(devices, 1)  # what the wrapper does, then pins the training's environment
    env = pinned_env({"PATH": "/bin"}, gpus)
    assert lease is None and env == {"PATH": "/bin", "HIP_VISIBLE_DEVICES": "GPU-toy-amd-0"}
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_the_builtin_vendors_keep_their_pinning() -> None:
    from carbonflow.energy.vendors import gpu_vendor
    from carbonflow.execution.gpus import pinned_env

    nvidia, simulated = gpu_vendor("nvidia"), gpu_vendor("simulated")
    assert nvidia.visible_devices_env == "CUDA_VISIBLE_DEVICES" and simulated.visible_devices_env is None
    sims = discover_devices(SimulatedGpuSpec(count=2), include_cpu=False, prefer_simulated=True)
    assert pinned_env({"A": "1"}, sims) == {"A": "1"}  # a simulated GPU is not pinned
    fake_nvml_gpu = type("G", (), {"id": "GPU-abc", "label": "measured", "vendor": "nvidia"})()
    assert pinned_env({}, [fake_nvml_gpu]) == {"CUDA_VISIBLE_DEVICES": "GPU-abc"}


def test_a_vendor_must_meet_the_protocol_and_its_name_is_its_own() -> None:
    with pytest.raises(TypeError, match="not a GpuVendor"):
        register_gpu_vendor(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="taken"):
        register_gpu_vendor(type("N", (ToyAmdVendor,), {"name": "nvidia"})())
