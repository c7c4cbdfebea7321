"""The Training tab runs a job on a host over SSH (a real SSH server on 127.0.0.1): the host picked
in the combo (the preview and the card note follow), Start clicked, steps streamed back, the record kept
to follow the run again, its meter shown as the host's agent reads it, the connection dropped (a state,
then following again), the app "restarted" (the run followed again, its whole curve), Stop clicked, and
nothing left running on either side.
(Start → Stop → Resume on a host is the scenario of tests/scenarios/test_training_scenario.py.)"""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.app import create_services
from gaudi_gui.core import remote
from gaudi_gui.services.run_parts import FOLLOWING
from gaudi_gui.services.training_job import TrainingJob
from gaudi_gui.ui.training_tab import TrainingTab
from tests.helpers import click, close_training_tab, end_training_tab, set_arg, training_tab
from tests.remote.conftest import SshHost


def stop_and_wait(qtbot: QtBot, tab: TrainingTab) -> TrainingJob:
    job = tab.job
    assert job.kind == "host"
    with qtbot.waitSignal(job.finished, timeout=180000) as done:
        click(qtbot, tab.btn["Stop"])
        assert tab.btn["Stop"].text() == "Kill now"
    assert done.args[1] == "stopped", tab.status.text()
    return job


@pytest.mark.usefixtures("demo_model")
def test_train_on_a_host_follow_drop_reattach(qtbot: QtBot, ssh_host: SshHost, tmp_path: Path) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    services, tab = training_tab(qtbot, tmp_path)
    try:
        # Local first, then the saved host; picking it changes the preview and the card note.
        assert tab.placement.host_combo.itemData(0) == remote.LOCAL
        assert "accelerate" in tab.command.toPlainText()
        tab.placement.host_combo.setCurrentIndex(tab.placement.host_combo.findData(ssh_host.dest))
        preview = tab.command.toPlainText()
        assert preview.startswith(f"ssh {ssh_host.dest} ") and "train --config - --detach" in preview
        assert f"{ssh_host.dest}'s cards" in tab.form.hints.text()
        assert services.settings.get("training/host") == ssh_host.dest

        tab.form.model.setCurrentText("builtin:demo")
        set_arg(tab, "output_dir", str(ssh_host.home / "out"))  # a path on the host
        set_arg(tab, "max_steps", "100000")
        set_arg(tab, "save_steps", "100000")
        set_arg(tab, "logging_steps", "1")
        click(qtbot, tab.btn["Start"])
        # Start checks the host's cards first (the start gate), then starts.
        qtbot.waitUntil(lambda: tab.job.kind == "host", timeout=90000)
        job = tab.job
        assert job.kind == "host", tab.status.text()
        qtbot.waitUntil(lambda: len(job.records) >= 2, timeout=240000)
        assert job.folder and Path(job.folder).parent == ssh_host.runs_dir
        # One record per followed run, the same format for every placement: where, each part's folder.
        records = services.settings.get("training/followed_runs")
        assert [(r["placement"]["kind"], [p["folder"] for p in r["parts"]]) for r in records] == [
            ("host", [job.folder])], records
        assert records[0]["placement"]["hosts"][0]["name"] == ssh_host.dest
        # The run's meter as the host's agent reads it (its meter.jsonl is on the host), over the
        # host's one session: watts now, the same strip as a run here. (This CPU run's meter has no
        # card to sample: two cards' samples are written as its meter writes them.)
        now = time.time()
        cards = [{"name": f"module {i}", "module_id": i, "index": i, "power_w": 100.0} for i in (0, 1)]
        with open(Path(job.folder) / "meter.jsonl", "a") as fh:
            fh.writelines(json.dumps({"t": round(now - 2 + i, 3), "source": "hl-smi", "cards": cards}) + "\n"
                          for i in range(3))
        strip = tab.meter_strip
        qtbot.waitUntil(lambda: strip.power.isVisible() and "⚡ 200 W now · " in strip.power.text(),
                        timeout=60000)
        assert strip.meter is not None and strip.meter.followed == (job.name, ssh_host.dest)

        # The network drops: a state in the tab (no dialog), then the run is followed again.
        ssh_host.drop()
        qtbot.waitUntil(lambda: "reconnecting" in tab.status.text(), timeout=30000)
        seen = len(job.records)
        qtbot.waitUntil(lambda: job.connection == FOLLOWING and len(job.records) > seen + 2, timeout=90000)
        steps = [r["step"] for r in job.records]
        assert steps == sorted(set(steps))  # went on where it was: nothing twice, nothing missed
        assert steps == list(range(steps[0], steps[0] + len(steps)))

        # The app quits leaving the run going; the next start follows it again.
        services.training.detach_jobs()
        services.settings.sync()
        close_training_tab(services, tab)
        got = len(job.records)
        services, tab = training_tab(qtbot, tmp_path)
        again = tab.job
        assert again.kind == "host" and again.folder == job.folder
        qtbot.waitUntil(lambda: len(again.records) > got, timeout=120000)
        assert again.records[0]["step"] == job.records[0]["step"]  # the whole curve again, from the host
        stop_and_wait(qtbot, tab)
        assert tab.status.text().startswith("Stopped at step"), tab.status.text()
        assert services.settings.get("training/followed_runs") == []
    finally:
        end_training_tab(qtbot, services, tab)
    assert ssh_host.wait_no_processes(30, but_agent=True) == []  # the gate asked the host's agent


def test_a_host_without_gaudi_gui_fails_the_start_with_the_fix(qtbot: QtBot, ssh_host: SshHost) -> None:
    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.placement import Placement
    services = create_services()
    host = remote.Host.parse(ssh_host.dest, "no-such-gaudi-gui --flag")
    # Saved so: the agent reaches a host with its saved remote command.
    remote.save_hosts([host])
    job = services.training.launch(JobConfig(), Placement.on_host(host))
    with qtbot.waitSignal(job.finished, timeout=60000) as done:
        pass
    assert done.args[1] == "failed" and not job.is_running()
    assert "has no gaudi-gui" in job.summary and "hosts --setup" in job.summary, job.summary
    assert services.settings.get("training/followed_runs") == []
    services.training.shutdown()
    services.poller.stop()
    assert ssh_host.wait_no_processes(20) == []


def test_a_followed_run_whose_folder_was_deleted_on_the_host_is_said_and_let_go(
        qtbot: QtBot, ssh_host: SshHost, tmp_path: Path) -> None:
    """The app kept a run on a host to follow again; meanwhile its folder there was deleted. The next
    start says so in the tab (not "re-attaching…" for ever), lets the record go, and Start is free."""
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    gone = ssh_host.runs_dir / "20261207-101010-gone"
    record = {"placement": {"kind": "host", "hosts": [{"name": ssh_host.dest, "remote_command": ""}],
                            "cards": {}, "slurm": {}},
              "parts": [{"host": ssh_host.dest, "remote_command": "", "folder": str(gone), "name": gone.name,
                         "cards": []}],
              "job": {}, "resumed_from": "", "main_ip": "", "port": 0}
    services = create_services()
    services.settings.set("training/followed_runs", [record])
    services.settings.sync()
    services.training.shutdown()
    services.poller.stop()
    services, tab = training_tab(qtbot, tmp_path)
    try:
        qtbot.waitUntil(lambda: "was deleted or moved" in tab.status.text(), timeout=90000)
        assert gone.name in tab.status.text() and ssh_host.dest in tab.status.text(), tab.status.text()
        assert not tab.job.is_running() and tab.btn["Start"].isEnabled()
        assert services.settings.get("training/followed_runs") == []
    finally:
        end_training_tab(qtbot, services, tab)
