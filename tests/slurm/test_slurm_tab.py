"""The Training tab submits a job to a real one-node Slurm cluster: "Slurm cluster…" picked in the Host
combo with the keyboard, its fields filled by clicks and keys, the sbatch script in the preview (and on
the clipboard), Start — the job seen pending/running with its steps, the script submitted the one the
preview showed; the app closed and started again — the job (still running in Slurm) followed again from
its run folder; Stop, then Kill now before its slow checkpoint is written — the job cancelled at once;
nothing left running (the leftover guard of tests/conftest.py checks). (Start → Stop with a checkpoint
→ Resume on Slurm is the scenario of tests/scenarios/test_training_scenario.py.)"""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from gaudi_gui.core.launch import free_port
from gaudi_gui.services.training_job import TrainingJob
from gaudi_gui.ui.placement_widget import SLURM
from tests.helpers import click, close_training_tab, set_arg, slow_disk_env, training_tab, type_over
from tests.slurm_cluster import PARTITION, SlurmCluster

# One cluster per session: under xdist every Slurm test goes to the same worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def _followers() -> list[str]:
    """Children of this (the window's) process that submit or follow a Slurm job."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            if "gaudi_gui" in line and ("--slurm" in line or "runs attach" in line):
                out.append(line)
    return out


def _without(script: str, folder_mark: str) -> list[str]:
    """The script's lines that do not name the run folder."""
    return [line for line in script.splitlines() if folder_mark not in line]


@pytest.mark.usefixtures("demo_model")
def test_slurm_run_from_the_tab_reattach_and_kill_now(qtbot: QtBot, slurm: SlurmCluster, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The checkpoint disk is slow (sbatch passes the environment on), so Kill now comes while it saves.
    for name, setting in slow_disk_env(0.05).items():
        monkeypatch.setenv(name, setting)
    services, tab = training_tab(qtbot, tmp_path)
    try:
        # "Slurm cluster…" is the combo's last entry without saved hosts: picked with the keyboard.
        assert tab.placement.host_combo.itemData(tab.placement.host_combo.count() - 1) == SLURM
        assert not tab.placement.slurm_box.isVisible()
        tab.placement.host_combo.setFocus()
        qtbot.keyClick(tab.placement.host_combo, Qt.Key.Key_End)
        assert tab.placement.slurm_selected() and tab.placement.slurm_box.isVisible()
        assert services.settings.get("training/host") == SLURM
        assert "sbatch" in tab.placement.host_note.text()

        tab.form.model.setCurrentText("builtin:demo")
        tab.form.main_port.setValue(free_port())
        out = tmp_path / "out"
        set_arg(tab, "output_dir", str(out))
        set_arg(tab, "max_steps", "100000")
        set_arg(tab, "save_steps", "100000")
        set_arg(tab, "logging_steps", "1")
        set_arg(tab, "per_device_train_batch_size", "2")

        # The Slurm fields, each by clicks and keys.
        type_over(qtbot, tab.placement.slurm_nodes, "1")
        type_over(qtbot, tab.placement.slurm_cards, "1")
        type_over(qtbot, tab.placement.slurm_time, "10")
        type_over(qtbot, tab.placement.slurm_partition, PARTITION)
        type_over(qtbot, tab.placement.slurm_account, "")
        type_over(qtbot, tab.placement.slurm_gres, "")
        for combo, key, value in ((tab.placement.slurm_device, Qt.Key.Key_End, "cpu"),
                                  (tab.placement.slurm_login, Qt.Key.Key_Home, "local")):
            combo.setFocus()
            qtbot.keyClick(combo, key)
            assert combo.currentData() == value
        assert services.settings.get("training/slurm")["partition"] == PARTITION

        # The preview is the sbatch script `train --slurm --print-script` makes; Copy command copies it.
        script = tab.command.toPlainText()
        for line in ("#!/bin/bash", "#SBATCH --nodes=1", f"#SBATCH --partition={PARTITION}",
                     "#SBATCH --time=10", "#SBATCH --signal=B:USR1@", '--machine_rank "$SLURM_NODEID"',
                     str(tab.store.root / "<run>")):
            assert line in script, script
        assert "--account" not in script
        click(qtbot, tab.btn["Copy command"])
        assert QGuiApplication.clipboard().text() == script
        # A bad field is refused in the preview, before anything is submitted.
        type_over(qtbot, tab.placement.slurm_time, "soon")
        assert "not a Slurm time limit" in tab.command.toPlainText()
        type_over(qtbot, tab.placement.slurm_time, "10")
        assert tab.command.toPlainText() == script

        click(qtbot, tab.btn["Start"])
        started = tab.job
        assert started.kind == "slurm", tab.status.text()
        job: TrainingJob = started
        qtbot.waitUntil(lambda: bool(job.job_id and job.folder), timeout=60000)
        qtbot.waitUntil(lambda: f"Slurm job {job.job_id} running" in tab.status.text()
                        and job.progress.step >= 2, timeout=120000)
        assert f"step {job.progress.step}" in tab.eta.text()
        assert tab.chart.point_count() >= 2
        assert f"submitted batch job {job.job_id}" in tab.log.plain_text()
        # The job's supervisor (`train --slurm --detach`) is the agent's: no child of the window
        # submits or follows it (the cluster's own daemons, started by the test, run its ranks).
        assert _followers() == []
        run = Path(job.folder)
        assert run.parent == tab.store.root
        # What was submitted is the script the preview showed, in the run's own folder.
        submitted = (run / "slurm.sh").read_text()
        assert _without(submitted, run.name) == _without(script, "<run>"), submitted

        # The app quits while the job runs: the job goes on in Slurm, and the next start follows it
        # again (found in the run store by its slurm.json), its whole curve and log read back.
        services.training.detach_jobs()
        assert f"scancel {job.job_id} ends it" in tab.log.plain_text()
        services.settings.sync()
        close_training_tab(services, tab)
        assert job.job_id in slurm.jobs()
        got = job.progress.step
        services, tab = training_tab(qtbot, tmp_path)
        reattached = tab.job
        assert reattached.kind == "slurm" and reattached is not job, type(reattached)
        followed: TrainingJob = reattached
        qtbot.waitUntil(lambda: followed.job_id == job.job_id and followed.progress.step > got,
                        timeout=120000)
        qtbot.waitUntil(lambda: f"Slurm job {job.job_id} running" in tab.status.text(), timeout=30000)
        assert followed.folder == job.folder
        target = followed.placement.slurm_target()
        assert target.options.partition == PARTITION and target.options.time == "10"
        # What a Resume submits again (the job as sent to the nodes: the same form, one node).
        for field in ("model", "dataset", "training_args"):
            assert followed.job_dict[field] == job.job_dict[field], field
        assert followed.records[0]["step"] == job.records[0]["step"]  # the curve from its first step
        # The log read back: it reaches the view in batches (LogView), after the records on a busy machine.
        qtbot.waitUntil(lambda: "[rank 0/1]" in tab.log.plain_text(), timeout=30000)
        job = followed

        # Stop, then (once the stop was sent) Kill now: the job is cancelled at once, no checkpoint. The
        # agent signals the job's supervisor, which says what it does in the run's supervisor.log.
        said = run / "supervisor.log"
        with qtbot.waitSignal(job.finished, timeout=90000) as done:
            click(qtbot, tab.btn["Stop"])
            qtbot.waitUntil(lambda: f"stopping job {job.job_id}" in said.read_text(), timeout=30000)
            assert tab.btn["Stop"].text() == "Kill now"
            click(qtbot, tab.btn["Stop"])
        assert done.args[1] == "killed", tab.status.text()
        assert f"cancelling job {job.job_id} now" in said.read_text()
        assert "stop: cancelling the job now" in tab.log.plain_text()
        assert not job.checkpoint()
        assert job.job_id not in slurm.jobs()
    finally:
        if tab.job.is_running():
            # A failed check must not leave the job going in Slurm: Kill now, as a person would.
            tab.job.kill()
            with contextlib.suppress(Exception):
                qtbot.waitUntil(lambda: not tab.job.is_running(), timeout=60000)
        close_training_tab(services, tab)
