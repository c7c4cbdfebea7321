"""The start gate in the Qt process: the doctor children of a ``core.preflight.Plan``, one per host,
in parallel, each with its own timeout: each is an agent's ``doctor`` child (``AgentDoctor``): this
machine's agent's, or a host's agent's on that host (reached through this machine's agent and its one
ssh session to the host, with the saved host's hl-smi), as the Health view's checks are.

What to check and how to read the answers is ``core.preflight`` (shared with the command line); this
object only starts the children (a host that takes too long is killed and becomes an error naming
it), and emits ``finished`` with the ``core.preflight.Verdict`` once every host has answered. Checks
are keyed by who asked ("training", "runner"): each may have one going, and a new ``run`` with the
same key replaces the old one (which then reports nothing).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import child as core_child
from gaudi_gui.services.agent_child import AgentChild

if TYPE_CHECKING:
    # Imported where a check is planned or read (PreflightService's methods, a doctor's reader): the
    # health service imports AgentDoctor at its first check, and imports these one per turn of the
    # event loop while that doctor runs (services.health.READER_MODULES).
    from gaudi_gui.core import preflight as core
    from gaudi_gui.core.health import HostHealth

_TAIL = 20


class AgentDoctor(QObject):
    """A doctor as an agent's child (``host``: a saved host's, run on it by its agent): ``ended``
    carries ``read(outcome)``, with the timeout kept here (a timer: the agent ends the child when it is
    asked to)."""

    ended = Signal(object)

    def __init__(self, parent: QObject, read: Callable[[core_child.Outcome], object],
                 tail_lines: int = 40, host: str | None = None) -> None:
        super().__init__(parent)
        self._read = read
        self._child = AgentChild(self, tail_lines=tail_lines, host=host)
        self._child.finished.connect(self._on_finished)
        self._stdout: list[str] = []
        self._child.line_received.connect(lambda stream, line: self._stdout.append(line)
                                          if stream == "stdout" else None)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._on_timeout)
        self._timed_out = False
        self._retired = False

        #: Its report was delivered (``ended``).
        self.done = False

    def start(self, args: dict[str, Any], timeout_ms: int) -> None:
        self._child.start("doctor", args)
        self._timer.start(max(0, timeout_ms))

    def is_running(self) -> bool:
        """From ``start`` until ``ended`` was delivered."""
        return not self.done and not self._retired

    def kill(self) -> None:
        """The agent ends the child; ``ended`` still follows."""
        self._timer.stop()  # it is being ended: no timeout of its own left to keep
        self._child.kill_tree()

    def retire(self) -> None:
        """Killed, and heard no more."""
        self._retired = True
        self._timer.stop()
        self._child.kill_tree()
        if not self._child.is_running():
            self.deleteLater()

    def _on_timeout(self) -> None:
        self._timed_out = True
        self._child.kill_tree()

    def _on_finished(self, code: int, status: str) -> None:
        self._timer.stop()
        if self._retired:
            self.deleteLater()
            return
        outcome = core_child.Outcome(stdout="\n".join(self._stdout),
                                     code=None if status == "failed_to_start" else code,
                                     tail=tuple(self._child.tail(40)), timed_out=self._timed_out)
        self.done = True
        self.ended.emit(self._read(outcome))


@dataclasses.dataclass
class _Run:
    plan: core.Plan
    checks: list[AgentDoctor]
    started_at: float
    replies: dict[int, HostHealth] = dataclasses.field(default_factory=dict)


class PreflightService(QObject):
    """Runs the gate's doctor children and says what they found."""

    #: A check started: (key, ``core.preflight.Plan``).
    started = Signal(str, object)
    #: Every host of a check answered (or timed out): carries the ``core.preflight.Verdict`` (its
    #: ``key`` says whose check it was).
    finished = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        #: The Python that runs this machine's ``-m gaudi_gui doctor`` (tests and the bench may put
        #: another here).
        self.python = ""
        #: A saved host's hl-smi path (the app gives the hosts' list; "": the host's PATH).
        self.host_hl_smi: Callable[[str], str] = lambda _name: ""
        self._runs: dict[str, _Run] = {}

    def is_running(self, key: str) -> bool:
        return key in self._runs

    def run(self, plan: core.Plan, key: str) -> bool:
        """Check ``plan``'s hosts now for ``key``; False (and nothing emitted) for an empty plan."""
        from gaudi_gui.core import preflight as core

        self.cancel(key)
        if plan.empty:
            return False
        limit_s = core.child_timeout_s(plan)
        run = _Run(plan, [], time.monotonic())
        self._runs[key] = run
        self.started.emit(key, plan)
        for target in plan.targets:
            # The reply (the report's parse) is made on the doctor's thread.
            read = functools.partial(core.host_reply, target, timeout_s=limit_s)
            # Every doctor is an agent's child: this machine's, or a host's on that host (its agent,
            # over this machine's one ssh session to it; never an ssh session of its own from here).
            remote = None if target.is_local else target.host
            check = AgentDoctor(self, read, _TAIL, host=remote)
            run.checks.append(check)
            # A bound method (the check is the sender), not a lambda holding this object: a check's
            # connection must never be the last holder of its own parent (services.health).
            check.ended.connect(self._on_reply)
            args = {"timeout_s": plan.timeout_s,
                    "hl_smi": self.host_hl_smi(target.host) if remote else plan.hl_smi,
                    "python": "" if remote else self.python}
            check.start({k: v for k, v in args.items() if v}, int(limit_s * 1000))
        return True

    def cancel(self, key: str) -> None:
        """Forget ``key``'s check under way: its children are killed, nothing is emitted for it."""
        run = self._runs.pop(key, None)
        for check in run.checks if run is not None else []:
            check.retire()

    def shutdown(self) -> None:
        for key in list(self._runs):
            self.cancel(key)

    def _on_reply(self, reply: HostHealth) -> None:
        check = self.sender()
        if not isinstance(check, AgentDoctor):
            return
        key = next((k for k, r in self._runs.items() if check in r.checks), None)
        if key is None:
            return  # a cancelled or replaced check
        run = self._runs[key]
        run.replies[run.checks.index(check)] = reply
        if len(run.replies) < len(run.checks):
            return
        from gaudi_gui.core import preflight as core

        del self._runs[key]
        for check in run.checks:
            check.deleteLater()
        replies = [run.replies[i] for i in range(len(run.checks))]
        verdict = core.decide(run.plan, core.combine(replies), elapsed_s=time.monotonic() - run.started_at)
        self.finished.emit(dataclasses.replace(verdict, key=key))
