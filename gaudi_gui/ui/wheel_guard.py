"""Keep the mouse wheel from changing combo boxes and spin boxes the user is only scrolling past.

Qt gives a wheel event to the widget under the pointer: scrolling a long form changes whatever
combo or spin box passes under it (save_strategy went steps -> best). After ``guard_wheel(root)``
such a widget takes the wheel only once it has focus (click or Tab into it); otherwise the event
goes to the scroll area around it, which scrolls.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QComboBox, QWidget

#: The widget kinds whose value the wheel changes.
GUARDED: tuple[type[QWidget], ...] = (QComboBox, QAbstractSpinBox)


class WheelGuard(QObject):
    """The event filter: an unfocused guarded widget does not take wheel events; they go to the
    scroll area around it."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.Wheel or not isinstance(watched, QWidget) or watched.hasFocus():
            return False
        assert isinstance(event, QWheelEvent)
        area = _scroll_area_of(watched)
        if area is None:
            # Ignored and filtered: QApplication offers a real (spontaneous) wheel event to the parent
            # widgets next, as if this widget had no wheel handling.
            event.ignore()
            return True
        # Handed to the scroll area's viewport ourselves: Qt does not propagate synthesized wheel
        # events, and accepting here keeps a real one from scrolling twice.
        viewport = area.viewport()
        pos = QPointF(viewport.mapFromGlobal(event.globalPosition().toPoint()))
        forwarded = QWheelEvent(pos, event.globalPosition(), event.pixelDelta(), event.angleDelta(),
                                event.buttons(), event.modifiers(), event.phase(), event.inverted(),
                                event.source())
        QCoreApplication.sendEvent(viewport, forwarded)
        event.accept()
        return True


def _scroll_area_of(widget: QWidget) -> QAbstractScrollArea | None:
    """The nearest scroll area whose contents hold ``widget`` (not one the widget is part of)."""
    child, parent = widget, widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea) and child is parent.viewport():
            return parent
        child, parent = parent, parent.parentWidget()
    return None


def guard_wheel(root: QWidget) -> WheelGuard:
    """Guard every combo box and spin box under ``root`` (``root`` included). Safe to call again after
    adding widgets: each widget gets the filter once; returns the filter (owned by ``root``)."""
    guard = root.findChild(WheelGuard, "wheel_guard", Qt.FindChildOption.FindDirectChildrenOnly)
    if guard is None:
        guard = WheelGuard(root)
        guard.setObjectName("wheel_guard")
    widgets: list[QWidget] = [root] if isinstance(root, GUARDED) else []
    for kind in GUARDED:
        widgets.extend(root.findChildren(kind))
    for widget in widgets:
        if widget.property("wheel_guarded"):
            continue
        # StrongFocus: the default WheelFocus would let the wheel itself give focus (and the value).
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        widget.installEventFilter(guard)
        widget.setProperty("wheel_guarded", True)
    return guard
