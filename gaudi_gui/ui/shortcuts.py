"""Start and Stop from the keyboard, the same keys wherever a job starts (Training, Serve, Evaluate).

Ctrl+Return (and the keypad's Ctrl+Enter) presses Start, Ctrl+. presses Stop. Each shortcut belongs to
its view and acts only while the focus is inside it (``Qt.WidgetWithChildrenShortcut``): the Model
runner's Ctrl+Return sends a prompt and the Serve dock sits beside the runner in the same window
(tests/qt/test_start_stop_keys.py presses Serve's keys with the runner shown). Esc is left alone: the
runner stops a generation with it and the Evaluate window closes with it. A shortcut clicks its button
(only while the button is enabled), so the keys take exactly the path of a click.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QAbstractButton, QWidget

START_KEYS = ("Ctrl+Return", "Ctrl+Enter")
STOP_KEYS = ("Ctrl+.",)


def keys_text(keys: tuple[str, ...]) -> str:
    """The first key as a person reads it ("Ctrl+Return")."""
    return QKeySequence(keys[0]).toString(QKeySequence.SequenceFormat.NativeText)


def with_keys(tip: str, keys: tuple[str, ...]) -> str:
    """``tip`` followed by the key that presses the button: "save a checkpoint… (Ctrl+.)"."""
    said = f"({keys_text(keys)})"
    return f"{tip} {said}" if tip else said


def press_with_keys(owner: QWidget, button: QAbstractButton, keys: tuple[str, ...]) -> list[QShortcut]:
    """Shortcuts in ``owner`` (its focus scope) that click ``button`` while it is enabled; the first
    key is named in the button's tooltip."""
    made = []
    for key in keys:
        shortcut = QShortcut(QKeySequence(key), owner)
        shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        shortcut.activated.connect(lambda b=button: b.click() if b.isEnabled() else None)
        made.append(shortcut)
    button.setToolTip(with_keys(button.toolTip(), keys))
    return made


def start_stop_keys(owner: QWidget, start: QAbstractButton, stop: QAbstractButton) -> list[QShortcut]:
    """Ctrl+Return presses ``start`` and Ctrl+. presses ``stop`` while the focus is in ``owner``."""
    return press_with_keys(owner, start, START_KEYS) + press_with_keys(owner, stop, STOP_KEYS)
