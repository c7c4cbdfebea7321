"""Offscreen screenshot of the Training tab after a 60-step demo run, with the host's CPU load from the
Devices poller on the same step axis: ``python scripts/screenshot_training.py OUT.png``."""

from __future__ import annotations

import sys
import tempfile

from PySide6.QtCore import QTimer
from shot import open_window, run


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/training.png"
    app, services, window = open_window(2, 1500, 950)
    services.poller.start()
    tab = window.training_tab
    folder = tempfile.mkdtemp()

    def go(_schema: object) -> None:
        for name, value in (("output_dir", f"{folder}/out"), ("max_steps", "60"), ("save_steps", "30"),
                            ("logging_steps", "1"), ("learning_rate", "0.002"), ("warmup_steps", "5")):
            tab.form.editors[name].editor.setText(value)  # type: ignore[attr-defined]
        if tab.start() is None:
            print(tab.status.text())
            window.close()
            return
        tab.job.finished.connect(lambda *_a: QTimer.singleShot(1500, shoot))

    def shoot() -> None:
        window.grab().save(out)
        window.close()

    tab.schema_loader.schema_loaded.connect(go)
    QTimer.singleShot(240000, window.close)
    return run(app)


if __name__ == "__main__":
    sys.exit(main())
