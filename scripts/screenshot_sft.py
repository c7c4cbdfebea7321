"""Screenshot of the Training tab's dataset panel made by clicking: an alpaca file typed into Dataset,
kind prompt_completion chosen with the keyboard, an eval fraction, then "Render preview" clicked and
the rendered rows (answer tokens highlighted) shown.

``python scripts/screenshot_sft.py [OUT_DIR]`` writes training-sft.png.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QComboBox, QScrollArea, QWidget
from shot import open_window, run

ROWS = [
    {"instruction": "Name a primary color.", "input": "", "output": "Blue."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Reverse the word.", "input": "cat", "output": "tac"},
    {"instruction": "Say hello.", "input": "", "output": "Hello there."},
    {"instruction": "Name a fruit.", "input": "", "output": "An apple."},
    {"instruction": "Count to three.", "input": "", "output": "One, two, three."},
]


def click(widget: QWidget) -> None:
    QTest.mouseClick(widget, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                     QPoint(8, widget.height() // 2))


def type_into(widget: QWidget, text: str) -> None:
    edit = widget.lineEdit() if isinstance(widget, QComboBox) else widget
    assert edit is not None
    click(edit)
    QTest.keyClick(edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClick(edit, Qt.Key.Key_Delete)
    QTest.keyClicks(edit, text)


def choose(combo: QComboBox, text: str) -> None:
    """Focus the combo (as Tab would) and walk to the item with the arrow keys."""
    combo.setFocus()
    target = combo.findText(text)
    while combo.currentIndex() != target:
        QTest.keyClick(combo, Qt.Key.Key_Down if combo.currentIndex() < target else Qt.Key.Key_Up)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    out.mkdir(parents=True, exist_ok=True)
    app, _services, window = open_window(2, 1500, 950)
    tab = window.training_tab
    folder = Path(tempfile.mkdtemp())
    data = folder / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    form = tab.form
    panel = form.dataset_panel

    def go(_schema: object) -> None:
        form.editors["output_dir"].editor.setText(str(folder / "out"))  # type: ignore[attr-defined]
        type_into(form.dataset, str(data))
        choose(panel.kind, "prompt_completion")
        type_into(form.max_length, "96")
        choose(panel.eval_mode, "fraction")
        type_into(panel.eval_fraction, "0.2")
        form.renderer.finished.connect(lambda _r: QTimer.singleShot(500, shoot))
        click(panel.render_button)

    def shoot() -> None:
        scroll = form.parentWidget()
        while scroll is not None and not isinstance(scroll, QScrollArea):
            scroll = scroll.parentWidget()
        if isinstance(scroll, QScrollArea):
            # The dataset rows from the preview down to the rendered text, in view.
            scroll.ensureWidgetVisible(form.preview, 0, 10)
            scroll.ensureWidgetVisible(panel.rendered, 0, 10)
        QTimer.singleShot(300, finish)

    def finish() -> None:
        window.grab().save(str(out / "training-sft.png"))
        print(panel.render_status.text())
        window.close()

    tab.schema_loader.schema_loaded.connect(go)
    QTimer.singleShot(300000, window.close)
    return run(app)


if __name__ == "__main__":
    sys.exit(main())
