"""Fixtures for carbonflow.energy tests: a faithful fake pynvml with state in a JSON file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

FAKE_DIR = Path(__file__).parent / "fake_pynvml"


def load_fake_pynvml() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeNvml:
    """Handle on the fake driver state used by one test."""

    def __init__(self, module: ModuleType, path: Path) -> None:
        self.module = module
        self.path = path

    def setup(self, devices: list[dict], library: str = "present") -> dict:
        return self.module.make_state(str(self.path), devices, library=library)

    def state(self) -> dict:
        return self.module.read_state(str(self.path))

    def limits_mw(self) -> list[int]:
        return [d["limit_mw"] for d in self.state()["devices"]]

    def update(self, index: int, **changes) -> None:
        self.module.update_device(str(self.path), index, **changes)


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch) -> FakeNvml:
    from carbonflow.energy import nvml

    module = load_fake_pynvml()
    path = tmp_path / "nvml_state.json"
    monkeypatch.setenv("FAKE_PYNVML_STATE", str(path))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(nvml, "_initialised", False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    yield FakeNvml(module, path)
    nvml._initialised = False


@pytest.fixture
def journal_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "journal"
    monkeypatch.setenv("CARBONFLOW_POWER_JOURNAL_DIR", str(d))
    return d


@pytest.fixture(autouse=True)
def gpu_lease_dir(tmp_path, monkeypatch) -> Path:
    """Each test its own node-wide lease directory (a node's GPUs are leased in one place)."""
    d = tmp_path / "gpu-leases"
    monkeypatch.setenv("CARBONFLOW_GPU_LEASE_DIR", str(d))
    return d
