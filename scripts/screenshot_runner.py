"""Offscreen screenshot of the Model runner with the demo model loaded and a two-turn chat streamed,
by clicking Load and Send as a person would: ``python scripts/screenshot_runner.py OUT.png``."""

from __future__ import annotations

import sys

from PySide6.QtCore import Qt, QTimer
from PySide6.QtTest import QTest
from shot import open_window, run

QUESTIONS = ["What is the learning rate?", "And what does a checkpoint do?"]


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/runner.png"
    app, services, window = open_window(1, 1400, 900)
    services.environment.refresh()
    tab = window.runner_tab
    tab.chat_mode.setChecked(True)
    tab.system_prompt.setPlainText("You are a helpful assistant for Gaudi users.")
    tab.max_new_tokens.setValue(40)
    tab.do_sample.setChecked(True)
    tab.seed.setText("3")
    pending = list(QUESTIONS)

    def ask() -> None:
        if not pending:
            QTimer.singleShot(300, shoot)
            return
        tab.prompt.setPlainText(pending.pop(0))
        QTest.mouseClick(tab.send_button, Qt.MouseButton.LeftButton)

    def shoot() -> None:
        window.grab().save(out)
        window.close()

    tab.client.model_loaded.connect(lambda _info: QTimer.singleShot(100, ask))
    tab.client.generation_finished.connect(lambda _stats: QTimer.singleShot(100, ask))
    tab.client.error_occurred.connect(print)
    QTest.mouseClick(tab.load_button, Qt.MouseButton.LeftButton)
    QTimer.singleShot(120000, window.close)
    return run(app)


if __name__ == "__main__":
    sys.exit(main())
