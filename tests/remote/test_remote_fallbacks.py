"""A host whose hl-smi cannot be started, against a real SSH server: the window's poller paints the host's
agent's device loop (over this machine's agent's one ssh session to it), whose fallback reads the
host's CPU/RAM and its nvidia-smi GPUs there, and says so in its state; nothing but the host's agent
is left running on the host after stop()."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gaudi_gui.core.devices import DeviceSample, ProcessInfo
from gaudi_gui.core.remote import Host
from gaudi_gui.services import agent_child
from gaudi_gui.services import device_poller as dp
from gaudi_gui.services.device_poller import DevicePoller
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.settings import Settings
from tests.remote.conftest import SshHost

#: nvidia-smi as the host would print it (the fields of ``core.host.NVIDIA_FIELDS``).
FAKE_NVIDIA_SMI = ("#!/bin/sh\n"
                   "echo '0, NVIDIA H100, GPU-1, 37, 1024, 81559, 41, 70.5, 700.00, 550, 0:18:00.0'\n"
                   "echo '1, NVIDIA H100, GPU-2, 5, 10, 81559, 39, [N/A], 700.00, 550, 0:2a:00.0'\n")


class Seen:
    def __init__(self, poller: DevicePoller) -> None:
        self.snapshots: list[list[DeviceSample]] = []
        self.hosts: list[DeviceSample] = []
        self.processes: list[list[ProcessInfo]] = []
        self.states: list[tuple[str, str]] = []
        poller.samples_received.connect(self.snapshots.append)
        poller.host_received.connect(self.hosts.append)
        poller.processes_received.connect(self.processes.append)
        poller.state_changed.connect(lambda s, m: self.states.append((s, m)))


@pytest.fixture
def make_poller(qtbot) -> Iterator:
    made: list[DevicePoller] = []

    def make(host: Host) -> tuple[DevicePoller, Seen, DeviceSelection]:
        store = Settings()
        store.set("devices/interval_s", 0.3)
        selection = DeviceSelection()
        poller = DevicePoller(store, selection, host=host, agent=agent_child.shared_client)
        poller.backoff_initial_s = 0.3
        poller.backoff_max_s = 0.6
        made.append(poller)
        return poller, Seen(poller), selection

    yield make
    for poller in made:
        poller.stop()


def test_host_without_hl_smi_shows_its_cpu_ram_and_nvidia_gpus(make_poller, qtbot, ssh_host: SshHost,
                                                                tmp_path: Path) -> None:
    remote_bin = tmp_path / "remote-bin"  # the host's PATH (tests/remote/conftest.py)
    (remote_bin / "hl-smi").unlink()
    nvidia = remote_bin / "nvidia-smi"
    nvidia.write_text(FAKE_NVIDIA_SMI)
    nvidia.chmod(0o755)
    poller, seen, selection = make_poller(Host.parse(ssh_host.dest))
    poller.start()
    qtbot.waitUntil(lambda: poller.state == dp.STATE_ABSENT and len(seen.snapshots) >= 2
                    and len(seen.hosts) >= 2, timeout=60000)
    # What the host's agent said: its hl-smi could not be started there, and what stands in.
    assert "hl-smi comes with Intel Gaudi's driver package" in poller.message
    assert poller.command.endswith(f"(on {ssh_host.dest})")
    assert not [s for s, _m in seen.states if s in (dp.STATE_FAILED, dp.STATE_UNREACHABLE)]
    snap = seen.snapshots[-1]
    assert [(s.kind, s.index, s.name) for s in snap] == [("cuda", 0, "NVIDIA H100"),
                                                         ("cuda", 1, "NVIDIA H100")]
    assert snap[0].utilization == 37 and snap[0].memory_total_mib == 81559 and snap[1].power_w is None
    assert poller.source == "nvidia-smi" and selection.kind == "cuda" and selection.available == [0, 1]
    host = seen.hosts[-1]
    assert host.kind == "host" and host.utilization is not None and 0 <= host.utilization <= 100
    assert host.memory_total_mib and host.memory_used_mib and "CPUs" in (host.name or "")
    assert poller.history("host:0", "memory_used_mib")[0].size >= 2
    assert poller.history("cuda:1", "utilization")[0].size >= 2

    poller.stop()
    assert ssh_host.wait_no_processes(20, but_agent=True) == []  # the host's agent stays


def test_broken_hl_smi_path_of_a_host_reads_the_host(make_poller, qtbot, ssh_host: SshHost) -> None:
    """The host's hl-smi path cannot be run: a failure of that setting, said and retried, while the
    host's CPU and RAM are read there meanwhile."""
    poller, seen, selection = make_poller(Host.parse(ssh_host.dest, "", "/nonexistent/hl-smi"))
    poller.start()
    qtbot.waitUntil(lambda: poller.state == dp.STATE_FAILED and len(seen.hosts) >= 2, timeout=60000)
    assert "/nonexistent/hl-smi" in poller.message
    assert "hl-smi path" in poller.message and "retrying" in poller.message
    assert seen.snapshots == [] and poller.source == "host" and selection.kind == "cpu"
    host = seen.hosts[-1]
    assert host.kind == "host" and host.memory_total_mib and "CPUs" in (host.name or "")

    poller.stop()
    assert poller.state == dp.STATE_STOPPED
    assert ssh_host.wait_no_processes(20, but_agent=True) == []  # the host's agent stays


def test_sample_from_dict_round_trip_and_checks() -> None:
    card = DeviceSample(kind="hpu", index=3, name="HL-225", module_id=5, utilization=41.0,
                        memory_used_mib=10.0, memory_total_mib=98304.0, timestamp=12.5,
                        processes=[ProcessInfo(3, 77, "python", 512.0, "C", "alice", "python train.py")])
    assert DeviceSample.from_dict(card.to_dict()) == card
    host = DeviceSample(kind="host", index=0, utilization=3.0, memory_total_mib=1024.0)
    assert DeviceSample.from_dict(host.to_dict()) == host
    assert DeviceSample.from_dict({"kind": "cuda", "index": 1}).utilization is None  # missing: unknown
    for bad in ({"kind": "tpu", "index": 0}, {"kind": "hpu", "index": "0"}, {"kind": "hpu", "index": True},
                {"kind": "hpu", "index": 0, "utilization": "high"}, {"kind": "hpu", "index": 0, "name": 5},
                {"kind": "hpu", "index": 0, "processes": {}}, {"kind": "hpu", "index": 0, "processes": [1]},
                [1, 2]):
        with pytest.raises(ValueError):
            DeviceSample.from_dict(bad)  # type: ignore[arg-type]
