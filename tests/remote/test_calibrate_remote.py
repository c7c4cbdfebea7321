"""Issue 39 on a host: FP8 scales belong to the card generation they are measured on, so a Gaudi host's
model is calibrated on the host, and the calibration is "downloadable with the model": it comes back
whole (manifest, both QUANT_CONFIGs, INC's measurements) with its configs pointed at the copy, and goes
to another host (``runs --host H push``) the same way. One real INC measurement of the tiny model on the
test host (the real sshd on 127.0.0.1), from the command line and from the Calibrate window."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from gaudi_gui.core import fp8, remote, run_copy
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.ui.remote_browser import RemoteBrowser
from tests.helpers import click
from tests.remote.conftest import SshHost
from tests.remote.test_remote_browser import entry

pytestmark = pytest.mark.slow


def gg(*args: str, timeout: float = 240, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, input=stdin)


def _configs_point_at(folder: Path) -> None:
    for name in (fp8.QUANT_CONFIG_NAME, fp8.QUANTIZE_CONFIG_NAME):
        config = json.loads((folder / name).read_text())
        assert config["dump_stats_path"] == str(folder.resolve() / "measure" / "inc"), (folder, config)


def test_a_calibration_on_a_host_comes_back_and_goes_to_another(ssh_host: SshHost, tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    done = gg("calibrate", "--host", ssh_host.dest, "--model", str(tiny_model_dir), "--prompt", "the cat sat",
              "--prompt", "hello world", "--prompt", "what is fp8?", "--rows", "3", "--device", "cpu")
    assert done.returncode == 0, done.stderr[-3000:]
    (made,) = [p for p in ssh_host.runs_dir.iterdir() if (p / fp8.MANIFEST_NAME).is_file()]
    _configs_point_at(made)

    # Back here, whole: the measurements byte for byte, the configs pointed at the copy.
    back = gg("runs", "--host", ssh_host.dest, "fetch", str(made), timeout=60)
    assert back.returncode == 0, back.stderr
    store = RunStore()
    copy = store.root / made.name
    files = fp8.measurement_files(made)
    assert len(files) == 3 and fp8.measurement_files(copy) == files
    assert all((copy / f).read_bytes() == (made / f).read_bytes() for f in files)
    assert back.stdout.strip() == (f"brought back to {copy}; its FP8 measurements: 3 files, measured on cpu "
                                   f"(cpu), usable with --fp8 {made.name}")
    _configs_point_at(copy)
    _configs_point_at(made)  # the host's own is untouched
    manifest, found = fp8.check(copy, model=str(tiny_model_dir))
    assert found == [] and manifest == fp8.read_manifest(made)
    assert not (copy / "calibrate-job.json").exists() and not (copy / "ranks").exists()
    # This machine's doctor accepts the copy as it accepts the host's own.
    doctor = gg("doctor", "--fp8", made.name, timeout=120)
    assert doctor.returncode == 0 and "the calibration fits this machine" in doctor.stdout, doctor.stdout

    # To another host (here: the same server under its second name, whose store has the run already:
    # the copy takes a name of its own, the original stays as it was).
    sent = gg("runs", "--host", f"{ssh_host.dest}-b", "push", made.name, "--json", timeout=60)
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)
    there = Path(answer["folder"])
    assert answer["renamed"] and there.parent == ssh_host.runs_dir and there != made
    assert fp8.measurement_files(there) == files
    _configs_point_at(there)
    _configs_point_at(made)
    origin = run_copy.origin(there)
    assert origin is not None and origin["folder"] == str(copy)
    # Sent again: the same copy replaced, not a third.
    again = gg("runs", "--host", f"{ssh_host.dest}-b", "push", str(copy), timeout=60)
    assert again.returncode == 0 and again.stdout.strip() == \
        f"sent to {ssh_host.dest}-b: {there} (as {there.name}: the host had a run of that name)"
    assert sorted(p.name for p in ssh_host.runs_dir.iterdir() if not p.name.startswith(".")) == \
        sorted([made.name, there.name])

    # Bad input: one line, exit 2; nothing half-written on the host.
    for argv, words in ((["runs", "push", made.name], "name the host to send it to"),
                        (["runs", "--host", ssh_host.dest, "push", "no-such-run"],
                         "no run 'no-such-run' here")):
        refused = gg(*argv, timeout=60)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    for name, stdin, words in (("../up", "", "is not a run name"),
                               ("20261207-x", "garbage", "not a packed run")):
        refused = gg("runs", "receive", name, timeout=60, stdin=stdin)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
    assert ssh_host.wait_no_processes(30, but_agent=True) == []


def test_the_calibrate_window_measures_on_the_host_and_keeps_a_copy_here(ssh_host: SshHost,
                                                                        tiny_model_dir: Path,
                                                                        qtbot: QtBot) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    from gaudi_gui.services.agent_child import shared_client
    from gaudi_gui.services.calibrate import CalibrateJob
    from gaudi_gui.ui.calibrate_view import CalibrateView
    view = CalibrateView(CalibrateJob(shared_client), hosts=remote.saved_hosts)
    qtbot.addWidget(view)
    view.show()
    assert [view.where.itemText(i) for i in range(view.where.count())] == ["This machine", ssh_host.dest]
    view.where.setFocus()
    qtbot.keyClick(view.where, Qt.Key.Key_Down)  # This machine -> the host
    assert view.place() == ssh_host.dest and ssh_host.dest in view.dataset.placeholderText()
    qtbot.keyClicks(view.model, str(tiny_model_dir))
    # Browse… lists the host's files (a file is the choice here, not a folder).
    prompts = ssh_host.home / "calib.txt"
    prompts.write_text("what is fp8?\n")
    click(qtbot, view.browse_button)
    dialog = view.browser
    assert isinstance(dialog, RemoteBrowser) and dialog.pick_files and dialog.tabs.count() == 1
    dialog.path.clear()
    qtbot.keyClicks(dialog.path, str(ssh_host.home))
    qtbot.keyClick(dialog.path, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: dialog.folder == str(ssh_host.home) and dialog.choose_button.isEnabled(),
                    timeout=60000)
    click(qtbot, dialog.choose_button)  # nothing selected: a file must be
    assert dialog.isVisible() and dialog.status.text() == "Select a file first."
    item = entry(dialog.entries, "calib.txt")
    dialog.entries.scrollToItem(item)
    qtbot.mouseClick(dialog.entries.viewport(), Qt.MouseButton.LeftButton,
                     pos=dialog.entries.visualItemRect(item).center())
    click(qtbot, dialog.choose_button)
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=5000)
    assert view.dataset.text() == str(prompts)
    qtbot.keyClicks(view.prompts, "the cat sat")
    qtbot.keyClick(view.prompts, Qt.Key.Key_Return)
    qtbot.keyClicks(view.prompts, "hello world")
    view.rows.selectAll()
    qtbot.keyClicks(view.rows, "2")
    view.device.setFocus()
    qtbot.keyClick(view.device, Qt.Key.Key_End)  # the test host's hl-smi is a recording: on its CPU
    assert view.device.currentData() == "cpu"
    click(qtbot, view.run_button)
    try:
        # Ended (the Calibrate button is back) and, when it finished, its copy kept here or not.
        qtbot.waitUntil(lambda: view.run_button.isEnabled() and (
            bool(view.kept_here) or "No copy" in view.result.text() or not view.check_button.isEnabled()),
            timeout=180000)
        assert view.kept_here, (view.status.text(), view.result.text())
        (made,) = [p for p in ssh_host.runs_dir.iterdir() if (p / fp8.MANIFEST_NAME).is_file()]
        assert view.job.folder == str(made) and f"on {ssh_host.dest}" in view.status.text()
        copy = Path(view.kept_here)
        assert copy == RunStore().root / made.name
        assert f"A copy is kept here: {copy} (Runs and Compare list it)" in view.result.text()
        assert f"--fp8 {made} --host {ssh_host.dest}" in view.result.text()
        assert fp8.measurement_files(copy) == fp8.measurement_files(made) != []
        _configs_point_at(copy)
        assert view.check_button.isEnabled()
    finally:
        view.shutdown()
    assert ssh_host.wait_no_processes(30, but_agent=True) == []
