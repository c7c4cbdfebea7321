"""The window's DevicePoller painting the real agent's one device loop, which runs a real fake-hl-smi
child: loop mode, death and restart, hang and kill, absent program, garbage, and the host /
nvidia-smi fallback, each seen through the poller's signals and state as the views see them.

The agent is this test's own (its GAUDI_GUI_HOME), started by the poller's first ``start`` with the
test's environment (FAKE_HLSMI_*, PATH, GAUDI_GUI_DEVICES_BACKOFF_S); the rules of the loop without a
window are tests/agent/test_devices_service.py's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gaudi_gui.core import agentwire
from gaudi_gui.core.device_loop import loop_seconds
from gaudi_gui.services import agent_child
from gaudi_gui.services import device_poller as dp
from gaudi_gui.services.device_poller import DevicePoller
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.settings import Settings
from tests.agent.test_devices_service import hl_smi_loops
from tests.helpers import set_fake_hl_smi

MODULES = {0: 2, 1: 6, 2: 3, 3: 7, 4: 0, 5: 4, 6: 5, 7: 1}


class Recorder:
    def __init__(self, poller: DevicePoller) -> None:
        self.snapshots: list[list] = []
        self.states: list[tuple[str, str]] = []
        self.hosts: list = []
        self.processes: list[list] = []
        poller.samples_received.connect(self.snapshots.append)
        poller.state_changed.connect(lambda s, m: self.states.append((s, m)))
        poller.host_received.connect(self.hosts.append)
        poller.processes_received.connect(self.processes.append)


class AgentDevices:
    """The test's agent's devices service, as its ``status`` says it (one connection, opened once the
    poller started the agent)."""

    def __init__(self) -> None:
        self._conn: agentwire.Connection | None = None

    def status(self) -> dict[str, Any]:
        if self._conn is None:
            try:
                self._conn = agentwire.Connection.open(start=False, client="test")
            except agentwire.AgentError:
                return {}
        return dict(self._conn.request("status")["services"]["devices"])

    def starts(self) -> int:
        """How many hl-smi loops the agent has started."""
        return int(self.status().get("starts") or 0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@pytest.fixture
def agent_devices() -> Iterator[AgentDevices]:
    seen = AgentDevices()
    yield seen
    seen.close()


@pytest.fixture
def make_poller(qtbot, monkeypatch) -> Iterator:
    # The agent's restarts after a failure: 0.1 s, then 0.2 s (it starts with this environment).
    monkeypatch.setenv("GAUDI_GUI_DEVICES_BACKOFF_S", "0.1,0.2")
    made: list[DevicePoller] = []

    def make(**settings: object) -> tuple[DevicePoller, Recorder, DeviceSelection]:
        store = Settings()
        store.set("devices/interval_s", 0.2)
        store.set("devices/process_interval_s", 0.5)
        for key, value in settings.items():
            store.set(f"devices/{key}", value)
        selection = DeviceSelection()
        poller = DevicePoller(store, selection, agent=agent_child.shared_client)
        poller.backoff_initial_s = 0.1
        poller.backoff_max_s = 0.2
        made.append(poller)
        return poller, Recorder(poller), selection

    yield make
    for poller in made:
        poller.stop()


def test_loop_mode_streams_snapshots(fake_hl_smi: Path, make_poller, agent_devices: AgentDevices,
                                     qtbot) -> None:
    poller, rec, selection = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: len(rec.snapshots) >= 3 and bool(rec.processes), timeout=15000)
    assert agent_devices.starts() == 1  # one long-running hl-smi, not one per tick
    assert "-l 1" in poller.command and "csv,nounits" in poller.command
    snap = rec.snapshots[-1]
    assert [s.index for s in snap] == list(range(8))
    assert {s.index: s.module_id for s in snap} == MODULES
    assert all(s.generation == "Gaudi 1" and s.memory_total_mib == 32768 for s in snap)
    assert poller.state == dp.STATE_OK and poller.source == "hl-smi"
    assert selection.kind == "hpu" and selection.available == list(range(8))
    procs = rec.processes[-1]
    assert [(p.index, p.pid) for p in procs] == [(0, 10), (6, 20)]
    t, _v = poller.history("hpu:m2", "utilization")
    assert len(t) >= 3
    assert rec.hosts and rec.hosts[-1].kind == "host"


def test_unsorted_rows_are_keyed_on_index(fake_hl_smi: Path, make_poller, qtbot, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "unsorted")
    poller, rec, _ = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: len(rec.snapshots) >= 2, timeout=15000)
    snap = rec.snapshots[-1]
    assert {s.index: s.module_id for s in snap} == MODULES and len(snap) == 8


def test_death_restarts_with_backoff(fake_hl_smi: Path, make_poller, agent_devices: AgentDevices, qtbot,
                                     monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "die_after:2")
    poller, rec, _ = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: any(s == dp.STATE_FAILED for s, _m in rec.states)
                    and agent_devices.starts() >= 3, timeout=20000)
    failed = [m for s, m in rec.states if s == dp.STATE_FAILED]
    assert "exited with code 1" in failed[0] and "lost connection" in failed[0]
    assert "retrying in 0 s" in failed[0]  # the back-off of the agent's environment: 0.1 s
    qtbot.waitUntil(lambda: poller.state == dp.STATE_OK, timeout=15000)


def test_hang_is_killed_and_restarted(fake_hl_smi: Path, make_poller, agent_devices: AgentDevices, qtbot,
                                      monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "hang_after:1")
    poller, rec, _ = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: any("hung" in m for _s, m in rec.states), timeout=20000)
    qtbot.waitUntil(lambda: agent_devices.starts() >= 2, timeout=15000)
    assert rec.snapshots  # the first snapshot arrived before the hang


def test_absent_program_falls_back_to_host(make_poller, agent_devices: AgentDevices, qtbot, monkeypatch,
                                           tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    poller, rec, selection = make_poller()
    selection.set_kind("hpu", [0, 1])
    poller.start()
    qtbot.waitUntil(lambda: poller.state == dp.STATE_ABSENT and len(rec.hosts) >= 2, timeout=15000)
    assert "No such file" in poller.message and "hl-smi comes with" in poller.message
    assert poller.source == "host" and selection.kind == "cpu" and rec.snapshots == []
    assert agent_devices.starts() == 0


def test_no_hl_smi_beside_accel_nodes_is_a_failure(make_poller, qtbot, monkeypatch, tmp_path: Path) -> None:
    """No hl-smi on PATH on a machine with /dev/accel nodes (a fixture /dev): Devices said "absent", as
    on a CPU machine; it is a failure that names the nodes."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    dev = tmp_path / "dev"
    (dev / "accel").mkdir(parents=True)
    for i in range(8):
        (dev / "accel" / f"accel{i}").touch()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("GAUDI_GUI_HL_SMI", raising=False)
    monkeypatch.setenv("GAUDI_GUI_DOCTOR_DEV", str(dev))
    poller, _rec, _selection = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: poller.state in (dp.STATE_FAILED, dp.STATE_ABSENT), timeout=15000)
    assert poller.state == dp.STATE_FAILED
    assert "no hl-smi, but 8 /dev/accel nodes (accel0..accel7)" in poller.message


def test_broken_explicit_path_says_so(make_poller, qtbot, tmp_path: Path) -> None:
    poller, _rec, _ = make_poller(hl_smi=str(tmp_path / "no" / "hl-smi"))
    poller.start()
    qtbot.waitUntil(lambda: poller.state == dp.STATE_FAILED, timeout=15000)
    assert "settings" in poller.message and str(tmp_path) in poller.message


def test_env_var_chooses_program(fake_hl_smi: Path, make_poller, qtbot, monkeypatch) -> None:
    monkeypatch.setenv("GAUDI_GUI_HL_SMI", str(fake_hl_smi))
    monkeypatch.setenv("PATH", os.defpath)
    poller, rec, _ = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: len(rec.snapshots) >= 1, timeout=15000)
    assert poller.command.startswith(str(fake_hl_smi))


def test_bad_output_is_a_clear_state(fake_hl_smi: Path, make_poller, qtbot) -> None:
    """Each way hl-smi can print nothing usable is a failure that says what it printed, retried, and
    no snapshot: the modes in turn on one agent (the fake reads its mode at each start)."""
    poller, rec, _ = make_poller()
    for mode, said in (("garbage", "unparsed"), ("fail", "no Habana devices"), ("empty", "printed nothing")):
        set_fake_hl_smi(fake_hl_smi, FAKE_HLSMI_MODE=mode)
        poller.restart()  # a new loop (started, at the first turn)
        qtbot.waitUntil(lambda said=said: poller.state == dp.STATE_FAILED and said in poller.message,
                        timeout=15000)
        assert "retrying" in poller.message
    assert rec.snapshots == []


def test_nvidia_fallback(make_poller, qtbot, monkeypatch, tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    fake = folder / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    "echo '0, NVIDIA H100, GPU-1, 37, 1024, 81559, 41, 70.5, 700.00, 550, 0:18:00.0'\n"
                    "echo '1, NVIDIA H100, GPU-2, 5, 10, 81559, 39, [N/A], 700.00, 550, 0:2a:00.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    poller, rec, selection = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: len(rec.snapshots) >= 2, timeout=15000)
    snap = rec.snapshots[-1]
    assert [s.kind for s in snap] == ["cuda", "cuda"] and snap[1].power_w is None
    assert poller.state == dp.STATE_ABSENT and poller.source == "nvidia-smi"
    assert selection.kind == "cuda" and selection.available == [0, 1]


def test_loop_seconds_is_whole() -> None:
    assert [loop_seconds(x) for x in (0.1, 0.5, 1.0, 1.6, 5.0, float("nan"))] == [1, 1, 1, 2, 5, 1]


def test_settings_change_restarts_loop(fake_hl_smi: Path, make_poller, agent_devices: AgentDevices,
                                       qtbot) -> None:
    poller, rec, _ = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: len(rec.snapshots) >= 1, timeout=15000)
    assert poller.command.startswith("hl-smi ")  # from PATH
    poller._settings.set("devices/hl_smi", str(fake_hl_smi))
    qtbot.waitUntil(lambda: poller.command.startswith(str(fake_hl_smi)) and poller.state == dp.STATE_OK,
                    timeout=15000)
    assert agent_devices.starts() == 2
    assert not [m for s, m in rec.states if s == dp.STATE_FAILED]  # the killed old loop is no failure


def test_selection_restored_by_poller(qtbot) -> None:
    store = Settings()
    store.set("devices/selected_modules", [2, 3])
    selection = DeviceSelection()
    DevicePoller(store, selection, agent=agent_child.shared_client)  # made: nothing started
    assert selection.selected == [2, 3]


def test_absurd_intervals_do_not_crash(fake_hl_smi: Path, make_poller, qtbot, monkeypatch) -> None:
    """Stored intervals that are no number of seconds, or absurd ones, are clamped with a note (said in
    the state) and the agent's loop runs all the same: each value in turn, on one agent."""
    poller, rec, _ = make_poller()
    real_get = poller._settings.get
    for bad in (3e6, float("inf"), float("nan"), "abc", -5.0):
        monkeypatch.setattr(poller._settings, "get",
                            lambda key, bad=bad: bad if key.endswith("interval_s") else real_get(key))
        poller.stop()
        rec.states.clear()
        seen = len(rec.snapshots)
        poller.restart()  # re-reads the intervals and starts
        assert dp.INTERVAL_RANGE_S[0] <= poller.interval_s <= dp.INTERVAL_RANGE_S[1]
        assert poller.interval_note and "devices/interval_s" in poller.interval_note
        assert any(s == dp.STATE_STARTING and "is used" in m for s, m in rec.states), rec.states
        qtbot.waitUntil(lambda seen=seen: len(rec.snapshots) > seen, timeout=15000)


def test_clamp_interval() -> None:
    assert dp.clamp_interval(2.5, 1.0, (0.05, 3600.0)) == (2.5, None)
    assert dp.clamp_interval(float("inf"), 1.0, (0.05, 3600.0))[0] == 3600.0
    assert dp.clamp_interval(3e6, 1.0, (0.05, 3600.0))[0] == 3600.0
    assert dp.clamp_interval(float("nan"), 1.0, (0.05, 3600.0))[0] == 1.0
    assert dp.clamp_interval(None, 5.0, (0.1, 3600.0))[0] == 5.0
    assert dp.clamp_interval(0.0, 1.0, (0.05, 3600.0))[0] == 0.05


def test_hl_smi_runs_in_its_own_session(fake_hl_smi: Path, make_poller, qtbot) -> None:
    poller, rec, _ = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: len(rec.snapshots) >= 1, timeout=15000)
    (loop,) = hl_smi_loops()
    pid = loop.pid
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # a group of its own, killed as one
    # The agent's child, not the window's: the window starts no process.
    assert pid not in [p.pid for p in psutil.Process().children(recursive=True)]


def test_first_snapshot_is_whole_and_card_set_carries_over(fake_hl_smi: Path, make_poller,
                                                           agent_devices: AgentDevices, qtbot,
                                                           monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "die_after:1")
    poller, rec, _ = make_poller()
    poller.start()
    qtbot.waitUntil(lambda: len(rec.snapshots) >= 2 and agent_devices.starts() >= 3, timeout=20000)
    # every loop printed one snapshot and died: each was published whole, never a part of it
    assert all(len(s) == 8 for s in rec.snapshots)


def test_events_that_arrive_after_stop_start_nothing(fake_hl_smi: Path, make_poller, qtbot) -> None:
    """The agent's events and a watch's answer can be on their way when the poller stops (the window
    closing, a host removed): they must paint nothing and ask nothing again."""
    poller, rec, _ = make_poller()
    events: list[dict] = []
    poller.start()
    assert poller._client is not None
    poller._client.event_received.connect(lambda m: events.append(m) if m.get("ev") == "devices" else None)
    qtbot.waitUntil(lambda: len(rec.snapshots) >= 2 and any(e.get("samples") for e in events), timeout=15000)
    last = next(e for e in reversed(events) if e.get("samples"))
    poller.stop()
    snapshots, hosts = len(rec.snapshots), len(rec.hosts)
    poller._on_agent_devices(last)
    poller._on_agent_state({"state": dp.STATE_FAILED, "message": "late"})
    poller._on_watched(poller._watch_token, {"ok": False, "error": "late"})
    assert poller.state == dp.STATE_STOPPED and not poller.is_running()
    assert len(rec.snapshots) == snapshots and len(rec.hosts) == hosts
    assert not poller._restart_timer.isActive()
