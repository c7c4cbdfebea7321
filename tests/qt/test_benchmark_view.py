"""The Benchmark view under Devices: its Run button starts ``gaudi-gui benchmark`` through this machine's
agent (a real agent, a real tiny CPU benchmark), a bad reference is said in one line, and the result is
shown as a person reads it: every figure with its verdict against the reference."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from gaudi_gui.app import create_services
from gaudi_gui.core.runstore import Run
from gaudi_gui.ui.benchmark_view import COLUMNS
from gaudi_gui.ui.devices_tab import DevicesTab


def test_run_benchmark_through_the_agent_and_read_the_verdicts(qtbot: QtBot, tmp_path: Path) -> None:
    services = create_services()
    tab = DevicesTab(services)
    qtbot.addWidget(tab)
    tab.resize(1200, 900)
    tab.show()
    try:
        qtbot.mouseClick(tab.benchmark_button, Qt.MouseButton.LeftButton)
        view = tab.benchmark_view
        assert view is not None
        qtbot.waitUntil(view.isVisible)
        view.size_combo.setCurrentIndex(view.size_combo.findData("tiny"))
        view.repeats.selectAll()
        qtbot.keyClicks(view.repeats, "2")
        # A reference that is not there: refused by the command, said in one line, nothing runs.
        qtbot.keyClicks(view.reference, str(tmp_path / "missing.json"))
        qtbot.mouseClick(view.run_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: view.run_button.isEnabled() and "missing.json" in view.status.text(),
                        timeout=60000)
        assert "no such file or run" in view.status.text() and "\n" not in view.status.text()
        # A previous run of this machine, twice as slow as any CPU can be in decode and train.
        reference = tmp_path / "reference.json"
        reference.write_text(json.dumps({
            "kind": "benchmark", "size": "tiny", "identity": {"card_type": "cpu"},
            "figures": {"decode": {"samples": [1e9, 1e9, 1e9]}, "train_step": {"samples": [1e9, 1e9]}}}))
        view.reference.clear()
        qtbot.keyClicks(view.reference, str(reference))
        qtbot.mouseClick(view.run_button, Qt.MouseButton.LeftButton)
        assert not view.run_button.isEnabled() and view.stop_button.isEnabled()
        qtbot.waitUntil(view.run_button.isEnabled, timeout=120000)
        said = view.status.text()
        assert said.startswith("Finished: 3 figures on 1 × cpu; against run reference.json: "), said
        cells = [[cell.text() if (cell := view.table.item(r, c)) else "" for c in range(len(COLUMNS))]
                 for r in range(view.table.rowCount())]
        rows = {row[0]: row for row in cells}
        assert list(rows) == ["matmul roofline, fp32 (CPU)", "decode, bench model",
                              "training step, bench model"]
        assert rows["matmul roofline, fp32 (CPU)"][-1] == "no reference figure"
        for name in ("decode, bench model", "training step, bench model"):
            assert rows[name][4] == "1e+09"
            assert rows[name][-1].startswith(("slower than the reference by 100 %",
                                              "cannot say (spread too wide")), rows[name]
        assert "1 × cpu" in view.machine.text() and "Reference: run reference.json" in view.machine.text()
        # The run is the agent's, in the runs store, with its result.
        assert Run(view.job.folder).status().state == "finished"
        assert (Path(view.job.folder) / "result.json").is_file()
        # The next window's Benchmark view opens on it.
        again = DevicesTab(services)
        qtbot.addWidget(again)
        again.show()
        qtbot.mouseClick(again.benchmark_button, Qt.MouseButton.LeftButton)
        assert again.benchmark_view is not None
        assert again.benchmark_view.status.text() == f"Last benchmark: {view.job.folder}"
        assert again.benchmark_view.table.rowCount() == view.table.rowCount()
        again.shutdown()
    finally:
        tab.shutdown()
        services.poller.stop()
