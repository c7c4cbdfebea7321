"""Fault tests for the device loop (the agent's, painted by the window's poller) and ``gaudi-gui
devices`` with a real forking hl-smi wrapper.

Many installs run hl-smi through a shell script; ours forks the helpers such a script may leave:
a helper in the wrapper's process group that holds its stdout (``sleep &``), a pipeline
(``hl-smi.real "$@" | cat``), and, in loop mode, a helper that escapes into a session of its own
(``setsid``). Every process of the wrapper carries a marker in its environment (the script exports
it: the agent that runs it does not carry it), so psutil can count exactly the helpers of this test
(other engineers' processes on the machine do not count).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gaudi_gui.services import agent_child
from gaudi_gui.services import device_poller as dp
from gaudi_gui.services.device_poller import DevicePoller
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.settings import Settings
from tests.helpers import processes_with_env, wait_until
from tests.qt.test_poller import AgentDevices

FAKE = Path(__file__).resolve().parents[1] / "fake_hl_smi.py"
MARKER_VAR = "GAUDI_GUI_FAULT_MARKER"


def marked(marker: str) -> list[psutil.Process]:
    return processes_with_env(MARKER_VAR, marker)


def described(procs: list[psutil.Process]) -> list[str]:
    """What a leftover was: its command, parent, group and session (which kill should have reached it)."""
    out = []
    for proc in procs:
        try:
            out.append(f"pid {proc.pid} {' '.join(proc.cmdline())} ppid {proc.ppid()} "
                       f"pgid {os.getpgid(proc.pid)} sid {os.getsid(proc.pid)}")
        except (psutil.Error, OSError):
            continue
    return out


@pytest.fixture
def wrapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """(path of a forking hl-smi wrapper script, the marker its processes carry)."""
    marker = uuid.uuid4().hex
    folder = tmp_path / "wrapped-bin"
    folder.mkdir()
    script = folder / "hl-smi"
    script.write_text(
        "#!/bin/sh\n"
        f"export {MARKER_VAR}={marker}\n"
        "# helpers as a real wrapper may leave them\n"
        "sleep 300 &\n"
        'case " $* " in *" -l "*) setsid sleep 300 >/dev/null 2>&1 & ;; esac\n'
        f'{sys.executable} {FAKE} "$@" | cat\n')
    script.chmod(0o755)
    monkeypatch.setenv("FAKE_HLSMI_PERIOD", "0.1")
    assert marked(marker) == []
    yield script, marker
    for proc in marked(marker):  # never leave a helper behind, even when a test failed
        # The agent's stop kills its tree: a helper listed here may end before this kill reaches it.
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


@pytest.fixture
def make_poller(qtbot, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    monkeypatch.setenv("GAUDI_GUI_DEVICES_BACKOFF_S", "0.1,0.2")  # the agent's restarts
    made: list[DevicePoller] = []

    def make(program: Path, **settings: object) -> tuple[DevicePoller, list[list], list[tuple[str, str]]]:
        store = Settings()
        store.set("devices/hl_smi", str(program))
        store.set("devices/interval_s", 0.2)
        store.set("devices/process_interval_s", 0.5)
        for key, value in settings.items():
            store.set(f"devices/{key}", value)
        poller = DevicePoller(store, DeviceSelection(), agent=agent_child.shared_client)
        made.append(poller)
        snapshots: list[list] = []
        states: list[tuple[str, str]] = []
        poller.samples_received.connect(snapshots.append)
        poller.state_changed.connect(lambda s, m: states.append((s, m)))
        return poller, snapshots, states

    yield make
    for poller in made:
        poller.stop()


@pytest.fixture
def agent_devices() -> Iterator[AgentDevices]:
    seen = AgentDevices()
    yield seen
    seen.close()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "devices", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


# -- the agent's loop, through the window's poller -------------------------------------------------


def test_poller_leaves_no_helper(wrapper: tuple[Path, str], make_poller, agent_devices: AgentDevices,
                                 qtbot) -> None:
    script, marker = wrapper
    poller, snapshots, _states = make_poller(script)
    poller.start()
    # Table reads (every 0.5 s) come and go meanwhile: their helpers are swept as each one ends.
    qtbot.waitUntil(lambda: len(snapshots) >= 12, timeout=20000)
    during = len(marked(marker))
    assert during >= 4  # the loop's wrapper, fake, cat and both sleeps: the test is meaningful
    assert during <= 5 + 4  # the loop's tree plus at most one table run in flight
    poller.restart()  # a restart kills the whole old tree
    qtbot.waitUntil(lambda: agent_devices.starts() >= 2, timeout=20000)
    seen = len(snapshots)
    qtbot.waitUntil(lambda: poller.state == dp.STATE_OK and len(snapshots) >= seen + 2, timeout=20000)
    poller.stop()  # the agent ends its loop when nobody listens (GAUDI_GUI_DEVICES_GRACE_S later)
    assert wait_until(lambda: marked(marker) == [], timeout=10), described(marked(marker))
    assert all(len(s) == 8 for s in snapshots)


def test_stop_while_the_loop_starts_leaves_no_helper(wrapper: tuple[Path, str], make_poller,
                                                     qtbot) -> None:
    """The poller stopped while the agent was starting its loop (the wrapper forked, no row read yet):
    the loop the agent started for it ends with every helper, none outlives it re-parented to init."""
    script, marker = wrapper
    poller, _snapshots, _states = make_poller(script)
    poller.start()
    qtbot.waitUntil(lambda: bool(marked(marker)), timeout=20000)
    poller.stop()
    assert wait_until(lambda: marked(marker) == [], timeout=10), described(marked(marker))


def test_poller_hang_kills_the_tree(wrapper: tuple[Path, str], make_poller, agent_devices: AgentDevices,
                                    qtbot, monkeypatch) -> None:
    script, marker = wrapper
    monkeypatch.setenv("FAKE_HLSMI_MODE", "stall_mid:2")
    poller, snapshots, states = make_poller(script)
    poller.start()
    qtbot.waitUntil(lambda: bool(snapshots), timeout=20000)
    first_tree = marked(marker)  # the first loop, before it stalls (and table reads of the moment)
    qtbot.waitUntil(lambda: any("hung" in m for _s, m in states) and agent_devices.starts() >= 2,
                    timeout=20000)
    # the stall came mid-snapshot: the 3 rows before it were never published as a snapshot
    assert snapshots and all(len(s) == 8 for s in snapshots)
    assert wait_until(lambda: not [p for p in first_tree if p.is_running()
                                   and p.status() != psutil.STATUS_ZOMBIE], timeout=5), described(first_tree)
    poller.stop()
    assert wait_until(lambda: marked(marker) == [], timeout=10), described(marked(marker))


def test_rows_delayed_beyond_60_ms_make_whole_snapshots(wrapper: tuple[Path, str], make_poller, qtbot,
                                                       monkeypatch) -> None:
    script, _marker = wrapper
    monkeypatch.setenv("FAKE_HLSMI_ROW_DELAY", "0.08")  # 80 ms between two rows of one snapshot
    poller, snapshots, _states = make_poller(script)
    poller.start()
    qtbot.waitUntil(lambda: len(snapshots) >= 3, timeout=20000)
    assert [len(s) for s in snapshots] == [8] * len(snapshots)
    assert poller._selection.available == [0, 1, 2, 3, 4, 5, 6, 7]
    assert poller.state == dp.STATE_OK


def test_garbage_rows_are_reported_by_the_poller(wrapper: tuple[Path, str], make_poller, qtbot,
                                                 monkeypatch) -> None:
    script, _marker = wrapper
    monkeypatch.setenv("FAKE_HLSMI_MODE", "garbage_rows")
    poller, snapshots, _states = make_poller(script)
    reports: list[tuple[int, str]] = []
    poller.rows_rejected.connect(lambda n, why: reports.append((n, why)))
    poller.start()
    qtbot.waitUntil(lambda: len(snapshots) >= 2 and reports and reports[-1][0] >= 4, timeout=20000)
    totals = [n for n, _why in reports]
    assert totals == sorted(totals) and totals[-1] >= 4  # two per snapshot, counted since the loop began
    assert any("expected 12 fields" in why for _n, why in reports)
    assert all("\x1b" not in why for _n, why in reports)
    assert all(len(s) == 8 for s in snapshots)  # the good rows still make whole snapshots


# -- the command line -------------------------------------------------------------------------------


def test_cli_leaves_no_helper(wrapper: tuple[Path, str]) -> None:
    script, marker = wrapper
    started = time.monotonic()
    done = cli("--json", "--hl-smi", str(script))
    assert done.returncode == 0, done.stderr
    assert len(__import__("json").loads(done.stdout)) == 8
    assert wait_until(lambda: marked(marker) == [], timeout=5), described(marked(marker))
    assert time.monotonic() - started < 30


def test_cli_timeout_ends_the_whole_tree(wrapper: tuple[Path, str], monkeypatch) -> None:
    script, marker = wrapper
    monkeypatch.setenv("FAKE_HLSMI_MODE", "hang")
    started = time.monotonic()
    done = cli("--json", "--hl-smi", str(script), "--timeout", "1")
    took = time.monotonic() - started
    assert done.returncode == 1 and "timed out after 1 s" in done.stderr and "Traceback" not in done.stderr
    assert took < 20
    assert wait_until(lambda: marked(marker) == [], timeout=5), described(marked(marker))
    assert __import__("json").loads(done.stdout)[-1]["kind"] == "host"  # the fallback is printed


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "abc"])
def test_cli_refuses_bad_timeouts(value: str) -> None:
    done = cli("--timeout", value)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--timeout" in done.stderr
    assert done.stdout == ""


def test_cli_garbage_rows_are_counted(wrapper: tuple[Path, str], monkeypatch) -> None:
    script, _marker = wrapper
    monkeypatch.setenv("FAKE_HLSMI_MODE", "garbage_rows")
    done = cli("--hl-smi", str(script))
    assert done.returncode == 0
    assert "warning: 2 hl-smi row(s) could not be parsed" in done.stderr
    assert "\x1b" not in done.stderr and "\x1b" not in done.stdout


def test_cli_strips_terminal_escapes(wrapper: tuple[Path, str], monkeypatch) -> None:
    script, _marker = wrapper
    monkeypatch.setenv("FAKE_HLSMI_MODE", "escapes")
    done = cli("--hl-smi", str(script))
    assert done.returncode == 0
    assert "Gaudi 1 (HL-205)" in done.stdout
    for stream in (done.stdout, done.stderr):
        assert not any(ord(c) < 32 and c not in "\n" for c in stream)
        assert "pwned" not in stream


def test_cli_flags_implausible_values(wrapper: tuple[Path, str], monkeypatch) -> None:
    script, _marker = wrapper
    monkeypatch.setenv("FAKE_HLSMI_MODE", "absurd")
    done = cli("--json", "--hl-smi", str(script))
    assert done.returncode == 0
    cards = __import__("json").loads(done.stdout)
    assert cards[1]["problems"] == ["implausible utilization 250 %"]
    assert cards[2]["problems"] == ["implausible memory used -5 MiB"]
    assert cards[3]["problems"] == ["implausible temperature 9999 C"]
    assert cards[0]["problems"] == []
    assert "implausible" in done.stderr and done.stderr.count("card ") == 3
