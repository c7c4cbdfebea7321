"""This machine's health: ``gaudi-gui doctor --json`` run as the agent's child, at a lower CPU priority
than the window (nice +10, set in the child before the doctor starts), its report published as
``Ev.HEALTH``.

Why here: the window used to start the doctor itself (a thread per check, a child per host); the window
now starts no process, and the checks that run in the background must never take the cores from the
window or a training run. While anyone subscribes to ``Ev.HEALTH`` the check runs again every
``interval_s`` (the last ``health.check``'s or ``health.watch``'s), with the hl-smi and cards last asked.

``health.check {hl_smi?, modules?, timeout_s?}`` answers ``{report}`` (``core.health.HostHealth.to_json``;
a doctor that crashed, timed out or printed no report is a host that did not answer, with its exit and
last lines, as the start gate reads it: ``core.preflight.host_reply``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from gaudi_gui.core.agentwire import Ev

if TYPE_CHECKING:
    from gaudi_gui.agent.server import Agent, Handler, Session

#: How much lower than the agent (and the window) a background check runs.
NICE = 10
DEFAULT_INTERVAL_S = 300.0
DEFAULT_TIMEOUT_S = 120.0


def _lower_priority() -> None:
    """In the doctor child, before its program: low CPU priority for it and everything it starts."""
    with contextlib.suppress(OSError):
        os.nice(NICE)


class HealthService:
    """The doctor as the agent's child; one check at a time (a second asker shares the running one)."""

    name = "health"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.latest: dict[str, Any] | None = None
        self.checked_at = 0.0
        self.interval_s = DEFAULT_INTERVAL_S
        self._args: dict[str, Any] = {}
        self._running: asyncio.Task[dict[str, Any]] | None = None
        self._periodic: asyncio.Task[None] | None = None
        #: The running doctor's pid (0: none); what ``status`` says.
        self.child_pid = 0

    # -- Service ----------------------------------------------------------------------------------
    def ops(self) -> dict[str, Handler]:
        return {"health.check": self._op_check, "health.watch": self._op_watch}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for task in (self._periodic, self._running):
            if task is not None:
                task.cancel()

    def holds(self) -> list[str]:
        return []

    def busy(self) -> list[str]:
        return []

    def status(self) -> dict[str, Any]:
        when = f"last checked {time.time() - self.checked_at:.0f} s ago" if self.checked_at else "not checked"
        return {"checking": self.child_pid or None, "checked_at": self.checked_at or None,
                "summary": f"doctor running (pid {self.child_pid})" if self.child_pid else when}

    def subscribed(self, session: Session, ev: str, key: str | None) -> None:
        if ev != Ev.HEALTH.value:
            return
        if self.latest is not None:
            session.send({"ev": Ev.HEALTH.value, "report": self.latest, "checked_at": self.checked_at})
        if self._periodic is None or self._periodic.done():
            self._periodic = asyncio.get_running_loop().create_task(self._every())

    def session_gone(self, session: Session) -> None:
        return None

    # -- operations -------------------------------------------------------------------------------
    async def _op_check(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        self._args = self._read_args(message)
        report = await self.check()
        return {"report": report}

    async def _op_watch(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        """Subscribe to ``Ev.HEALTH`` with the checks' interval and arguments; a check runs now when
        none ran yet."""
        from gaudi_gui.agent.server import Refused
        try:
            interval = float(message.get("interval_s", DEFAULT_INTERVAL_S))
        except (TypeError, ValueError):
            raise Refused("interval_s is a number of seconds") from None
        if not 1.0 <= interval <= 86400.0:
            raise Refused("interval_s is between 1 and 86400 seconds")
        self.interval_s = interval
        self._args = self._read_args(message)
        session.subs[Ev.HEALTH.value] = None
        self.subscribed(session, Ev.HEALTH.value, None)
        return {"interval_s": interval}

    @staticmethod
    def _read_args(message: dict[str, Any]) -> dict[str, Any]:
        from gaudi_gui.agent.server import Refused
        hl_smi = message.get("hl_smi") or ""
        if not isinstance(hl_smi, str) or "\n" in hl_smi or "\0" in hl_smi:
            raise Refused("hl_smi is the path of a program (one line of text)")
        modules = message.get("modules") or []
        if not isinstance(modules, list) or not all(isinstance(m, int) and not isinstance(m, bool)
                                                    and 0 <= m < 64 for m in modules):
            raise Refused("modules is a list of module ids (whole numbers from 0)")
        try:
            timeout = float(message.get("timeout_s") or DEFAULT_TIMEOUT_S)
        except (TypeError, ValueError):
            raise Refused("timeout_s is a number of seconds") from None
        return {"hl_smi": hl_smi.strip(), "modules": modules, "timeout_s": max(1.0, min(timeout, 3600.0))}

    # -- the check --------------------------------------------------------------------------------
    async def check(self) -> dict[str, Any]:
        """Run the doctor (or join the one running) and publish its report."""
        if self._running is None or self._running.done():
            self._running = asyncio.get_running_loop().create_task(self._run_doctor(dict(self._args)))
        return await asyncio.shield(self._running)

    async def _every(self) -> None:
        while self.agent.listeners(Ev.HEALTH):
            if time.time() - self.checked_at >= self.interval_s:
                with contextlib.suppress(Exception):
                    await self.check()
            await asyncio.sleep(min(1.0, self.interval_s))

    async def _run_doctor(self, args: dict[str, Any]) -> dict[str, Any]:
        from gaudi_gui.core.child import Outcome
        from gaudi_gui.core.preflight import Target, host_reply

        argv = [sys.executable, "-m", "gaudi_gui", "doctor", "--json", "--background"]
        if args.get("hl_smi"):
            argv += ["--hl-smi", args["hl_smi"]]
        if args.get("modules"):
            argv += ["--cards", ",".join(str(m) for m in args["modules"])]
        timeout_s = float(args.get("timeout_s") or DEFAULT_TIMEOUT_S)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, preexec_fn=_lower_priority)
        except OSError as exc:
            outcome = Outcome(tail=(f"could not start the doctor: {exc.strerror or exc}",))
        else:
            self.child_pid = proc.pid
            timed_out = False
            try:
                out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
            except TimeoutError:
                timed_out = True
                out, err = b"", b""
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its hl-smi calls go with it
                if proc.returncode is None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(proc.wait(), 5.0)
                self.child_pid = 0
            text = out.decode("utf-8", "replace")
            tail = [ln for ln in (text.splitlines()[-10:] + err.decode("utf-8", "replace").splitlines()[-20:])
                    if ln.strip()]
            outcome = Outcome(text, proc.returncode, tuple(tail), timed_out)
        report = host_reply(Target("local"), outcome, timeout_s=timeout_s).to_json()
        self.latest, self.checked_at = report, time.time()
        self.agent.publish(Ev.HEALTH, report=report, checked_at=self.checked_at)
        return report


def make(agent: Agent) -> HealthService:
    return HealthService(agent)
