"""``python scripts/screenshot_docks.py [OUTDIR] [WxH ...]``: the Training and Model runner tabs with the
Serve and Health docks open, and an Evaluate window, at small screen sizes (default 1280x800 and
1024x700): what issue 25 found overlapping, hidden or shrunk there.

Made by clicking: the docks are opened as the View menu opens them (Serve, Health) and the tabs by a
click on the tab bar; the Evaluate window as the Runs page's Evaluate opens it. Files:
OUTDIR/docks-training-WxH.png, OUTDIR/docks-runner-WxH.png, OUTDIR/evaluate-WxH.png (default OUTDIR: docs/).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import _choose_platform
from shot import parse_size

SIZES = ((1280, 800), (1024, 700))
RUNNER, TRAINING = 1, 2


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "docs")
    sizes = [parse_size(a, "screenshot_docks") for a in argv[2:]] or list(SIZES)
    out.mkdir(parents=True, exist_ok=True)
    _choose_platform()
    home = tempfile.mkdtemp(prefix="gaudi-gui-docks-")
    os.environ["GAUDI_GUI_HOME"] = home
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    from shot import open_window, wait_until

    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.runstore import RunStore

    app, services, window = open_window(TRAINING, *sizes[0])
    # A finished run for the Evaluate window.
    store = services.training.store if services.training is not None else RunStore()
    run = store.create(JobConfig(name="demo-lora", method="lora",
                                 training_args={"output_dir": str(Path(home) / "out")}))
    run.update_status(state="finished", step=60, max_steps=60)
    # The View menu's Serve and Health (what Ctrl+Shift+S and Ctrl+H trigger).
    window.show_serve()
    window.show_health()
    wait_until(app, lambda: window.serve_panel is not None and window.health_view is not None, 30)
    bar = window.tabs.tabBar()
    for width, height in sizes:
        window.resize(width, height)
        for index, name in ((TRAINING, "training"), (RUNNER, "runner")):
            QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())
            for _ in range(30):
                app.processEvents()
            window.grab().save(str(out / f"docks-{name}-{width}x{height}.png"))
            print(f"{name} {width}x{height}: window {window.width()}x{window.height()}")
    tab = window.training_tab
    tab.runs.refresh()
    tab.views.setCurrentWidget(tab.runs)
    tab.runs.select_row(0)
    tab.runs.evaluate(run)  # what the Runs page's Evaluate button does for the selected run
    view = tab.runs.eval_views[run.folder]
    for width, height in sizes:
        screen = view.screen().availableGeometry()
        view.move(screen.topLeft())
        for _ in range(30):
            app.processEvents()
        view.grab().save(str(out / f"evaluate-{width}x{height}.png"))
        print(f"evaluate: {view.width()}x{view.height()}")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
