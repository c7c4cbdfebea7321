"""Devices benchmarks: hl-smi parse cost per 8-card snapshot, and the GUI event loop's worst stall while
the Devices tab updates 8 cards at 10 Hz (charts showing a full hour of history).

The tab is driven from outside, the way the app is: a fake ``hl-smi`` (tests/fake_hl_smi.py, replaying
recorded output every 0.1 s) is the poller's program, so samples take the real path (QProcess, CSV
parser, history, selection, ``samples_received``); the product has no feeding hook."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def worst_stall(seconds: float, rate_hz: float = 10.0, health: bool = False) -> tuple[float, float, float]:
    """(worst gap after warm-up, median gap, worst gap during warm-up) in ms of a 1 ms QTimer while
    the tab is fed ``rate_hz`` snapshots/s. With ``health`` the health service runs as in the app
    (its alerts fed by every snapshot, the badge shown) with the doctor every 10 s (its shortest
    interval; the default is 300 s) on the same fake 8-card server."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from gaudi_gui.services.context import AppServices
    from gaudi_gui.services.device_poller import DevicePoller
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.environment_probe import EnvironmentProbe
    from gaudi_gui.services.jobs import JobRegistry
    from gaudi_gui.services.settings import Settings
    from gaudi_gui.ui.devices_tab import DevicesTab

    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "hl-smi"
        program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_HLSMI} \"$@\"\n")
        program.chmod(0o755)
        os.environ["FAKE_HLSMI_PERIOD"] = str(1.0 / rate_hz)
        settings = Settings(str(Path(tmp) / "settings.ini"))
        settings.set("devices/history_window_s", 3600)
        settings.set("devices/hl_smi", str(program))
        selection = DeviceSelection()
        poller = DevicePoller(settings, selection)
        services = AppServices(settings=settings, selection=selection,
                               environment=EnvironmentProbe(), jobs=JobRegistry(), device_poller=poller)
        if health:
            from gaudi_gui.app import add_health
            settings.set("health/interval_s", 10.0)
            add_health(services)
        tab = DevicesTab(services)
        tab.resize(1400, 1000)
        tab.show()
        # An hour of 1 Hz history already there: the charts draw their largest window.
        now = time.time()
        for k in range(3600):
            poller.history_store.add(_samples(now - 3600 + k, k))
        gaps: list[float] = []
        warm: list[float] = []
        last = [time.perf_counter()]
        begin = last[0]

        def tick() -> None:
            t = time.perf_counter()
            (warm if t - begin < WARMUP_S else gaps).append((t - last[0]) * 1000)
            last[0] = t

        snapshots = [0]
        poller.samples_received.connect(lambda samples: snapshots.__setitem__(0, snapshots[0] + 1))
        probe = QTimer()
        probe.setInterval(1)
        probe.timeout.connect(tick)
        app.processEvents()
        begin = last[0] = time.perf_counter()
        probe.start()
        poller.start()
        if services.health is not None:
            services.health.start()
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()  # the real event loop, as in the app
        probe.stop()
        poller.stop()
        if services.health is not None:
            services.health.shutdown()
        tab.close()
        tab.deleteLater()
        app.processEvents()
        from gaudi_gui.services.process import reap_all

        reap_all()
    if snapshots[0] < seconds * rate_hz / 4:
        raise RuntimeError(f"the fake hl-smi delivered only {snapshots[0]} snapshots in {seconds} s")
    gaps = gaps or [0.0]
    return max(gaps), statistics.median(gaps), max(warm or [0.0])


def run(quick: bool = False) -> list[dict[str, Any]]:
    parse_ms = parse_cost(200 if quick else 2000)
    # Interleaved: health polling off, on, off, on… (the machine is shared and noisy).
    seconds, repeats = (5.0, 1) if quick else (30.0, 3)
    off: list[tuple[float, float, float]] = []
    on: list[float] = []
    for _ in range(repeats):
        off.append(worst_stall(seconds))
        on.append(worst_stall(seconds, health=True)[0])
    worst = statistics.median(o[0] for o in off)
    median = statistics.median(o[1] for o in off)
    first = statistics.median(o[2] for o in off)
    with_health = statistics.median(on)
    spread_on = f"{min(on):.1f}-{max(on):.1f} ms over {repeats}"
    return [
        _row("devices: parse per 8-card snapshot", parse_ms, "ms", "< 1 ms"),
        _row("devices: worst event-loop stall, 8 cards at 10 Hz", worst, "ms", "< 20 ms"),
        _row(f"devices: worst event-loop stall, same, health polling on (doctor every 10 s; {spread_on})",
             with_health, "ms", "< 20 ms"),
        _row("devices: median event-loop gap (1 ms timer), same run", median, "ms", "informational"),
        _row("devices: first draw of 1 h x 8 cards history (warm-up)", first, "ms", "informational"),
    ]


if __name__ == "__main__":
    for row in run(quick=True):
        print(row)
