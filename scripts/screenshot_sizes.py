"""``python scripts/screenshot_sizes.py [OUTDIR] [WxH ...]``: the Devices and Training tabs at small
window sizes (default 1280x800 and 1024x700), to check that every chart stays readable there.

Made by clicking, like ``screenshots.py``: the app's poller runs the fake ``hl-smi`` replaying recorded
output of 8 Gaudi cards, the builtin demo model trains for a few dozen steps after a click on Start,
and once it has finished each size is shot on both tabs, selected by clicking the tab bar. Files:
OUTDIR/devices-WxH.png and OUTDIR/training-WxH.png (default OUTDIR: docs/).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import _choose_platform, _fake_hl_smi
from shot import parse_size

SIZES = ((1280, 800), (1024, 700))
#: Tab indexes in the main window.
DEVICES, TRAINING = 0, 2
#: Longest wait for the demo run before giving up (ms).
RUN_TIMEOUT_MS = 900_000


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "docs")
    sizes = [parse_size(a, "screenshot_sizes") for a in argv[2:]] or list(SIZES)
    out.mkdir(parents=True, exist_ok=True)
    _choose_platform()
    home = Path(tempfile.mkdtemp(prefix="gaudi-gui-shots-"))
    os.environ["GAUDI_GUI_HOME"] = str(home)
    os.environ["GAUDI_GUI_HL_SMI"] = str(_fake_hl_smi(home))
    os.environ.setdefault("FAKE_HLSMI_PERIOD", "0.5")
    # An idle server (the HL-225 table: no card held), so the start gate lets the demo run start.
    idle = Path(__file__).resolve().parents[1] / "tests" / "data" / "hlsmi" / "table-hl225-1.12.1.txt"
    os.environ.setdefault("FAKE_HLSMI_TABLE", str(idle))
    from PySide6.QtCore import QPoint, Qt, QTimer
    from PySide6.QtTest import QTest
    from shot import open_window, run

    app, services, window = open_window(TRAINING, *sizes[0])
    # As the app does once its window is up: the environment probe and the doctor's health checks.
    services.environment.refresh()
    if services.health is not None:
        services.health.start()
    tab = window.training_tab
    saved: list[Path] = []

    def click(widget: object, pos: QPoint | None = None) -> None:
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,  # type: ignore[arg-type]
                         pos if pos is not None else QPoint(8, 8))

    def click_tab(index: int) -> None:
        bar = window.tabs.tabBar()
        click(bar, bar.tabRect(index).center())

    def start(_schema: object) -> None:
        for name, value in (("output_dir", str(home / "out")), ("max_steps", "40"), ("save_steps", "1000"),
                            ("logging_steps", "1"), ("learning_rate", "0.002"), ("warmup_steps", "5")):
            tab.form.editors[name].editor.setText(value)  # type: ignore[attr-defined]
        click(tab.btn["Start"])
        # The start may wait for the health check of the cards: watch for the run to be going.
        watch.start(200)

    def started() -> None:
        if tab.status.text().startswith("cannot start"):
            print(f"screenshot_sizes: {tab.status.text()}", file=sys.stderr)
            watch.stop()
            window.close()
            return
        if tab.job.is_running():
            watch.stop()
            tab.job.finished.connect(lambda *_a: QTimer.singleShot(1000, lambda: shoot(0)))

    def shoot(n: int) -> None:
        if n >= 2 * len(sizes):
            window.close()
            return
        (width, height), index = sizes[n // 2], (DEVICES, TRAINING)[n % 2]
        window.resize(width, height)
        click_tab(index)

        def grab() -> None:
            if window.size().toTuple() != (width, height):
                tabs = window.tabs
                widest = ", ".join(
                    f"{tabs.tabText(i).replace('&', '')} {tabs.widget(i).minimumSizeHint().width()}"
                    for i in range(tabs.count()))
                print(f"screenshot_sizes: the window is {window.width()}x{window.height()}, not "
                      f"{width}x{height} (minimum widths: {widest})", file=sys.stderr)
            name = "devices" if index == DEVICES else "training"
            path = out / f"{name}-{width}x{height}.png"
            if window.grab().save(str(path)):
                saved.append(path)
            else:
                print(f"screenshot_sizes: could not write {path}", file=sys.stderr)
            shoot(n + 1)

        # Let the layout settle and each chart redraw (one chart per 125 ms tick) before grabbing.
        QTimer.singleShot(1000, grab)

    watch = QTimer(window)
    watch.timeout.connect(started)
    tab.schema_loader.schema_loaded.connect(start)
    services.poller.start()

    def give_up() -> None:
        print(f"screenshot_sizes: no finished run after {RUN_TIMEOUT_MS} ms: {tab.status.text()}",
              file=sys.stderr)
        if not tab.job.is_running():
            window.close()
            return
        # Runs outlive the window by design: stop this one (the second Stop kills) before closing.
        tab.job.finished.connect(lambda *_a: window.close())
        click(tab.btn["Stop"])
        QTimer.singleShot(2000, lambda: click(tab.btn["Stop"]))

    QTimer.singleShot(RUN_TIMEOUT_MS, give_up)
    run(app)
    shutil.rmtree(home, ignore_errors=True)
    for path in saved:
        print(path)
    return 0 if len(saved) == 2 * len(sizes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
