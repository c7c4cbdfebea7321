"""Stopping a training run exactly: the recorded ranks, never the launcher, never a recycled pid.

accelerate's single-process launcher answers SIGTERM by terminating its child and SIGKILLing it 5 s
later, so a Stop that reaches the launcher kills a run mid-save. ``Stopper.request`` therefore
signals only the processes the ranks recorded in ``<run>/ranks/`` (checked against their create
times); each rank then saves a checkpoint at the end of its current step and exits. Before any rank
has recorded itself there is no training state to save, and the launch tree is simply ended.
``kill_now`` is the escalation (grace period over, a second Stop, a second Ctrl-C): SIGKILL to the
ranks, to every descendant of the launcher seen since the stop began, and to the launcher's own
process group (only when it leads one that is not ours). Qt-free; the CLI and the Qt service share it.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from gaudi_gui.core import proctree
from gaudi_gui.core.proctree import ProcessRef
from gaudi_gui.core.runstore import Run

#: What tells a supervisor to kill its run now (``runs stop --now``); SIGTERM asks for a stop with a
#: checkpoint first.
KILL_NOW_SIGNAL = signal.SIGUSR2


@dataclass
class Stopper:
    run: Run
    launcher: ProcessRef | None = None
    requested_at: float = 0.0
    #: "ranks" (SIGTERM sent to the ranks), "tree" (nothing to save: the launch was ended), or
    #: "pending" (the launcher has not started yet: end it as soon as it has).
    mode: str = ""
    killed: bool = False
    #: Why kill_now ran: "grace" (the grace period ran out) or "request" (a second Stop / Ctrl-C).
    kill_reason: str = ""
    signalled: list[ProcessRef] = field(default_factory=list)
    #: Processes sent SIGKILL: a process still dying (flushing to a slow disk) is not a leftover.
    kill_sent: set[ProcessRef] = field(default_factory=set)
    seen: dict[int, ProcessRef] = field(default_factory=dict)
    #: The launcher is a command of ours that ends its own children on SIGTERM (Serve, Evaluate:
    #: core.jobkind): a stop signals its process group, not ranks ("launcher" mode).
    graceful: bool = False

    def _remember_tree(self) -> None:
        if self.launcher is not None and self.launcher.is_alive():
            for ref in proctree.descendants(self.launcher.pid):
                self.seen[ref.pid] = ref
        for ref in self.run.rank_refs():
            self.seen[ref.pid] = ref

    def request(self) -> str:
        """Ask the run to stop; returns a sentence saying what was done."""
        if not self.requested_at:
            self.requested_at = time.time()
        self._remember_tree()
        ranks = [r for r in self.run.rank_refs() if r.is_alive()]
        if self.graceful and self.launcher is not None:
            self.mode = "launcher"
            if not proctree.signal_group(self.launcher, signal.SIGTERM):
                self.launcher.signal(signal.SIGTERM)
            return f"SIGTERM sent to the command (pid {self.launcher.pid}): it ends its own processes"
        if ranks:
            self.signalled = [r for r in ranks if r.signal(signal.SIGTERM)]
            self.mode = "ranks"
            return (f"SIGTERM sent to {len(self.signalled)} rank(s) (pid "
                    f"{', '.join(str(r.pid) for r in self.signalled)}): each saves a checkpoint at "
                    f"the end of its current step")
        if self.launcher is None:
            self.mode = "pending"
            return "stop requested before the launcher started: it is ended as soon as it starts"
        self.mode = "tree"
        self.kill_now("tree")
        return "no rank had started training yet: the launch was ended (nothing to save)"

    def kill_now(self, reason: str = "request") -> None:
        self.killed = self.killed or self.mode != "tree"
        self.kill_reason = self.kill_reason or reason
        self._remember_tree()
        for ref in list(self.seen.values()):
            if ref.signal(signal.SIGKILL):
                self.kill_sent.add(ref)
        if self.launcher is not None:
            proctree.signal_group(self.launcher, signal.SIGKILL)
            self.launcher.signal(signal.SIGKILL)

    def elapsed(self) -> float:
        return time.time() - self.requested_at if self.requested_at else 0.0

    def leftovers(self) -> list[ProcessRef]:
        """Processes of the run that are still alive (after the launcher ended, should be none)."""
        self._remember_tree()
        return [r for r in self.seen.values() if r.is_alive() and r not in self.kill_sent]


__all__ = ["KILL_NOW_SIGNAL", "Stopper"]
