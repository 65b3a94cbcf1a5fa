"""Deliberately broken carbonflow for the fault benchmark's mutation tests (never used otherwise).

A process started with this folder on ``PYTHONPATH`` and ``CARBONFLOW_FAULT_MUTATION`` set runs carbonflow with
one guarantee broken, so that a test can show the benchmark's counter for it rises above 0:

* ``lease_always_free`` — ``acquire_gpus`` always succeeds at once, without a lock (GPUs can be double-booked);
* ``restore_noop`` — restoring a crashed run's journal does nothing (``restore_from_journal``,
  ``_repair_entry``, ``_repair_v1_journals``): a GPU a SIGKILLed wrapper lowered stays lowered;
* ``clear_number_ignored`` — a run's idempotency key ignores the DAG run's clear number: a cleared DAG run
  finds the run of the one before and trains nothing.

The first two are applied when a ``python -m carbonflow...`` process starts (the wrapper, the restore command):
its module is imported under its own name, so the broken function is the one it calls. The last one at once
(the cleared DAG run is a script that imports carbonflow later).
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from pathlib import Path

MUTATION_ENV = "CARBONFLOW_FAULT_MUTATION"


def _lease_always_free() -> None:
    from carbonflow.energy import lease

    def acquire_always(candidates, count, *, wait_s=0.0, directory=None, group=None):  # type: ignore[no-untyped-def]
        return lease.GpuLeaseSet(list(candidates)[:count], Path(directory or "/nonexistent"))

    lease.acquire_gpus = acquire_always


def _restore_noop() -> None:
    from carbonflow.energy import power_limit

    power_limit.restore_from_journal = lambda path, devices=None, retries=3, retry_delay_s=0.2: {}
    power_limit._repair_entry = lambda dev, entry, retries, retry_delay_s: "restore skipped (mutation)"
    power_limit._repair_v1_journals = lambda directory, devices, retries, retry_delay_s: []


def _clear_number_ignored() -> None:
    from carbonflow.tracking import spool

    original = spool.run_idempotency_key
    spool.run_idempotency_key = lambda dag_id, run_id, clear_number, *rest, **kw: original(dag_id, run_id, 0,
                                                                                           *rest, **kw)  # fmt: skip


MUTATIONS = {"lease_always_free": _lease_always_free, "restore_noop": _restore_noop,
             "clear_number_ignored": _clear_number_ignored}  # fmt: skip
AT_ONCE = {"clear_number_ignored"}


def _install(name: str) -> None:
    if name not in MUTATIONS:
        raise SystemExit(f"{MUTATION_ENV}={name!r} is not allowed; give one of {', '.join(sorted(MUTATIONS))}")
    original = runpy._run_module_as_main  # type: ignore[attr-defined]

    def run_module_as_main(mod_name: str, alter_argv: bool = True):  # type: ignore[no-untyped-def]
        if not mod_name.startswith("carbonflow"):
            return original(mod_name, alter_argv)
        MUTATIONS[name]()
        if mod_name == "carbonflow.energy.power_limit":  # run the imported (broken) module, not a fresh copy
            module = importlib.import_module(mod_name)
            raise SystemExit(module.main(sys.argv[1:]))
        return original(mod_name, alter_argv)

    runpy._run_module_as_main = run_module_as_main  # type: ignore[attr-defined]


if os.environ.get(MUTATION_ENV) in AT_ONCE:
    MUTATIONS[os.environ[MUTATION_ENV]]()
elif os.environ.get(MUTATION_ENV):
    _install(os.environ[MUTATION_ENV])
