"""A run on a host uses the cards checked for THAT host (its Devices panel in the Hosts tab): the
Training tab sends them as ``train --cards`` (shown in the preview and the card note), and the
host's run folder records them in env.json (a real SSH server on 127.0.0.1)."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.core import remote
from gaudi_gui.services.device_selection import DeviceSelection
from tests.helpers import click, close_training_tab, set_arg, training_tab
from tests.remote.conftest import SshHost


@pytest.mark.usefixtures("demo_model")
def test_a_host_run_uses_that_hosts_card_selection(qtbot: QtBot, ssh_host: SshHost, tmp_path: Path) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    services, tab = training_tab(qtbot, tmp_path)
    try:
        selection = DeviceSelection()
        selection.set_kind("hpu", list(range(8)))
        services.host_selections[ssh_host.dest] = selection
        tab.placement.host_combo.setCurrentIndex(tab.placement.host_combo.findData(ssh_host.dest))
        assert "--cards" not in tab.command.toPlainText()
        assert f"all of {ssh_host.dest}'s cards" in tab.form.hints.text()
        # Checking cards in the host's panel updates the preview and the notes at once.
        selection.set_selected([3, 2])
        assert "--cards 2,3" in tab.command.toPlainText()
        assert f"cards 2,3 of {ssh_host.dest}" in tab.form.hints.text()
        assert f"cards 2,3 of {ssh_host.dest}" in tab.placement.host_note.text()

        tab.form.model.setCurrentText("builtin:demo")
        set_arg(tab, "output_dir", str(ssh_host.home / "out"))
        set_arg(tab, "max_steps", "2")
        set_arg(tab, "save_steps", "100000")
        set_arg(tab, "logging_steps", "1")
        # Start checks the host's cards first (the start gate), then starts.
        with qtbot.waitSignal(services.training.current_changed, timeout=90000):
            click(qtbot, tab.btn["Start"])
        job = tab.job
        assert job.kind == "host", tab.status.text()
        assert job.cards == {job.host.name: [2, 3]}
        qtbot.waitUntil(lambda: bool(job.folder), timeout=240000)
        record = job.to_record()
        assert record is not None and record["parts"][0]["cards"] == [2, 3]
        recorded = json.loads((Path(job.folder) / "env.json").read_text())
        device = recorded["cards"]["device"]
        assert recorded["cards"] == {"requested": "2,3", "device": device, "applied": device != "cpu"}
        if device == "hpu":
            assert recorded["set_by_gaudi_gui"]["HABANA_VISIBLE_MODULES"] == "2,3"
        else:
            # This test host has no Gaudi software: the cards are recorded, not applied.
            assert "HABANA_VISIBLE_MODULES" not in recorded["set_by_gaudi_gui"]
        qtbot.waitUntil(lambda: not job.is_running(), timeout=240000)
        assert job.state == "finished", tab.status.text()
    finally:
        close_training_tab(services, tab)
    # The start gate asked the host's agent for its doctor (over the one ssh link): that agent stays.
    assert ssh_host.wait_no_processes(but_agent=True) == []
