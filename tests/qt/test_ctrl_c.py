"""Ctrl-C in the window's terminal (services.ctrl_c): SIGINT reaches the window's thread as a Qt signal,
never as a KeyboardInterrupt inside a slot, and asks the window to close as its close button does.
The whole app under a real SIGINT: tests/integration/test_cli.py."""

from __future__ import annotations

import os
import signal
import threading

from PySide6.QtWidgets import QMainWindow, QMessageBox

from gaudi_gui.app import _close_asked
from gaudi_gui.services.ctrl_c import CtrlC


def test_sigint_is_emitted_on_the_window_thread_and_uninstall_puts_back_what_was_there(qtbot) -> None:
    before = signal.getsignal(signal.SIGINT)
    before_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before_fd)
    ctrl_c = CtrlC()
    on_main: list[bool] = []
    ctrl_c.interrupted.connect(lambda: on_main.append(threading.current_thread() is threading.main_thread()))
    try:
        for _ in range(2):  # each Ctrl-C is one signal
            with qtbot.waitSignal(ctrl_c.interrupted, timeout=10000):
                os.kill(os.getpid(), signal.SIGINT)
    finally:
        ctrl_c.uninstall()
    assert on_main == [True, True]
    assert signal.getsignal(signal.SIGINT) is before
    after_fd = signal.set_wakeup_fd(before_fd)
    assert after_fd == before_fd  # the wakeup fd is given back too


def test_a_second_ctrl_c_while_the_close_question_is_up_does_not_ask_again(qtbot) -> None:
    window = QMainWindow()
    qtbot.addWidget(window)
    window.show()
    question = QMessageBox(QMessageBox.Icon.Question, "Quit?", "A job is running.", parent=window)
    question.open()
    qtbot.waitUntil(question.isVisible)
    _close_asked(window)  # the dialog is brought forward; the window is not closed under it
    assert window.isVisible() and question.isVisible()
    question.reject()
    qtbot.waitUntil(lambda: not question.isVisible())
    _close_asked(window)
    assert not window.isVisible()
