"""The Training tab over a long run history with a few damaged folders: re-attach at start goes past
them, the Runs table lists every row it shows with the damaged runs' problems on their own rows, and
Clone on a damaged run says what is wrong at the tab instead of raising in a slot."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
from pathlib import Path

from gaudi_gui.core.runstore import Run
from tests.helpers import DAMAGED_RUNS, click, close_training_tab, run_history, training_tab

HISTORY = 2000


def test_runs_tab_and_reattach_survive_damaged_run_folders(qtbot, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    sound = run_history(root, HISTORY)
    latin1 = root / "20250101-000003-latin1"
    # Left "running" by a supervisor that died: re-attach at start must reconcile it, damaged config and
    # all (a dead pid: nothing to follow).
    (latin1 / "status.json").write_text(json.dumps({"state": "running", "pid": 2 ** 22 + 7,
                                                    "pid_create_time": 1.0, "started_at": 1.7e9}))
    services, tab = training_tab(qtbot, tmp_path)
    try:
        assert services.training is not None
        assert not services.training.running()
        # Told from its events; never written back by a reader (the supervisor is the only writer).
        assert Run(latin1).reconcile().state != "running"
        assert Run(latin1).status().state == "running"
        click(qtbot, tab.views.tabBar(), tab.views.tabBar().tabRect(1).center())
        qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.runs)
        click(qtbot, tab.runs.buttons["Refresh"])
        table = tab.runs.table
        qtbot.waitUntil(lambda: table.rowCount() == 500)  # the newest 500: damaged ones first
        rows = {table.item(r, 0).text(): r for r in range(table.rowCount())}
        for name, problem in DAMAGED_RUNS.items():
            status = table.item(rows[name], 1)
            assert problem in status.text() and problem in status.toolTip(), status.text()
        assert set(sound[:500 - len(DAMAGED_RUNS)]) <= set(rows)
        assert all(table.item(rows[n], 1).text() == "finished" for n in sound[:100])
        assert "3 damaged run folder(s)" in tab.runs.status.text()
        table.selectRow(rows[latin1.name])
        click(qtbot, tab.runs.buttons["Clone"])
        qtbot.waitUntil(lambda: "is not UTF-8 (byte 0xe9 at 13)" in tab.status.text())
    finally:
        close_training_tab(services, tab)
