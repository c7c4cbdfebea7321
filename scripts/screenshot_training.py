"""Screenshots of the Training tab made by clicking: Start, then Stop while the run trains on a
checkpoint that takes seconds to write, the "saving checkpoint… N s" line, then the stopped state.

``python scripts/screenshot_training.py [OUT_DIR]`` writes training.png (the stopped run) and
training-saving.png (mid-save). The checkpoint is slowed with tests/slowdisk (4 MB/s) so the
saving line stays on screen long enough to be seen, as it does on a real model.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["GAUDI_TEST_DISK_MBPS"] = os.environ.get("GAUDI_TEST_DISK_MBPS", "0.3")
os.environ["PYTHONPATH"] = f"{ROOT / 'tests' / 'slowdisk'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"

from PySide6.QtCore import QPoint, Qt, QTimer  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from shot import open_window, run  # noqa: E402


def click(widget: object) -> None:
    QTest.mouseClick(widget, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,  # type: ignore[arg-type]
                     QPoint(8, 8))


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    out.mkdir(parents=True, exist_ok=True)
    app, services, window = open_window(2, 1500, 950)
    services.poller.start()
    tab = window.training_tab
    folder = tempfile.mkdtemp()
    shot = {"saving": False}

    def go(_schema: object) -> None:
        for name, value in (("output_dir", f"{folder}/out"), ("max_steps", "400"), ("save_steps", "1000"),
                            ("logging_steps", "1"), ("learning_rate", "0.002"), ("warmup_steps", "5")):
            tab.form.editors[name].editor.setText(value)  # type: ignore[attr-defined]
        click(tab.btn["Start"])
        if not tab.job.is_running():
            print(tab.status.text())
            window.close()
            return
        tab.job.metrics_received.connect(maybe_stop)
        tab.job.summary_changed.connect(maybe_shoot_saving)
        tab.job.finished.connect(lambda *_a: QTimer.singleShot(1500, shoot))

    def maybe_stop(record: dict) -> None:
        if record.get("step") == 60 and tab.btn["Stop"].text() == "Stop":
            click(tab.btn["Stop"])

    def maybe_shoot_saving(text: str) -> None:
        if not shot["saving"] and text.startswith("saving") and text.endswith(" 2 s"):
            shot["saving"] = True
            window.grab().save(str(out / "training-saving.png"))

    def shoot() -> None:
        window.grab().save(str(out / "training.png"))
        print(tab.status.text())
        window.close()

    started = []

    def once(schema: object) -> None:
        if not started:
            started.append(1)
            go(schema)

    # A schema cached by an earlier start is in the form already (its signal came before this).
    tab.schema_loader.schema_loaded.connect(once)
    if tab.form.schema is not None:
        QTimer.singleShot(0, lambda: once(tab.form.schema))
    QTimer.singleShot(300000, window.close)
    return run(app)


if __name__ == "__main__":
    sys.exit(main())
