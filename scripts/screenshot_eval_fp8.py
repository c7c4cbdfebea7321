"""``python scripts/screenshot_eval_fp8.py [OUTDIR] [WxH]``: Evaluate, bf16 against FP8, with the answers
and scores on screen (issue 39). Everything is real and runs on this CPU: a demo run is trained
(``gaudi-gui train``, 8 steps), its final model is calibrated (``gaudi-gui calibrate``, Intel Neural
Compressor's MEASURE on 16 demo prompts), then the run's Evaluate window is opened, the calibration is
chosen in its FP8 field, three prompts are typed over what it offers, Start is clicked and the window
is grabbed once both columns are in. File: OUTDIR/evaluate-fp8-WxH.png (default docs/screens/, 1024x760).
Takes about two minutes on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import _choose_platform
from shot import parse_size, wait_until

PROMPTS = "Q: What does the loss tell us? A:\nQ: What is a checkpoint? A:\nQ: What is LoRA? A:"


def _gaudi_gui(*words: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", *words], capture_output=True, text=True,
                          check=False, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"gaudi-gui {words[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "docs/screens").resolve()
    width, height = parse_size(argv[2], "screenshot_eval_fp8") if len(argv) > 2 else (1024, 760)
    _choose_platform()
    work = Path(tempfile.mkdtemp(prefix="gaudi-gui-shot-fp8-"))
    os.environ["GAUDI_GUI_HOME"] = str(work / "home")
    os.environ["GAUDI_GUI_NO_AGENT"] = "0"

    job = {"model": "builtin:demo", "method": "full", "name": "demo-fp8",
           "training_args": {"max_steps": 8, "use_cpu": True, "output_dir": str(work / "out"),
                             "logging_steps": 1, "save_strategy": "no"}}
    (work / "job.json").write_text(json.dumps(job))
    _gaudi_gui("train", "--config", str(work / "job.json"), "--device", "cpu", "--no-agent")
    from gaudi_gui.core import paths
    from gaudi_gui.core.runstore import RunStore

    _gaudi_gui("calibrate", "--model", str(work / "out" / "final"), "--rows", "16", "--dataset",
               str(paths.demo_dataset_path("sft")), "--device", "cpu", "--no-agent")
    calibration = str(next(r for r in RunStore().runs() if r.status().kind == "calibrate").folder.resolve())

    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    from gaudi_gui.ui.eval_view import EvalView

    app = QApplication([])
    run = next(r for r in RunStore().runs() if r.status().kind == "train")
    view = EvalView(run)
    view.resize(width, height)
    view.show()
    field = view.fp8
    wait_until(app, lambda: field.combo.findData(calibration) >= 0, 60)
    field.combo.setCurrentIndex(field.combo.findData(calibration))
    wait_until(app, lambda: not field.error.isVisible(), 30)
    view.prompts.setFocus()
    QTest.keyClick(view.prompts, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClick(view.prompts, Qt.Key.Key_Delete)
    for at, line in enumerate(PROMPTS.splitlines()):
        if at:
            QTest.keyClick(view.prompts, Qt.Key.Key_Return)
        QTest.keyClicks(view.prompts, line)
    QTest.mouseClick(view.start_button, Qt.MouseButton.LeftButton)
    wait_until(app, lambda: view.start_button.isEnabled() and view.answers.rowCount() > 0, 900)
    for _ in range(20):
        app.processEvents()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"evaluate-fp8-{width}x{height}.png"
    view.grab().save(str(path))
    print(path)
    print("status:", view.status.text())
    print("note:", view.scores_note.text())
    view.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
