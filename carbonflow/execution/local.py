"""Local backend: runs a plan as processes on this machine through the ``carbonflow run`` wrapper."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from carbonflow.contract import without_credentials
from carbonflow.domain import JobSpec, Plan
from carbonflow.execution.backend import (
    RunHandle,
    RunOptions,
    RunStatus,
    run_options,
    run_shared_to_completion,
    run_to_completion,
)
from carbonflow.execution.commands import training_command
from carbonflow.execution.errors import GPU_UNAVAILABLE_EXIT, GpuUnavailable, RunFailed
from carbonflow.execution.pair_wrapper import SharedRequest, SharedRun
from carbonflow.execution.signing import NOT_SIGNED, RESULT_KEY_ENV, ResultNotSigned, new_result_key, verified_payload
from carbonflow.execution.wrapper import WrappedRun

log = logging.getLogger(__name__)

WRAPPER_FLAGS = ("-s", "-P")
"""The wrapper's interpreter ignores the user's site-packages and never puts its working directory on
``sys.path`` (``-I`` without ``-E``: the worker's own ``PYTHONPATH``, the deployment's, still applies)."""


def _raise_if_no_gpu(code: int, log_path: Path) -> None:
    if code == GPU_UNAVAILABLE_EXIT:
        lines = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        raise GpuUnavailable(lines[-1] if lines else "no GPU could be leased")


def check_working_dir(spec: JobSpec) -> None:
    """A job's ``working_dir`` must exist on this worker before anything starts (ValueError naming it)."""
    if spec.working_dir is not None and not Path(spec.working_dir).is_dir():
        raise ValueError(f"working_dir={spec.working_dir!r} of job {spec.name!r} is not a directory on this worker")


class LocalBackend:
    """Same Plan in, same measurements out, as the Kubernetes backend; one wrapper process per run.

    Implements the backend contract (:mod:`carbonflow.execution.backend`): :meth:`start` launches the
    ``carbonflow run`` wrapper and returns a handle at once, :meth:`poll`, :meth:`collect` and
    :meth:`cancel` act on it — from this process or another on the same host (the handle names the run's
    directory and the wrapper's pid). The wrapper runs in its own process (as it would in a container) so
    that a crash of the training, or of the caller, cannot leave a GPU at a lowered power limit: it leases
    its GPUs, restores limits on its own exit paths, and :meth:`cancel` sends it SIGTERM, which it turns
    into a restore. A local run is a child of the worker that started it: ``supports_deferral`` is False.
    """

    name = "local"
    supports_deferral = False
    supports_shared = True
    supports_in_run_profiling = True
    """``RunOptions.train_after_sweep`` is honoured (the wrapper sweeps inside the training and trains on)."""
    supports_energy_budget = True
    """``RunOptions.stop_above_energy_j`` is honoured (the wrapper stops the run once its energy passes it)."""

    def __init__(self, workdir: Path, *, python: str = sys.executable, trace_interval_s: float = 0.5) -> None:
        self.workdir = Path(workdir)
        self.python = python
        self.trace_interval_s = trace_interval_s
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._running: dict[str, RunHandle] = {}
        self._lock = threading.Lock()

    # --- the contract -------------------------------------------------------------------------------
    def start(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None) -> RunHandle:
        """Launch the wrapper for one job; returns at once."""
        options = options or RunOptions()
        check_working_dir(spec)
        run_dir = self._fresh_dir(options.run_name)
        job_path, plan_path = run_dir / "job.json", run_dir / "plan.json"
        _write_private(job_path, spec.model_dump_json(indent=2))  # its env may hold a declared connection
        plan_path.write_text(plan.model_dump_json(indent=2), encoding="utf-8")
        wrapper = [
            self.python, *WRAPPER_FLAGS, "-m", "carbonflow.cli", "run",
            "--job", str(job_path), "--plan", str(plan_path), "--result", str(run_dir / "result.json"),
            "--output-dir", str(run_dir / "output"), "--warmup-steps", str(options.warmup_steps),
            *self._options_args(options, run_dir), "--", *training_command(spec, plan.config, python=self.python),
        ]  # fmt: skip
        return self._launch(wrapper, run_dir, "solo", [spec.name])

    def start_shared(self, request: SharedRequest, options: RunOptions | None = None) -> RunHandle:
        """Launch ``carbonflow run-shared`` for a co-located pair on one GPU; returns at once."""
        options = options or RunOptions(run_name="shared")
        run_dir = self._fresh_dir(options.run_name)
        members = [
            m.model_copy(update={
                "command": training_command(m.job, m.plan.config, python=self.python),
                "output_dir": m.output_dir or str(run_dir / f"output-{m.job.name}"),
            })
            for m in request.members
        ]  # fmt: skip
        update: dict[str, object] = {"members": members}
        if options.trace:
            update.update(trace_csv=str(run_dir / "power_trace.csv"), trace_interval_s=self.trace_interval_s)
        request = request.model_copy(update=update)
        _write_private(run_dir / "shared.json", request.model_dump_json(indent=2))
        command = [self.python, *WRAPPER_FLAGS, "-m", "carbonflow.cli", "run-shared",
                   "--request", str(run_dir / "shared.json"), "--result", str(run_dir / "result.json")]  # fmt: skip
        return self._launch(command, run_dir, "shared", [m.job.name for m in members])

    def poll(self, handle: RunHandle) -> RunStatus:
        code = self._returncode(handle)
        if code is None:
            return RunStatus(state="running", message=f"wrapper pid {handle.details['pid']} running")
        return RunStatus(state="finished", message=f"wrapper exited {code}")

    def collect(self, handle: RunHandle) -> WrappedRun | SharedRun:
        """What the finished run measured; GpuUnavailable or RunFailed (with the log's tail) otherwise."""
        run_dir = Path(handle.details["run_dir"])
        log_path, result_path = run_dir / "training.log", run_dir / "result.json"
        code = self._returncode(handle)
        what = f"run {run_dir.name!r} of {'+'.join(handle.jobs)}"
        if not result_path.exists():  # a training that itself exits 69 has a result: it failed, it found a GPU
            _raise_if_no_gpu(code if code is not None else 0, log_path)
            raise RunFailed(f"{what} wrote no result (exit {code}); log tail:\n{_tail(log_path)}")
        payload = _verified_result(result_path, handle, f"{what} (exit {code})", log_path)
        if handle.kind == "shared":
            return SharedRun.model_validate_json(payload)
        run = WrappedRun.model_validate_json(payload)
        if run.exit_code != 0:
            log.error("training of %s exited with %s; log tail:\n%s", what, run.exit_code, _tail(log_path))
        return run

    def cancel(self, handle: RunHandle) -> None:
        """SIGTERM the wrapper (it stops the training and restores the limits); SIGKILL after 30 s."""
        pid = int(handle.details["pid"])
        if self._returncode(handle) is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while self._returncode(handle) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._returncode(handle) is None:
            log.error("wrapper %s did not stop within 30 s of SIGTERM; killing it", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def rebuild_options(self) -> dict[str, Any]:
        """Nothing beyond the name: a handle names its run's directory and pid (polled on this host only)."""
        return {}

    # --- blocking forms (a local training task waits on its worker) ------------------------------------
    def execute(self, spec: JobSpec, plan: Plan, options: RunOptions | None = None, **fields: Any) -> WrappedRun:
        """Run the plan's configuration to completion (or for a step budget when profiling)."""
        return run_to_completion(self, spec, plan, run_options(options, fields))

    def execute_shared(self, request: SharedRequest, options: RunOptions | None = None, **fields: Any) -> SharedRun:
        """Run a co-located pair on one GPU to completion."""
        return run_shared_to_completion(self, request, run_options(options, fields, run_name="shared"))

    def kill(self) -> None:
        """Cancel every run this backend started that is still going (Airflow's ``on_kill``)."""
        with self._lock:
            handles = list(self._running.values())
        for handle in handles:
            self.cancel(handle)

    # --- helpers --------------------------------------------------------------------------------------
    def _fresh_dir(self, run_name: str) -> Path:
        run_dir = self.workdir / run_name
        run_dir.mkdir(parents=True, exist_ok=True)
        run_dir.chmod(0o755)  # the wrapper's result file lives here: a training run as another user cannot write it
        (run_dir / "result.json").unlink(missing_ok=True)
        return run_dir

    def _options_args(self, options: RunOptions, run_dir: Path) -> list[str]:
        args: list[str] = []
        if options.trace:
            args += ["--trace", str(run_dir / "power_trace.csv"), "--trace-interval", str(self.trace_interval_s)]
        if options.profile_steps is not None:
            args += ["--profile-steps", str(options.profile_steps)]
        if options.sweep_limits_w:
            args += ["--sweep-limits", ",".join(f"{w:g}" for w in options.sweep_limits_w)]
        if options.stop_below_fraction is not None:
            args += ["--stop-below", f"{options.stop_below_fraction:g}"]
        if options.train_after_sweep:
            args += ["--train-after-sweep"]
        if options.stop_above_energy_j is not None:
            args += ["--stop-above-energy", repr(options.stop_above_energy_j)]
            args += ["--stop-grace", repr(options.stop_grace_s)]
        return args

    def _launch(self, command: list[str], run_dir: Path, kind: str, jobs: list[str]) -> RunHandle:
        key = new_result_key()  # the wrapper signs its result with it; only the wrapper and the handle know it
        with (run_dir / "training.log").open("wb") as log_file:
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                       env={**without_credentials(os.environ), RESULT_KEY_ENV: key})  # fmt: skip
        handle = RunHandle(
            backend=self.name, run_id=f"{run_dir.name}-{process.pid}-{uuid.uuid4().hex[:6]}", kind=kind, jobs=jobs,
            details={"run_dir": str(run_dir), "pid": str(process.pid), "host": os.uname().nodename,
                     "result_key": key},
        )  # fmt: skip
        with self._lock:
            self._processes[handle.run_id] = process
            self._running[handle.run_id] = handle
        return handle

    def _returncode(self, handle: RunHandle) -> int | None:
        """The wrapper's exit status, or None while it runs (a run started elsewhere: by its pid and result)."""
        process = self._processes.get(handle.run_id)
        if process is not None:
            code = process.poll()
            if code is not None:
                with self._lock:
                    self._running.pop(handle.run_id, None)
            return code
        if _pid_running(int(handle.details["pid"])):
            return None
        return 0 if (Path(handle.details["run_dir"]) / "result.json").exists() else -1


def _pid_running(pid: int) -> bool:
    """Whether ``pid`` is a living process (a zombie — exited, not yet reaped by its parent — is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _verified_result(result_path: Path, handle: RunHandle, what: str, log_path: Path) -> str:
    """The result file's JSON, if this run's wrapper signed it with the handle's key; RunFailed otherwise.

    The training shares the wrapper's stdout and may share its files: an unsigned or wrongly signed result is
    the training's, never the run's (the next wrapper on the GPU replays a dead wrapper's restore journal).
    """
    key = handle.details.get("result_key")
    if not key:
        raise RunFailed(f"{what}: the handle has no result_key (started by an older carbonflow?); {NOT_SIGNED}")
    try:
        return verified_payload(result_path.read_text(encoding="utf-8", errors="replace"), key)
    except ResultNotSigned as err:
        raise RunFailed(f"{what}: {err}; refused. Log tail:\n{_tail(log_path)}") from None


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (a job file's env may hold a declared secret)."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as handle:
        handle.write(text)


def _tail(log_path: Path) -> str:
    return log_path.read_text(encoding="utf-8", errors="replace")[-2000:] if log_path.exists() else "(no log)"
