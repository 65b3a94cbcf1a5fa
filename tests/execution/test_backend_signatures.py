"""Finding (issue #21): ``EnergyProfileOperator(backend="kubernetes")`` raised TypeError: the profiler passed
``sweep_limits_w`` and ``stop_below_fraction``, which ``KubernetesBackend.execute`` did not take. Every registered
backend now has exactly the :class:`~carbonflow.execution.backend.Backend` protocol's signatures, checked here."""

from __future__ import annotations

import inspect

import pytest

from carbonflow.execution.backend import BACKENDS, Backend, RunOptions, run_options
from carbonflow.execution.kubernetes import KubernetesBackend
from carbonflow.execution.local import LocalBackend

CLASSES = {"local": LocalBackend, "kubernetes": KubernetesBackend}
METHODS = ("start", "start_shared", "poll", "collect", "cancel", "execute", "rebuild_options")


def _parameters(function: object) -> list[tuple[str, object, object, object]]:
    return [(p.name, p.kind, p.default, p.annotation) for p in inspect.signature(function).parameters.values()]


def test_every_registered_backend_is_known_here() -> None:
    assert set(CLASSES) == set(BACKENDS)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_every_backends_methods_have_the_protocols_signature(name: str, method: str) -> None:
    assert _parameters(getattr(CLASSES[name], method)) == _parameters(getattr(Backend, method)), (
        f"{CLASSES[name].__name__}.{method} differs from Backend.{method}"
    )


def test_the_profilers_executor_is_the_protocols_execute() -> None:
    from carbonflow.profiling.profiler import Executor

    assert _parameters(Executor.execute) == _parameters(Backend.execute)


def test_run_options_come_as_an_object_or_as_keywords_and_unknown_ones_are_refused() -> None:
    assert run_options(None, {"sweep_limits_w": [250.0, 200.0]}).sweep_limits_w == [250.0, 200.0]
    given = RunOptions(run_name="x")
    assert run_options(given, {}) is given
    assert run_options(None, {}, run_name="shared").run_name == "shared"
    with pytest.raises(TypeError, match=r"'sweep_limit' are not allowed; use some of run_name, profile_steps"):
        run_options(None, {"sweep_limit": [1.0]})
    with pytest.raises(TypeError, match="not both"):
        run_options(given, {"trace": False})
