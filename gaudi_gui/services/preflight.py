"""The start gate in the Qt process: the doctor children of a ``core.preflight.Plan``, run with
QProcess (one per host, in parallel, each with its own timeout), never blocking the GUI thread.

What to check and how to read the answers is ``core.preflight`` (shared with the command line); this
object only starts the children, kills one that takes too long (a host that does not answer then
becomes an error naming it), and emits ``finished`` with the ``core.preflight.Verdict`` once every
host has answered. Checks are keyed by who asked ("training", "runner"): each may have one going,
and a new ``run`` with the same key replaces the old one (which then reports nothing).
"""

from __future__ import annotations

import dataclasses
import time

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import preflight as core
from gaudi_gui.services.doctor_child import DoctorChild
from gaudi_gui.services.process import delete_when_reaped

_TAIL = 20


@dataclasses.dataclass
class _Run:
    plan: core.Plan
    checks: list[tuple[core.Target, DoctorChild]]
    started_at: float


class PreflightService(QObject):
    """Runs the gate's doctor children and says what they found."""

    #: A check started: (key, ``core.preflight.Plan``).
    started = Signal(str, object)
    #: Every host of a check answered (or timed out): carries the ``core.preflight.Verdict`` (its
    #: ``key`` says whose check it was).
    finished = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        #: The Python that runs ``-m gaudi_gui doctor`` (tests and the bench may put another here).
        self.python = ""
        self._runs: dict[str, _Run] = {}

    def is_running(self, key: str) -> bool:
        return key in self._runs

    def run(self, plan: core.Plan, key: str) -> bool:
        """Check ``plan``'s hosts now for ``key``; False (and nothing emitted) for an empty plan."""
        self.cancel(key)
        if plan.empty:
            return False
        limit_ms = int(core.child_timeout_s(plan) * 1000)
        run = _Run(plan, [], time.monotonic())
        self._runs[key] = run
        self.started.emit(key, plan)
        for target in plan.targets:
            check = DoctorChild(self, tail_lines=_TAIL)
            run.checks.append((target, check))
            check.ended.connect(lambda _code, _status, r=run, k=key: self._on_finished(k, r))
            check.start(core.doctor_argv(target, plan, python=self.python), limit_ms)
        return True

    def cancel(self, key: str) -> None:
        """Forget ``key``'s check under way: its children are killed, nothing is emitted for it."""
        run = self._runs.pop(key, None)
        for _target, check in run.checks if run is not None else []:
            check.cancel()
            delete_when_reaped(check)

    def shutdown(self) -> None:
        for key in list(self._runs):
            self.cancel(key)

    def _on_finished(self, key: str, run: _Run) -> None:
        if self._runs.get(key) is not run or not all(c.done for _t, c in run.checks):
            return
        del self._runs[key]
        limit = core.child_timeout_s(run.plan)
        replies = []
        for target, c in run.checks:
            exit_code: int | None = None if c.timed_out else c.code
            replies.append(core.host_reply(target, c.stdout(), code=exit_code, tail=c.tail(_TAIL),
                                           timeout_s=limit))
            c.deleteLater()
        verdict = core.decide(run.plan, core.combine(replies), elapsed_s=time.monotonic() - run.started_at)
        self.finished.emit(dataclasses.replace(verdict, key=key))
