"""The Training tab runs one job on two hosts (two SSH aliases of one test server, one process each,
gloo on the CPU): "several hosts…" picked and both hosts checked by clicks, every host's command in
the preview, Start, steps from machine rank 0 in one process group, each host's state, both hosts' log
lines and the host filter; the app closed and started again — every host followed again; Stop — both
hosts stopped at the same step with a checkpoint, each host's state; nothing left running. Then a rank
killed on one host: the run fails naming that host and the other host's ranks are killed. (Start →
Stop → Resume on two hosts is the scenario of tests/scenarios/test_training_scenario.py.)"""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from gaudi_gui.core import meter_files, remote
from gaudi_gui.core.launch import free_port
from gaudi_gui.services.training_job import TrainingJob
from gaudi_gui.ui.placement_widget import SEVERAL
from gaudi_gui.ui.training_tab import TrainingTab
from tests.helpers import click, close_training_tab, end_training_tab, events, set_arg, training_tab
from tests.remote.conftest import SshHost

pytestmark = pytest.mark.slow

HOST_B = "gg-remote-b"  # the fixture's second alias of the same server


def _fill_form(tab: TrainingTab, ssh_host: SshHost) -> int:
    port = free_port()
    tab.form.model.setCurrentText("builtin:demo")
    tab.form.main_port.setValue(port)
    set_arg(tab, "output_dir", str(ssh_host.home / "out"))
    set_arg(tab, "max_steps", "100000")
    set_arg(tab, "save_steps", "100000")
    set_arg(tab, "logging_steps", "1")
    set_arg(tab, "per_device_train_batch_size", "2")
    return port


@pytest.mark.usefixtures("demo_model")
def test_one_run_on_two_hosts_from_the_tab(qtbot: QtBot, ssh_host: SshHost, tmp_path: Path) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest), remote.Host.parse(HOST_B)])
    services, tab = training_tab(qtbot, tmp_path)
    try:
        # "several hosts…" is the combo's last entry: picked with the keyboard, as a person can.
        assert tab.placement.host_combo.itemData(tab.placement.host_combo.count() - 1) == SEVERAL
        assert not tab.placement.hosts_box.isVisible()
        tab.placement.host_combo.setFocus()
        qtbot.keyClick(tab.placement.host_combo, Qt.Key.Key_End)
        assert tab.placement.multi_selected() and tab.placement.hosts_box.isVisible()
        assert "check two or more hosts" in tab.command.toPlainText()
        for name in (ssh_host.dest, HOST_B):
            box = tab.placement.host_checks[name]
            assert not box.isChecked()
            qtbot.mouseClick(box, Qt.MouseButton.LeftButton)
            assert box.isChecked()
        assert [h.name for h in tab.placement.selected_hosts()] == [ssh_host.dest, HOST_B]
        assert services.settings.get("training/multi_hosts") == [ssh_host.dest, HOST_B]

        port = _fill_form(tab, ssh_host)
        # Every host's command; host 0's address as ssh resolves it (HostName 127.0.0.1).
        qtbot.waitUntil(lambda: f"127.0.0.1:{port}" in tab.command.toPlainText(), timeout=20000)
        preview = tab.command.toPlainText()
        for rank, name in enumerate((ssh_host.dest, HOST_B)):
            assert f"machine rank {rank} on {name}: accelerate launch --num_machines 2 --machine_rank " \
                   f"{rank} --main_process_ip 127.0.0.1 --main_process_port {port}" in preview, preview
            assert f"ssh {name} " in preview and f"< job-rank{rank}.json" in preview, preview

        click(qtbot, tab.btn["Start"])
        # Start checks both hosts' cards first (the start gate), then starts.
        qtbot.waitUntil(lambda: tab.job.kind == "hosts", timeout=90000)
        job = tab.job
        assert job.kind == "hosts", tab.status.text()
        qtbot.waitUntil(lambda: len(job.records) >= 2, timeout=120000)
        # Charts and progress from machine rank 0: its run folder (on host 0, here this machine).
        rank0 = [e["step"] for e in events(Path(job.parts[0].folder), "metrics")]
        assert [r["step"] for r in job.records] == rank0[:len(job.records)], (job.records, rank0)
        started = next(e for e in job.events if e.get("type") == "training_started")
        assert started["world_size"] == 2, started  # one process group across both hosts
        assert f"step {job.progress.step}/" in tab.eta.text()
        assert "running" in tab.hosts_line.text() and HOST_B in tab.hosts_line.text()
        qtbot.waitUntil(lambda: all(any(ln.startswith(f"{n}| ") and "[gaudi-gui]" not in ln
                                        for ln in tab.log.plain_text().splitlines())
                                    for n in (ssh_host.dest, HOST_B)), timeout=60000)

        # The host filter: host B's lines only (the app's own lines stay), then all again.
        assert tab.log.source.isVisible()
        tab.log.source.setFocus()
        qtbot.keyClick(tab.log.source, Qt.Key.Key_End)
        assert tab.log.source.currentData() == HOST_B
        shown = tab.log.plain_text().splitlines()
        assert any(ln.startswith(f"{HOST_B}| ") for ln in shown)
        assert not any(ln.startswith(f"{ssh_host.dest}| ") for ln in shown)
        qtbot.keyClick(tab.log.source, Qt.Key.Key_Home)
        assert any(ln.startswith(f"{ssh_host.dest}| ") for ln in tab.log.plain_text().splitlines())

        if os.environ.get("GAUDI_GUI_SCREENSHOT"):
            tab.grab().save(os.environ["GAUDI_GUI_SCREENSHOT"])

        # The app quits leaving the run going on both hosts; the next start follows every host again.
        services.training.detach_jobs()
        services.settings.sync()
        close_training_tab(services, tab)
        got = job.progress.step
        services, tab = training_tab(qtbot, tmp_path)
        reattached = tab.job
        assert reattached.kind == "hosts" and reattached is not job, type(reattached)
        followed: TrainingJob = reattached
        assert [h.name for h in followed.hosts] == [ssh_host.dest, HOST_B]
        qtbot.waitUntil(lambda: followed.progress.step > got, timeout=120000)
        assert followed.records[0]["step"] == job.records[0]["step"]  # the whole curve, from rank 0
        assert not tab.btn["Start"].isEnabled() and tab.btn["Stop"].isEnabled()
        job = followed

        # Host B's meter finds its graph compilations rising (its own folder, its own steps): the
        # warning event it writes reaches the tab over that host's follow, shown at once, named.
        from gaudi_gui.core.events import EventType, EventWriter
        with EventWriter(Path(job.parts[1].folder) / "events.jsonl") as writer:
            writer.write(EventType.WARNING, kind="compile_rise", steady_compilations=25, from_step=11,
                         message="graph compilations keep rising after warm-up: 25 in the 49 steps "
                                 "after step 11 (51 per 100 steps; 6 during warm-up)")
        strip = tab.meter_strip
        qtbot.waitUntil(strip.warning.isVisible, timeout=60000)
        said = strip.warning.text()
        assert said.startswith(f"⚠ {HOST_B}: graph compilations keep rising after warm-up: 25 in the "), said

        # Stop, the re-attached run: every host stops at the same step, each saying so.
        with qtbot.waitSignal(job.finished, timeout=180000) as done:
            click(qtbot, tab.btn["Stop"])
        assert done.args[1] == "stopped", tab.status.text()
        assert [word for _host, _rank, word in job.host_states()] == ["stopped", "stopped"]
        saved = [[e["step"] for e in events(Path(p.folder), "checkpoint_saved")] for p in job.parts]
        assert saved[0] and saved[0][-1] == saved[1][-1], saved
        assert "on 2 hosts" in tab.status.text(), tab.status.text()
        assert "stopped" in tab.hosts_line.text()
        # The whole job's meter under the status: each host's part (its supervisor's meter, sent with
        # the follow's end) summed, the parts named.
        assert all(p.meter is not None for p in job.parts), [p.meter for p in job.parts]
        line = tab.meter_line.text()
        assert tab.meter_line.isVisible() and line.startswith(f"the whole job (2 parts: {ssh_host.dest}, "
                                                              f"{HOST_B}) · "), line
        assert " 0 J" not in line
        # ... and kept in host 0's run (as `train --hosts` does): `runs show` there says the whole job.
        qtbot.waitUntil(lambda: "the whole job's kept in" in tab.log.plain_text(), timeout=60000)
        kept = meter_files.read_job_summary(job.parts[0].folder)
        assert kept is not None and [p["name"] for p in kept["parts"]] == [ssh_host.dest, HOST_B], kept
        assert meter_files.read_summary(job.parts[0].folder) == job.parts[0].meter  # its own part, as it was
    finally:
        end_training_tab(qtbot, services, tab)
    assert ssh_host.wait_no_processes(30, but_agent=True) == []  # the gate asked the hosts' agent


@pytest.mark.usefixtures("demo_model")
def test_a_rank_killed_on_one_host_fails_the_run_and_kills_the_other(qtbot: QtBot, ssh_host: SshHost,
                                                                     tmp_path: Path) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest), remote.Host.parse(HOST_B)])
    services, tab = training_tab(qtbot, tmp_path)
    try:
        tab.placement.host_combo.setFocus()
        qtbot.keyClick(tab.placement.host_combo, Qt.Key.Key_End)
        for name in (ssh_host.dest, HOST_B):
            qtbot.mouseClick(tab.placement.host_checks[name], Qt.MouseButton.LeftButton)
        _fill_form(tab, ssh_host)
        click(qtbot, tab.btn["Start"])
        qtbot.waitUntil(lambda: tab.job.kind == "hosts", timeout=90000)  # the gate
        job = tab.job
        assert job.kind == "hosts", tab.status.text()
        qtbot.waitUntil(lambda: len(job.records) >= 2, timeout=120000)
        rank_file = next((Path(job.parts[1].folder) / "ranks").glob("rank-*.json"))
        with qtbot.waitSignal(job.finished, timeout=180000) as done:
            os.kill(int(json.loads(rank_file.read_text())["pid"]), signal.SIGKILL)  # host B loses its rank
        assert done.args[1] == "failed", tab.status.text()
        text = tab.status.text()
        # Host A's gloo may see the peer gone and fail on its own first: either host may be named.
        assert text.startswith("Failed on gg-remote") and "(machine rank " in text, text
        assert "were killed" in text, text
        words = [word.removesuffix(" ✗") for _host, _rank, word in job.host_states()]
        assert set(words) <= {"failed", "killed"}, words
        marked = [host for host, _rank, word in job.host_states() if word.endswith(" ✗")]
        assert marked and text.startswith(f"Failed on {marked[0]} "), (marked, text)  # one host blamed
        assert "✗" in tab.hosts_line.text() and "killing the other hosts' ranks" in tab.log.plain_text()
    finally:
        end_training_tab(qtbot, services, tab)
    assert ssh_host.wait_no_processes(60, but_agent=True) == []  # the gate asked the hosts' agent
