"""Finding: the zeusd socket was world-writable and mounted into every training pod, and the power journals
read-write, so any job's command could set any GPU's limit on the node or move another pod's journal.
Design: the wrapper (root in its container) starts the training as an unprivileged user without supplementary
groups (``CARBONFLOW_TRAINING_UID``); zeusd's socket is root-owned with mode 660 and the journals are root's,
so the wrapper reaches them and the user's command cannot. Shown on the fake NVML node with the fake zeusd.

Machine-dependent: dropping to another user needs root. As root (CI here) the whole design is exercised; as
another user the wrapper must refuse the setting by name, before any limit is touched. Both cases are tested."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from fakes.fake_zeusd import serve_fake_zeusd
from fakes.node import FakeNode

PROBE = """
import json, os, socket, sys, time
sock, journal_dir = sys.argv[1], sys.argv[2]
seen = {"uid": os.getuid(), "groups": os.getgroups(), "zeusd_env": os.environ.get("ZEUSD_SOCK_PATH")}
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(b"POST /gpu/set_power_limit?gpu_ids=0,1&power_limit_mw=100000&block=true HTTP/1.0\\r\\n\\r\\n")
    seen["zeusd"] = s.recv(100).decode(errors="replace")
except OSError as err:
    seen["zeusd"] = type(err).__name__
try:
    with open(os.path.join(journal_dir, "GPU-moved.json"), "w") as handle:
        handle.write("{}")
    seen["journal"] = "written"
except OSError as err:
    seen["journal"] = type(err).__name__
with open(os.environ["CARBONFLOW_PROGRESS_FILE"], "a") as progress:  # the documented file protocol
    for step in range(1, 4):
        progress.write(json.dumps({"step": step, "samples": step * 8, "t_s": time.monotonic()}) + "\\n")
with open(os.path.join(os.environ["CARBONFLOW_OUTPUT_DIR"], "probe.json"), "w") as handle:
    json.dump(seen, handle)
"""


@pytest.fixture
def shared_node():  # type: ignore[no-untyped-def]
    """A node folder other users can traverse (pytest's tmp_path is root-only), like /var/run on a host."""
    base = Path(tempfile.mkdtemp(prefix="carbonflow-node-"))
    base.chmod(0o755)
    node = FakeNode(base / "node", gpus=2)
    node.journal_dir.mkdir(parents=True, exist_ok=True)
    (base / "probe.py").write_text(PROBE)
    (base / "probe.py").chmod(0o644)
    try:
        yield node, base
    finally:
        shutil.rmtree(base, ignore_errors=True)


SYSTEM_PYTHON = "/usr/bin/python3"  # world-executable, as in a container image (the venv's lives under /root)


def _run(node: FakeNode, base: Path, sock: Path) -> tuple[int, str, dict]:
    command = [SYSTEM_PYTHON, str(base / "probe.py"), str(sock), str(node.journal_dir)]
    proc = node.wrapper("privileges", 200, command, ZEUSD_SOCK_PATH=str(sock), FAKE_NVML_UNPRIVILEGED="1",
                        CARBONFLOW_TRAINING_UID="65534")  # fmt: skip
    code, stderr = node.finish(proc)
    result_path = node.root / "privileges" / "result.json"
    probe = {}
    if result_path.exists():
        out = Path(json.loads(result_path.read_text())["output_dir"]) / "probe.json"
        probe = json.loads(out.read_text()) if out.exists() else {}
    return code, stderr, probe


@pytest.mark.skipif(os.geteuid() != 0, reason="covered by the non-root test below (dropping users needs root)")
def test_the_users_command_cannot_reach_zeusd_or_the_journals_while_the_wrapper_sets_the_limit(shared_node) -> None:
    node, base = shared_node
    sock = base / "zeusd.sock"
    with serve_fake_zeusd(node.state_path, sock, mode=0o660) as zeusd:
        code, stderr, probe = _run(node, base, sock)
        wrapper_posts = [r for r in zeusd.requests if r[0] == "POST"]
    assert code == 0, stderr
    assert probe["uid"] == 65534 and probe["groups"] == [] and probe["zeusd_env"] is None
    assert probe["zeusd"] == "PermissionError"  # the socket is root's, mode 660
    assert probe["journal"] == "PermissionError"
    assert not list(node.journal_dir.glob("GPU-moved.json"))
    assert wrapper_posts, "the wrapper itself set the limit through zeusd"
    assert node.lowered() == 0  # and put it back


def test_without_root_the_setting_is_refused_by_name_before_any_limit_changes(shared_node) -> None:
    if os.geteuid() == 0:  # as root: run the wrapper as another user to see the refusal
        pytest.importorskip("pwd")
    node, base = shared_node
    from carbonflow.execution.gpus import training_owner

    if os.geteuid() == 0:
        os.environ["CARBONFLOW_TRAINING_UID"] = "65534"
        try:
            assert training_owner() == (65534, 65534)
            os.environ["CARBONFLOW_TRAINING_UID"] = "nobody"
            with pytest.raises(ValueError, match="CARBONFLOW_TRAINING_UID='nobody'"):
                training_owner()
        finally:
            os.environ.pop("CARBONFLOW_TRAINING_UID", None)
        return
    code, stderr, _ = _run(node, base, base / "zeusd.sock")
    assert code != 0 and "CARBONFLOW_TRAINING_UID=65534 needs the wrapper to run as root" in stderr
    assert node.lowered() == 0
