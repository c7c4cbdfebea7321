"""One ``hl-smi -l`` per machine: a training run's meter takes its card samples from this machine's agent
(``devices.watch``) while a client (the Devices view) watches the same cards, instead of starting a
second loop. Real agent, real ``gaudi-gui train`` of the demo model, fake hl-smi replaying recorded
output."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gaudi_gui.core import meter_files
from gaudi_gui.core.agentwire import Connection
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore
from tests.agent.test_devices_service import hl_smi_loops, next_event


@pytest.mark.usefixtures("demo_model")
def test_a_run_and_a_watcher_share_the_agents_one_hl_smi_loop(tmp_path: Path, fake_hl_smi: Path) -> None:
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 3,
                                   "per_device_train_batch_size": 2, "logging_steps": 1})
    job.save(tmp_path / "job.json")
    with Connection.open() as watcher:
        watcher.request("devices.watch", interval_s=1)
        next_event(watcher, "devices", accept=lambda m: bool(m["samples"]))
        argv = [sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
                "--runs-dir", str(tmp_path / "runs"), "--device", "hpu", "--cards", "2,3", "--no-preflight"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        most = 0
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            most = max(most, len(hl_smi_loops()))
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out[-3000:]
        assert most == 1, f"{most} hl-smi -l loops at once during the run"
    (run,) = [r.folder for r in RunStore(tmp_path / "runs").runs()]
    summary = json.loads((run / meter_files.SUMMARY_NAME).read_text())
    assert summary["samples_from"] == "agent"
    lines = [json.loads(line) for line in (run / meter_files.METER_NAME).read_text().splitlines()]
    samples = [s for s in lines if "cards" in s]
    assert len(samples) >= 3 and all({c["module_id"] for c in s["cards"]} == {2, 3} for s in samples)
    assert summary["energy_source"] == "hl-smi power integrated" and summary["energy_j"] > 0


def test_the_window_paints_the_agents_loop_and_starts_no_child(qtbot, fake_hl_smi: Path) -> None:
    """The window with Devices and Health open (as ``gaudi-gui`` opens it): its cards come from the
    agent's one ``hl-smi -l``, its doctor is the agent's child, and the window itself has no child."""
    import psutil

    from gaudi_gui.app import create_services
    from gaudi_gui.ui.main_window import MainWindow
    from tests.helpers import card_rows

    before = {p.pid for p in psutil.Process().children(recursive=True)}  # a worker's Slurm daemons
    services = create_services()
    window = MainWindow(services)
    qtbot.addWidget(window)
    window.show()
    services.poller.start()
    assert services.health is not None
    services.health.start()
    window.tabs.setCurrentWidget(window.devices_tab)
    qtbot.waitUntil(lambda: len(card_rows(window.devices_tab.table)) == 8, timeout=60_000)
    qtbot.waitUntil(lambda: services.health is not None and services.health.health("local") is not None,
                    timeout=90_000)
    assert services.poller.command.startswith(str(fake_hl_smi)) or "hl-smi" in services.poller.command
    assert len(hl_smi_loops()) == 1
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    window._shutdown_tabs()
