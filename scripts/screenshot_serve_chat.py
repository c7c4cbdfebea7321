"""Offscreen screenshot of the Model runner answering from the Serve endpoint, made by clicking: the
Serve panel's Start (the demo model on a real ``transformers serve``), then "Answer from the Serve
endpoint", a prompt, Send. ``python scripts/screenshot_serve_chat.py [OUT.png]``."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/screens/runner-endpoint-1280x800.png"
    os.environ["GAUDI_GUI_HOME"] = tempfile.mkdtemp(prefix="gaudi-gui-shot-serve-")
    from PySide6.QtCore import Qt, QTimer
    from PySide6.QtTest import QTest

    from gaudi_gui.core.serve import pick_free_port
    from scripts.shot import open_window, run, wait_until
    app, _services, window = open_window(1, 1280, 800)
    panel = window.show_serve()
    assert panel is not None
    window.resize(1280, 800)  # the dock opened beside the tabs; a 1280-pixel screen holds both
    panel.port.setValue(pick_free_port())
    QTest.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    wait_until(app, lambda: panel.status.text().startswith("ready"), 240)
    runner = window.runner_tab
    wait_until(app, runner.use_endpoint.isVisible, 10)
    QTest.mouseClick(runner.use_endpoint, Qt.MouseButton.LeftButton)
    runner.max_new_tokens.setValue(40)
    QTest.keyClicks(runner.prompt, "Tell me about Gaudi cards")
    QTest.mouseClick(runner.send_button, Qt.MouseButton.LeftButton)
    wait_until(app, lambda: runner.stats.text().startswith("endpoint"), 120)
    for _ in range(20):
        app.processEvents()
        time.sleep(0.05)
    window.grab().save(out)
    print(out)
    QTest.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    wait_until(app, lambda: panel.status.text().startswith("stopped"), 60)
    settle = time.monotonic() + 0.5  # the layout pass after the new status, as a person sees it
    while time.monotonic() < settle:
        app.processEvents()
        time.sleep(0.05)
    stopped = str(Path(out).with_name(Path(out).stem + "-stopped.png"))
    window.grab().save(stopped)  # the stopped line: what the server generated
    print(stopped)
    asked = []

    def close() -> None:
        left = [text for owner in _services.jobs.owners() for text in owner.active_jobs()]
        if left:
            print(f"still listed after Stop: {left}", file=sys.stderr)
        window.close()  # a job still listed would ask here, in the running loop
        if window.isVisible():
            asked.append(True)
        app.quit()

    QTimer.singleShot(0, close)
    code = run(app)
    if asked:
        print("the window asked about running jobs after Stop", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
