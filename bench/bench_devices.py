"""Devices benchmarks: what the window's thread parses (an 8-card hl-smi snapshot, the process table,
a doctor report), and the GUI event loop's worst stall while the Devices tab updates 8 cards at 10 Hz
(charts showing a full hour of history), with and without health polling, each against the same
children started by bare QProcesses (bench/bare.py), interleaved, in a process table crowded to a
server's size (``BENCH_CROWD``, default 1000 idle processes).

The tab is driven from outside, the way the app is: a fake ``hl-smi`` (tests/fake_hl_smi.py, replaying
recorded output every 0.1 s) is the program of the device loop of an agent of the bench's own (a state
folder in a temporary directory, ended after each run), so samples take the real path (the agent's
loop and CSV parser, its ``devices`` events, the poller's history, selection, ``samples_received``);
the product has no feeding hook.

``BENCH_STALL_SECONDS`` and ``BENCH_STALL_REPEATS`` override the length and number of the stall runs."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bare import BareChildren, crowd, crowd_size, worst_gap_ms
from bench.harness import row, summarize
from gaudi_gui.core import hlsmi
from gaudi_gui.core.devices import DeviceSample

FAKE_HLSMI = Path(__file__).resolve().parents[1] / "tests" / "fake_hl_smi.py"


def _row(name: str, value: float, unit: str, goal: str, *, baseline: float | None = None,
         ratio: float | None = None) -> dict[str, Any]:
    return {"name": name, "value": round(value, 4), "unit": unit, "baseline": baseline, "ratio": ratio,
            "goal": goal}


def _snapshot_lines(k: int) -> list[str]:
    lines = []
    for i in range(8):
        lines.append(f"{i}, {(i + 2) % 8}, HL-225, 0000:{0x19 + i:02x}:00.0, 01P4-HL2000A1-{i:02d}, "
                     f"AM{i:02d}SN, 1.18.0-ee698fb, {(k * 7 + i * 11) % 100}, {768 + k % 1000}, 98304, "
                     f"{30 + i}, {90 + (k + i) % 50}")
    return lines


def parse_cost(snapshots: int) -> float:
    """Median milliseconds per 8-card snapshot through the streaming parser the poller uses."""
    header = ", ".join(f"{f} [{u}]" if (u := {"utilization.aip": "%", "memory.used": "MiB",
                                               "memory.total": "MiB", "temperature.aip": "C",
                                               "power.draw": "W"}.get(f)) else f
                       for f in hlsmi.QUERY_FIELDS)
    groups = [_snapshot_lines(k) for k in range(snapshots)]
    timings = []
    for _repeat in range(5):
        stream = hlsmi.CsvStream()
        stream.feed_line(header)
        started = time.perf_counter()
        got = 0
        for lines in groups:
            for line in lines:
                if stream.feed_line(line):
                    got += 1
        timings.append((time.perf_counter() - started) * 1000 / max(1, got))
    return statistics.median(timings)


def _samples(t: float, k: int) -> list[DeviceSample]:
    return [DeviceSample(kind="hpu", index=i, module_id=(i + 2) % 8, name="HL-225",
                         bus_id=f"0000:{i:02x}:00.0",
                         uuid=f"UUID-{i}", driver_version="1.18.0", utilization=float((k * 3 + i * 11) % 100),
                         memory_used_mib=768.0 + (k % 500) * 10, memory_total_mib=98304.0,
                         temperature_c=30.0 + i + (k % 10), power_w=90.0 + (k + i) % 300, power_max_w=600.0,
                         timestamp=t) for i in range(8)]


#: The first second (first layout, first full draw of an hour of history) is reported on its own.
WARMUP_S = 1.0
#: Health polling in these runs: the doctor every 10 s (its shortest interval; the default is 300 s).
HEALTH_INTERVAL_S = 10.0


def _fake(folder: Path) -> Path:
    program = folder / "hl-smi"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_HLSMI} \"$@\"\n")
    program.chmod(0o755)
    return program


def _doctor_argv(program: Path) -> list[str]:
    """The health service's local check, as it starts it."""
    return [sys.executable, "-m", "gaudi_gui", "doctor", "--json", "--background", "--hl-smi", str(program)]


def read_costs(reads: int = 200) -> tuple[float, float, float, float]:
    """(median, max) ms of reading a real doctor report of 8 fake cards (``services.health.read_report``,
    on the doctor's thread since issue 26, the window's before) and of parsing the fake's process table
    (``hlsmi.parse_table``, every 5 s per host, read in a slot)."""
    from gaudi_gui.core import health  # noqa: F401  (imported once, as the app does before its first read)
    from gaudi_gui.core.child import Outcome
    from gaudi_gui.services.health import read_report

    with tempfile.TemporaryDirectory() as tmp:
        program = _fake(Path(tmp))
        env = dict(os.environ, GAUDI_GUI_HOME=tmp)
        report = subprocess.run(_doctor_argv(program), capture_output=True, text=True, env=env,
                                timeout=120, check=False)
        table = subprocess.run([str(program)], capture_output=True, text=True, env=env, timeout=60,
                               check=True).stdout
    if '"hosts"' not in report.stdout:
        raise RuntimeError(f"the doctor printed no report: {report.stderr[-500:]}")

    def timed(fn: Any) -> list[float]:
        out = []
        for _ in range(reads):
            started = time.perf_counter()
            fn()
            out.append((time.perf_counter() - started) * 1000)
        return out

    outcome = Outcome(report.stdout, report.returncode)
    doctor = timed(lambda: read_report("local", 60.0, outcome))
    assert read_report("local", 60.0, outcome).reachable
    lines = "\n".join(table.splitlines()[-400:])
    tables = timed(lambda: hlsmi.parse_table(lines))
    return statistics.median(doctor), max(doctor), statistics.median(tables), max(tables)


def worst_stall(seconds: float, rate_hz: float = 10.0, health: bool = False) -> tuple[float, float, float]:
    """(worst gap after warm-up, median gap, worst gap during warm-up) in ms of a 1 ms QTimer while
    the tab is fed ``rate_hz`` snapshots/s. With ``health`` the health service runs as in the app
    (its alerts fed by every snapshot, the badge shown) with the doctor every 10 s (its shortest
    interval; the default is 300 s) on the same fake 8-card server."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from gaudi_gui.services import agent_child
    from gaudi_gui.services.context import AppServices
    from gaudi_gui.services.device_poller import DevicePoller
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.environment_probe import EnvironmentProbe
    from gaudi_gui.services.jobs import JobRegistry
    from gaudi_gui.services.settings import Settings
    from gaudi_gui.ui.devices_tab import DevicesTab

    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory() as tmp:
        program = _fake(Path(tmp))
        os.environ["FAKE_HLSMI_PERIOD"] = str(1.0 / rate_hz)
        # An agent of the bench's own, started with this environment (the fake's period).
        saved_home = os.environ.get("GAUDI_GUI_HOME")
        os.environ["GAUDI_GUI_HOME"] = str(Path(tmp) / "home")
        settings = Settings(str(Path(tmp) / "settings.ini"))
        settings.set("devices/history_window_s", 3600)
        settings.set("devices/hl_smi", str(program))
        selection = DeviceSelection()
        poller = DevicePoller(settings, selection, agent=agent_child.shared_client)
        services = AppServices(settings=settings, selection=selection,
                               environment=EnvironmentProbe(), jobs=JobRegistry(), device_poller=poller)
        if health:
            from gaudi_gui.app import add_health
            settings.set("health/interval_s", HEALTH_INTERVAL_S)
            add_health(services)
        tab = DevicesTab(services)
        tab.resize(1400, 1000)
        tab.show()
        # An hour of 1 Hz history already there: the charts draw their largest window.
        now = time.time()
        for k in range(3600):
            poller.history_store.add(_samples(now - 3600 + k, k))
        snapshots = [0]
        poller.samples_received.connect(lambda samples: snapshots.__setitem__(0, snapshots[0] + 1))
        app.processEvents()
        QTimer.singleShot(0, poller.start)
        if services.health is not None:
            QTimer.singleShot(0, services.health.start)
        # The real event loop, as in the app: the first second's gaps (first layout, first full draw)
        # apart from the rest.
        warm = worst_gap_ms(WARMUP_S)
        gaps = worst_gap_ms(seconds - WARMUP_S)
        poller.stop()
        if services.health is not None:
            services.health.shutdown()
        tab.close()
        tab.deleteLater()
        app.processEvents()
        _end_agent()
        if saved_home is None:
            os.environ.pop("GAUDI_GUI_HOME", None)
        else:
            os.environ["GAUDI_GUI_HOME"] = saved_home
    if snapshots[0] < seconds * rate_hz / 4:
        raise RuntimeError(f"the fake hl-smi delivered only {snapshots[0]} snapshots in {seconds} s")
    return max(gaps), statistics.median(gaps), max(warm)


def _end_agent() -> None:
    """Close the window's client and end the bench's agent (its loop and fake hl-smi with it)."""
    import contextlib

    from gaudi_gui.core import agentwire
    from gaudi_gui.services import agent_child

    agent_child.close_shared()
    with contextlib.suppress(agentwire.AgentError, OSError), agentwire.Connection.open(start=False) as conn:
        conn.request("shutdown", timeout=10, force=True)


def bare_stall(seconds: float, rate_hz: float = 10.0, health: bool = False) -> float:
    """The baseline of ``worst_stall``: the worst gap (after the same warm-up) of an event loop that
    starts the same children with bare QProcesses and throws their output away: the fake hl-smi loop,
    its process table every 5 s and, with ``health``, the doctor every 10 s."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    assert app is not None
    with tempfile.TemporaryDirectory() as tmp:
        program = _fake(Path(tmp))
        os.environ["FAKE_HLSMI_PERIOD"] = str(1.0 / rate_hz)
        children = BareChildren()
        children.stream([str(program), *hlsmi.query_args(hlsmi.QUERY_FIELDS, loop_s=1)])
        children.every(5.0, lambda: [[str(program)]])
        if health:
            children.every(HEALTH_INTERVAL_S, lambda: [_doctor_argv(program)])
        worst_gap_ms(WARMUP_S)
        gaps = worst_gap_ms(seconds - WARMUP_S)
        children.stop()
    return max(gaps)


def _stall_plan(quick: bool) -> tuple[float, int]:
    seconds, repeats = (5.0, 1) if quick else (30.0, 3)
    return (float(os.environ.get("BENCH_STALL_SECONDS", seconds)),
            int(os.environ.get("BENCH_STALL_REPEATS", repeats)))


def run(quick: bool = False) -> list[dict[str, Any]]:
    parse_ms = parse_cost(200 if quick else 2000)
    doctor_ms, doctor_max, table_ms, table_max = read_costs(50 if quick else 200)
    seconds, repeats = _stall_plan(quick)
    size = crowd_size()
    # Interleaved (the machine is shared and noisy): app, bare, app with health, bare with the doctor…
    app_off: list[tuple[float, float, float]] = []
    bare_off: list[float] = []
    app_on: list[float] = []
    bare_on: list[float] = []
    with crowd(size):
        for _ in range(repeats):
            app_off.append(worst_stall(seconds))
            bare_off.append(bare_stall(seconds))
            app_on.append(worst_stall(seconds, health=True)[0])
            bare_on.append(bare_stall(seconds, health=True))
    off = summarize([a[0] for a in app_off], bare_off)
    on = summarize(app_on, bare_on)
    median = statistics.median(o[1] for o in app_off)
    first = statistics.median(o[2] for o in app_off)
    where = f"{size} idle processes in the table"
    return [
        _row("devices: parse per 8-card snapshot", parse_ms, "ms", "< 1 ms"),
        _row(f"devices: read one doctor report, 8 cards, in a slot (max {doctor_max:.2f} ms)", doctor_ms,
             "ms", "< 1 ms"),
        _row(f"devices: parse the hl-smi process table in a slot (max {table_max:.2f} ms)", table_ms, "ms",
             "< 1 ms"),
        {**row(f"devices: worst event-loop stall, 8 cards at 10 Hz (baseline: bare children; {where})",
               off, unit="ms", goal="< 20 ms", digits=1), "app_samples": [a[0] for a in app_off],
         "base_samples": bare_off},
        {**row(f"devices: same, health polling on (doctor every {HEALTH_INTERVAL_S:g} s; baseline: bare "
               "children and doctor)", on, unit="ms", goal="< 20 ms", digits=1), "app_samples": app_on,
         "base_samples": bare_on},
        _row("devices: median event-loop gap (1 ms timer), app, health off", median, "ms", "informational"),
        _row("devices: first draw of 1 h x 8 cards history (warm-up)", first, "ms", "informational"),
    ]


if __name__ == "__main__":
    for got in run(quick=True):
        print(got)
