"""Offscreen screenshot of the Devices tab: 8 Gaudi 2 cards, two minutes of synthetic history put into
the poller's history and published on its public signals from outside (no product hook), two cards
busy with a job, one card reporting 0 C (failed to initialise).
``python scripts/screenshot_devices.py [OUT.png]`` (default docs/devices.png)."""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QApplication

MODULES = [2, 6, 3, 7, 0, 4, 5, 1]  # index -> module id, as recorded (csv-index-module_id.txt)
BUSES = [0x43, 0x44, 0x1A, 0x19, 0xB3, 0xB4, 0xCC, 0xCD]


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/devices.png"
    os.environ["GAUDI_GUI_HOME"] = tempfile.mkdtemp()
    app = QApplication([])
    from gaudi_gui.app import create_services
    from gaudi_gui.core import host
    from gaudi_gui.core.devices import DeviceSample, ProcessInfo
    from gaudi_gui.ui.main_window import MainWindow

    services = create_services(app)
    services.settings.set("devices/selected_modules", [0, 1])
    window = MainWindow(services)
    window.resize(1400, 1050)
    window.show()
    window.ensure_tabs()
    window.tabs.setCurrentIndex(0)
    tab = window.devices_tab

    def snapshot(t: float, k: int) -> list[DeviceSample]:
        cards = []
        for i in range(8):
            busy = MODULES[i] in (0, 1)
            util = 70 + 20 * math.sin(k / 15 + i) if busy else 2 + (k * 7 + i) % 3
            temp = 0.0 if i == 5 else (48 + 6 * math.sin(k / 30 + i) if busy else 31 + i * 0.5)
            cards.append(DeviceSample(
                kind="hpu", index=i, module_id=MODULES[i], name="HL-225", bus_id=f"0000:{BUSES[i]:02x}:00.0",
                uuid=f"01P0-HL2080A0-15-TNDG{i}3-21-0{i}-0{i}", driver_version="1.18.0-ee698fb",
                utilization=round(util), memory_used_mib=61440 + 800 * math.sin(k / 20) if busy else 768,
                memory_total_mib=98304, temperature_c=round(temp),
                power_w=round(380 + 120 * math.sin(k / 15 + i)) if busy else 90 + i, power_max_w=600,
                timestamp=t))
        return cards

    now = time.time()
    last: list[DeviceSample] = []
    for k in range(120):
        last = snapshot(now - 120 + k, k)
        services.poller.history_store.add(last)
    services.selection.set_kind("hpu", [s.module_id if s.module_id is not None else s.index for s in last])
    services.poller.samples_received.emit(last)
    job = "python -m gaudi_gui.workers.train --config run.json"
    procs = [ProcessInfo(index=4, pid=48211, name="python", memory_mib=61440, user="alice", cmdline=job),
             ProcessInfo(index=7, pid=48212, name="python", memory_mib=61440, user="alice", cmdline=job)]
    services.poller.processes_received.emit(procs)
    services.poller.host_received.emit(host.host_sample())
    tab.refresh_now()
    for _ in range(5):
        app.processEvents()
    window.grab().save(out)
    window.close()
    app.processEvents()
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
