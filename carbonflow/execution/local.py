"""Local backend: runs a plan as processes on this machine through the ``carbonflow run`` wrapper."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from carbonflow.execution.commands import training_command
from carbonflow.execution.errors import GPU_UNAVAILABLE_EXIT, GpuUnavailable, RunFailed, RunTimedOut
from carbonflow.execution.shared import SharedRequest, SharedRun
from carbonflow.execution.wrapper import WrappedRun
from carbonflow.models import JobSpec, Plan

log = logging.getLogger(__name__)


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

    The wrapper runs in its own process (as it would in a container) so that a crash of the
    training, or of the caller, cannot leave a GPU at a lowered power limit: the wrapper restores
    limits on its own exit paths, and :meth:`kill` sends it SIGTERM, which it turns into a restore.
    """

    name = "local"

    def __init__(self, workdir: Path, *, python: str = sys.executable, trace_interval_s: float = 0.5) -> None:
        self.workdir = Path(workdir)
        self.python = python
        self.trace_interval_s = trace_interval_s
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def execute(
        self,
        spec: JobSpec,
        plan: Plan,
        *,
        run_name: str = "train",
        profile_steps: int | None = None,
        warmup_steps: int = 0,
        trace: bool = True,
        timeout_s: float | None = None,
        sweep_limits_w: list[float] | None = None,
        stop_below_fraction: float | None = None,
    ) -> WrappedRun:
        """Run the plan's configuration to completion (or for a step budget when profiling)."""
        check_working_dir(spec)
        run_dir = self.workdir / run_name
        run_dir.mkdir(parents=True, exist_ok=True)
        job_path, plan_path, result_path = run_dir / "job.json", run_dir / "plan.json", run_dir / "result.json"
        job_path.write_text(spec.model_dump_json(indent=2), encoding="utf-8")
        plan_path.write_text(plan.model_dump_json(indent=2), encoding="utf-8")
        result_path.unlink(missing_ok=True)
        wrapper = [
            self.python, "-m", "carbonflow.cli", "run",
            "--job", str(job_path), "--plan", str(plan_path), "--result", str(result_path),
            "--output-dir", str(run_dir / "output"), "--warmup-steps", str(warmup_steps),
        ]  # fmt: skip
        if trace:
            wrapper += ["--trace", str(run_dir / "power_trace.csv"), "--trace-interval", str(self.trace_interval_s)]
        if profile_steps is not None:
            wrapper += ["--profile-steps", str(profile_steps)]
        if sweep_limits_w:
            wrapper += ["--sweep-limits", ",".join(f"{w:g}" for w in sweep_limits_w)]
        if stop_below_fraction is not None:
            wrapper += ["--stop-below", f"{stop_below_fraction:g}"]
        command = training_command(spec, plan.config, python=self.python)
        log_path = run_dir / "training.log"
        code = self._run([*wrapper, "--", *command], log_path, timeout_s, f"run {run_name!r} of job {spec.name!r}")
        _raise_if_no_gpu(code, log_path)
        if not result_path.exists():
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RunFailed(f"run {run_name!r} of job {spec.name!r} wrote no result (exit {code}); log tail:\n{tail}")
        run = WrappedRun.model_validate_json(result_path.read_text(encoding="utf-8"))
        if run.exit_code != 0:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            log.error("training of %s exited with %s; log tail:\n%s", spec.name, run.exit_code, tail)
        return run

    def execute_shared(
        self, request: SharedRequest, *, run_name: str = "shared", trace: bool = True, timeout_s: float | None = None
    ) -> SharedRun:
        """Run a co-located pair on one GPU through ``carbonflow run-shared``; the commands are filled in here."""
        run_dir = self.workdir / run_name
        run_dir.mkdir(parents=True, exist_ok=True)
        members = [
            m.model_copy(update={
                "command": training_command(m.job, m.plan.config, python=self.python),
                "output_dir": m.output_dir or str(run_dir / f"output-{m.job.name}"),
            })
            for m in request.members
        ]  # fmt: skip
        update: dict[str, object] = {"members": members}
        if trace:
            update.update(trace_csv=str(run_dir / "power_trace.csv"), trace_interval_s=self.trace_interval_s)
        request = request.model_copy(update=update)
        request_path, result_path = run_dir / "shared.json", run_dir / "result.json"
        request_path.write_text(request.model_dump_json(indent=2), encoding="utf-8")
        result_path.unlink(missing_ok=True)
        command = [self.python, "-m", "carbonflow.cli", "run-shared", "--request", str(request_path),
                   "--result", str(result_path)]  # fmt: skip
        names = "+".join(m.job.name for m in members)
        code = self._run(command, run_dir / "training.log", timeout_s, f"run {run_name!r} of {names}")
        _raise_if_no_gpu(code, run_dir / "training.log")
        if not result_path.exists():
            tail = (run_dir / "training.log").read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RunFailed(f"run {run_name!r} of {names} wrote no result (exit {code}); log tail:\n{tail}")
        return SharedRun.model_validate_json(result_path.read_text(encoding="utf-8"))

    def _run(self, command: list[str], log_path: Path, timeout_s: float | None, what: str) -> int:
        """Start the wrapper, wait for it (killing it at the timeout); returns its exit code."""
        with log_path.open("wb") as log_file, self._lock:
            self._process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            return self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RunTimedOut(
                f"{what} exceeded its timeout of {timeout_s:g} s (stopped; power limits restored)"
            ) from None
        finally:
            with self._lock:
                self._process = None

    def kill(self) -> None:
        """Stop a running wrapper: SIGTERM, which makes it stop the training and restore power limits."""
        with self._lock:
            process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.error("wrapper %s did not stop within 30 s of SIGTERM; killing it", process.pid)
            process.kill()
