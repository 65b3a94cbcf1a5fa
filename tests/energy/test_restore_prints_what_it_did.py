"""Issue 25 finding: ``python -m carbonflow.energy.power_limit restore`` printed ``{}``. It now prints what it did,
one line per GPU (restored from X W to Y W, or nothing to restore); its exit status is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from carbonflow.energy.nvml import nvml_devices
from carbonflow.energy.power_limit import gpu_journal_path, main, restore_report_lines


def _forged(path: Path, uuid: str, previous_w: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format_version": 2, "gpu_uuid": uuid, "previous_w": previous_w, "pid": 999999}))


def test_power_limit_restore_prints_what_it_did_not_an_empty_dict(fake_nvml, journal_dir, capsys) -> None:  # type: ignore[no-untyped-def]
    fake_nvml.setup([{"limit_mw": 150000}, {"limit_mw": 300000}])
    lowered, untouched = nvml_devices()
    _forged(gpu_journal_path(journal_dir, lowered.id), lowered.id, 300.0)
    assert main(["restore"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"GPU {lowered.id}: restored from 150 W to 300 W (journal ")
    assert lines[1] == f"GPU {untouched.id}: nothing to restore (limit 300 W)"
    assert "{}" not in "".join(lines)
    assert fake_nvml.limits_mw() == [300000, 300000]


def test_power_limit_restore_with_nothing_to_restore_says_so_per_gpu(fake_nvml, journal_dir, capsys) -> None:  # type: ignore[no-untyped-def]
    fake_nvml.setup([{"limit_mw": 250000}])
    (gpu,) = nvml_devices()
    assert main(["restore"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"GPU {gpu.id}: nothing to restore (limit 250 W)"]


def test_power_limit_restore_without_gpus_or_journals_says_nothing_to_restore() -> None:
    assert restore_report_lines({}, {}) == ["nothing to restore: no GPU found and no journal left by a crashed run"]
    assert restore_report_lines({"j.json": {"GPU-1": 250.0}}, {}) == ["GPU GPU-1: restored to 250 W (journal j.json)"]
