"""carbonflow's power agent: one owner per GPU limit, reference-counted, in front of the FAKE zeusd on a FAKE NVML node.

The agent (:mod:`carbonflow.energy.power_agent`) and the client are the real code; zeusd and NVML are the fakes
(``tests/fakes/fake_zeusd.py``, ``tests/energy/fake_pynvml``), acting on the same driver state.
"""

from __future__ import annotations

import json

import pytest

from carbonflow.energy.errors import EnergyError
from carbonflow.energy.lease import GpuLeaseSet
from carbonflow.energy.nvml import nvml_devices
from carbonflow.energy.power_agent import PowerAgent, serve_power_agent
from carbonflow.energy.power_limit import applied_power_limit, gpu_journal_path, restore_from_journal
from carbonflow.energy.zeusd import HOLDERS_GROUP, ZeusdClient, ZeusdError
from tests.fakes.fake_zeusd import serve_fake_zeusd

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def agent_node(fake_nvml, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A 2-GPU node at 300 W: the fake zeusd on its inner socket, the real agent on the pods' socket."""
    fake_nvml.setup([{}, {}])
    inner, outer, state = tmp_path / "inner.sock", tmp_path / "zeusd.sock", tmp_path / "agent" / "holders.json"
    with serve_fake_zeusd(fake_nvml.path, inner, mode=0o600) as zeusd, serve_power_agent(outer, inner, state) as agent:
        monkeypatch.setenv("ZEUSD_SOCK_PATH", str(outer))
        yield fake_nvml, zeusd, agent, outer


def _client(socket, holder: str) -> ZeusdClient:  # type: ignore[no-untyped-def]
    return ZeusdClient(str(socket), holder=holder)


def test_the_agent_counts_holders_per_gpu_and_restores_the_original_only_when_none_remains(agent_node) -> None:  # type: ignore[no-untyped-def]
    fake_nvml, zeusd, agent, sock = agent_node
    a, b = _client(sock, "ml/pod-a"), _client(sock, "ml/pod-b")
    assert a.counts_holders() and HOLDERS_GROUP in a.discover()["enabled_api_groups"]
    a.set_power_limit_w([1], 175)
    b.set_power_limit_w([1], 200)  # B reads 175 W, lowered by A: what it would have "put back" before
    assert fake_nvml.limits_mw() == [300000, 200000]
    assert agent.gpus == {"1": {"original_mw": 300000, "holders": {"ml/pod-a": 175000, "ml/pod-b": 200000}}}
    assert a.release_power_limit_w([1]) == {1: 200.0}, "B still holds it: B's limit stays"
    assert fake_nvml.limits_mw() == [300000, 200000]
    assert a.release_power_limit_w([1]) == {1: 200.0}, "releasing twice changes nothing"
    assert b.release_power_limit_w([1]) == {1: 300.0}
    assert fake_nvml.limits_mw() == [300000, 300000] and agent.gpus == {}
    assert all("holder" not in path for _, path in zeusd.requests), "zeusd is spoken to in its own API"


def test_a_write_without_a_holder_on_a_held_gpu_is_refused(agent_node) -> None:  # type: ignore[no-untyped-def]
    fake_nvml, _, _, sock = agent_node
    _client(sock, "ml/pod-a").set_power_limit_w([0], 150)
    anonymous = _client(sock, "x")
    anonymous._counts_holders = False  # a plain zeusd client (no holder): it would bypass the count
    with pytest.raises(ZeusdError, match=r"HTTP 409.*held by carbonflow runs"):
        anonymous.set_power_limit_w([0], 250)
    anonymous.set_power_limit_w([1], 250)  # an unheld GPU: passed on to zeusd
    assert fake_nvml.limits_mw() == [150000, 250000]


def test_a_restarted_agent_still_knows_the_original(agent_node, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fake_nvml, _, agent, sock = agent_node
    _client(sock, "ml/pod-a").set_power_limit_w([0], 150)
    restarted = PowerAgent(agent.zeusd, agent.state_path)
    assert restarted.release("ml/pod-a") == {0: {"power_limit_mw": 300000, "holders": 0}}
    assert fake_nvml.limits_mw() == [300000, 300000]
    agent.state_path.write_text("{not json")
    with pytest.raises(EnergyError, match=r"power agent state .* is unreadable"):
        PowerAgent(agent.zeusd, agent.state_path)


def test_two_wrappers_on_one_gpu_through_the_agent_leave_it_at_the_original_in_any_order(
    agent_node, journal_dir
) -> None:  # type: ignore[no-untyped-def]
    """Finding (the unit behind the Kubernetes one): the second holder read the first's lowered limit and, ending
    last, put that back. Through the agent each wrapper releases its hold instead."""
    fake_nvml, _, agent, sock = agent_node
    first = nvml_devices(all_devices=True, zeusd=_client(sock, "ml/pod-a"))[:1]
    second = nvml_devices(all_devices=True, zeusd=_client(sock, "ml/pod-b"))[:1]
    uuid = first[0].id
    time_sliced = GpuLeaseSet([], journal_dir)  # two pods' containers: each its own lease dir, one shared GPU
    with applied_power_limit(first, 175, journal_dir=journal_dir / "a", install_signal_handlers=False,
                             lease=time_sliced):  # fmt: skip
        journal = json.loads(gpu_journal_path(journal_dir / "a", uuid).read_text())
        assert journal["holder"] == "ml/pod-a"
        with applied_power_limit(second, 200, journal_dir=journal_dir / "b", install_signal_handlers=False,
                                 lease=time_sliced) as outcome:  # fmt: skip
            assert outcome.previous_w == {uuid: 175.0}, "it reads the first's lowered limit"
            assert fake_nvml.limits_mw()[0] == 200000
        assert fake_nvml.limits_mw()[0] == 175000, "the first still holds it: its own limit again"
    assert fake_nvml.limits_mw() == [300000, 300000] and agent.gpus == {}


def test_the_restore_of_a_dead_holders_journal_releases_that_holder_only(agent_node, journal_dir) -> None:  # type: ignore[no-untyped-def]
    fake_nvml, _, agent, sock = agent_node
    _client(sock, "ml/dead").set_power_limit_w([0], 150)
    _client(sock, "ml/alive").set_power_limit_w([0], 225)
    (gpu, _) = nvml_devices(all_devices=True, zeusd=_client(sock, "ml/restore-pod"))
    path = gpu_journal_path(journal_dir, gpu.id)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format_version": 2, "gpu_uuid": gpu.id, "previous_w": 300.0, "pid": 1,
                                "holder": "ml/dead"}))  # fmt: skip
    assert restore_from_journal(path, [gpu]) == {gpu.id: 225.0}, "the living holder's limit"
    assert list(agent.gpus["0"]["holders"]) == ["ml/alive"] and not path.exists()
    assert fake_nvml.limits_mw() == [225000, 300000]


def test_a_hold_zeusd_refuses_is_not_counted(agent_node) -> None:  # type: ignore[no-untyped-def]
    fake_nvml, _, agent, sock = agent_node
    with pytest.raises(ValueError, match="HTTP 400"):
        _client(sock, "ml/pod-a").set_power_limit_w([0], 999)  # above the GPU's maximum: zeusd refuses
    assert agent.gpus == {} and fake_nvml.limits_mw() == [300000, 300000]
