"""The machine's ONE device loop: a long-running ``hl-smi -Q ... -l N`` child of the agent, parsed as it
streams, feeding every listener (the window's Devices panel and Health, the run meter, the CLI).

Why here: before, the window ran its own hl-smi loop and the run meter a second one on the same cards;
now the loop is the agent's, started when the first listener arrives, at the shortest interval any
listener asked for, and stopped (after ``GRACE_S``) when none listens.

- Listeners: a session that subscribed to ``Ev.DEVICES`` (at ``DEFAULT_INTERVAL_S``) or asked
  ``devices.watch {interval_s, hl_smi?}``; inside the agent, ``add_listener(cb)`` (health, the meter).
- The snapshot rules are ``core.hlsmi.CsvStream``'s (keyed on ``index``; a snapshot ends on a wrap or
  when every known card reported, never on a timer). The card set is seeded from the plain table, read
  at each launch, and the table is read every ``process_interval_s`` for the card processes.
- The child runs in a session of its own; a stop, a restart or the hang watchdog kill its whole group and
  every descendant seen (wrappers such as ``hl-smi.real "$@" | cat`` fork helpers).
- A failing tool is said in words (the command, its exit, its last stderr lines) and restarted with
  exponential back-off; meanwhile ``nvidia-smi`` (where on PATH) or the host's CPU/RAM stand in.
- The hl-smi program is looked up in one place, ``core.hlsmi.hl_smi_program``: the listener's
  ``hl_smi`` (the Devices setting), else ``$GAUDI_GUI_HL_SMI``, else ``hl-smi`` on PATH.

Events: ``Ev.DEVICES {t, samples, processes, source, machine, rejected, rejected_reason}`` (``samples``
are ``DeviceSample.to_dict()`` of the cards, empty when only the host is known; ``machine`` is the
host's CPU/RAM sample) and ``Ev.DEVICES_STATE {state, message, command}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from gaudi_gui.agent import tasks
from gaudi_gui.core import hlsmi
from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.backoff import Backoff
from gaudi_gui.core.device_loop import (
    FIRST_OUTPUT_GRACE_S,
    HANG_FACTOR,
    INTERVAL_RANGE_S,
    PROCESS_INTERVAL_RANGE_S,
    STATE_ABSENT,
    STATE_FAILED,
    STATE_OK,
    STATE_STARTING,
    STATE_STOPPED,
    clamp_interval,
    describe_returncode,
    loop_seconds,
)
from gaudi_gui.core.devices import DeviceSample, ProcessInfo, attach_processes

if TYPE_CHECKING:
    from gaudi_gui.agent.server import Agent, Handler, Session

#: The interval of a listener that did not name one (a bare ``subscribe``), seconds.
DEFAULT_INTERVAL_S = 1.0
DEFAULT_PROCESS_INTERVAL_S = 5.0
#: The loop outlives its last listener by this much (a view closed and opened again keeps it).
GRACE_S = float(os.environ.get("GAUDI_GUI_DEVICES_GRACE_S", "1.0"))


def _backoff_s(text: str) -> tuple[float, float]:
    """``INITIAL[,MAX]`` seconds (tests make the restarts quick); (1, 30) when unset or not numbers."""
    try:
        parts = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        parts = []
    initial = parts[0] if parts and 0 < parts[0] < 3600 else 1.0
    most = parts[1] if len(parts) > 1 and initial <= parts[1] < 3600 else max(initial, 30.0)
    return initial, most


#: First and largest delay before a failed hl-smi is started again (it doubles in between).
BACKOFF_S = _backoff_s(os.environ.get("GAUDI_GUI_DEVICES_BACKOFF_S", ""))
#: How often the listeners are counted (a session's ``unsubscribe`` is not told to services).
CHECK_S = 0.2
#: A table read that outlives this is killed.
TABLE_TIMEOUT_S = 10.0

#: An in-agent listener: gets each ``Ev.DEVICES`` event's fields.
Callback = Callable[[dict[str, Any]], None]


@dataclass
class _Want:
    interval_s: float = DEFAULT_INTERVAL_S
    process_interval_s: float = DEFAULT_PROCESS_INTERVAL_S
    hl_smi: str = ""


class DevicesService:
    """The device loop of this machine, shared by every listener."""

    name = "devices"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        #: session or callback -> what it asked for
        self._wants: dict[Any, _Want] = {}
        self._callbacks: dict[Callback, Callable[[dict[str, Any]], None] | None] = {}
        self.state = STATE_STOPPED
        self.message = ""
        self.command = ""
        self.source = "hl-smi"
        self.latest: dict[str, Any] | None = None
        self.processes: list[ProcessInfo] = []
        self.starts = 0  # hl-smi launches (tests, status)
        self._program = ""
        self._closed = False  # stopped with the agent: nothing starts again
        self._snapshots = 0  # of the hl-smi run now (one ended by the table's card count included)
        self._supervisor: asyncio.Task[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._restart = asyncio.Event()
        self._running_with: tuple[float, float, str] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._seen: set[int] = set()
        self._known_cards: list[int] = []
        self._rejected_total = 0
        self._rejected_reason = ""

    # -- Service ----------------------------------------------------------------------------------
    def ops(self) -> dict[str, Handler]:
        return {"devices.watch": self._op_watch, "devices.unwatch": self._op_unwatch,
                "devices.latest": self._op_latest}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        # Nothing starts a loop or an hl-smi after this; each task is waited for (cancelled again while
        # it runs on: Python 3.11's wait_for can drop a cancel), so none outlives the agent's end
        # and starts an hl-smi that nobody ends (the agent then waited on it for ever).
        self._closed = True
        supervisor, self._supervisor = self._supervisor, None
        await tasks.end(supervisor)
        await tasks.end(self._loop_task)
        self._loop_task = None
        await self._kill()

    def holds(self) -> list[str]:
        return []

    def busy(self) -> list[str]:
        return []  # the loop serves listeners; it never keeps the agent up by itself

    def status(self) -> dict[str, Any]:
        want = self._wanted()
        running = self._loop_task is not None and not self._loop_task.done()
        summary = (f"{self.source}: {self.state}, every {want[0]:g} s for {self._listener_count()} "
                   f"listener(s)" if running and want else "no device loop (nobody listens)")
        return {"state": self.state, "message": self.message, "command": self.command,
                "source": self.source, "listeners": self._listener_count(), "starts": self.starts,
                "summary": summary}

    def subscribed(self, session: Session, ev: str, key: str | None) -> None:
        if ev == Ev.DEVICES.value:
            if self.latest is not None:
                session.send({"ev": Ev.DEVICES.value, **self.latest})
            _log(f"devices: {session.client} (pid {session.peer_pid}) subscribed to the cards")
            self._ensure_supervisor()
        elif ev == Ev.DEVICES_STATE.value:
            session.send({"ev": Ev.DEVICES_STATE.value, "state": self.state, "message": self.message,
                          "command": self.command})

    def session_gone(self, session: Session) -> None:
        self._wants.pop(session, None)
        self._wake()

    # -- the in-agent API -------------------------------------------------------------------------
    def add_listener(self, callback: Callback, interval_s: float = DEFAULT_INTERVAL_S, *,
                     hl_smi: str = "", on_state: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Feed ``callback`` every ``Ev.DEVICES`` event's fields (``on_state`` each state change) until
        ``remove_listener``; the loop runs at least this often while it listens."""
        interval, _ = clamp_interval(interval_s, DEFAULT_INTERVAL_S, INTERVAL_RANGE_S)
        self._wants[callback] = _Want(interval, DEFAULT_PROCESS_INTERVAL_S, hl_smi)
        self._callbacks[callback] = on_state
        self._wake()
        self._ensure_supervisor()

    def remove_listener(self, callback: Callback) -> None:
        self._wants.pop(callback, None)
        self._callbacks.pop(callback, None)
        self._wake()

    # -- operations -------------------------------------------------------------------------------
    async def _op_watch(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        from gaudi_gui.agent.server import Refused

        interval, note = clamp_interval(message.get("interval_s", DEFAULT_INTERVAL_S), DEFAULT_INTERVAL_S,
                                        INTERVAL_RANGE_S)
        table, table_note = clamp_interval(message.get("process_interval_s", DEFAULT_PROCESS_INTERVAL_S),
                                           DEFAULT_PROCESS_INTERVAL_S, PROCESS_INTERVAL_RANGE_S)
        hl_smi = message.get("hl_smi") or ""
        if not isinstance(hl_smi, str) or "\n" in hl_smi or "\0" in hl_smi:
            raise Refused("hl_smi is the path of a program (one line of text)")
        self._wants[session] = _Want(interval, table, hl_smi.strip())
        _log(f"devices: {session.client} (pid {session.peer_pid}) watches every {interval:g} s")
        for name in (Ev.DEVICES.value, Ev.DEVICES_STATE.value):
            session.subs[name] = None
        if message.get("restart"):
            self._running_with = None  # a new loop even with the same settings (the Retry button)
        self._wake()
        self._ensure_supervisor()
        notes = "; ".join(n for n in (note and f"interval_s: {note}",
                                      table_note and f"process_interval_s: {table_note}") if n)
        return {"interval_s": interval, "process_interval_s": table, "note": notes,
                "state": self.state, "message": self.message, "command": self.command}

    async def _op_unwatch(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        self._wants.pop(session, None)
        for name in (Ev.DEVICES.value, Ev.DEVICES_STATE.value):
            session.subs.pop(name, None)
        self._wake()
        return {}

    async def _op_latest(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        return {"latest": self.latest, "state": self.state, "message": self.message, "command": self.command}

    # -- who listens ------------------------------------------------------------------------------
    def _listeners(self) -> list[_Want]:
        wants = [w for owner, w in self._wants.items() if not getattr(owner, "closed", False)]
        for session in self.agent.sessions:
            if Ev.DEVICES.value in session.subs and session not in self._wants:
                wants.append(_Want())
        return wants

    def _listener_count(self) -> int:
        return len(self._listeners())

    def _wanted(self) -> tuple[float, float, str] | None:
        """(interval, table interval, hl_smi) the loop should run with; None: nobody listens."""
        wants = self._listeners()
        if not wants:
            return None
        named = [w.hl_smi for w in wants if w.hl_smi]
        return (min(w.interval_s for w in wants), min(w.process_interval_s for w in wants),
                named[-1] if named else "")

    def _wake(self) -> None:
        self._restart.set()

    def _ensure_supervisor(self) -> None:
        if self._closed:
            return
        if self._supervisor is None or self._supervisor.done():
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def _supervise(self) -> None:
        """Starts the loop when someone listens, restarts it when what they want changes, ends it
        ``GRACE_S`` after the last one left."""
        alone_since: float | None = None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._restart.wait(), CHECK_S)
            self._restart.clear()
            if self._closed:
                return
            wanted = self._wanted()
            running = self._loop_task is not None and not self._loop_task.done()
            if wanted is None:
                if not running:
                    return
                alone_since = alone_since or time.monotonic()
                if time.monotonic() - alone_since >= GRACE_S:
                    await self._end_loop()
                    _log("devices: loop ended (nobody listens)")
                    self._set_state(STATE_STOPPED, "stopped: nobody listens")
                    self._supervisor = None
                    return
                continue
            alone_since = None
            if running and wanted == self._running_with:
                continue
            await self._end_loop()
            self._running_with = wanted
            _log(f"devices: loop for {len(self._listeners())} listener(s), every {wanted[0]:g} s")
            self._loop_task = asyncio.get_running_loop().create_task(self._loop(*wanted))

    async def _end_loop(self) -> None:
        # The task stays known until it is done: a stop() that cancels this wait ends it still.
        task = self._loop_task
        await tasks.end(task)
        if self._loop_task is task:
            self._loop_task = None
        await self._kill()

    # -- the loop ---------------------------------------------------------------------------------
    async def _loop(self, interval_s: float, table_s: float, hl_smi: str) -> None:
        program, explicit = hlsmi.hl_smi_program(hl_smi)
        backoff = Backoff(*BACKOFF_S)
        fallback: asyncio.Task[None] | None = None
        # A restart for a new interval is no news; another program is (its command is shown).
        if self.state in (STATE_STOPPED, STATE_STARTING) or program != self._program:
            self.command = " ".join([program, *hlsmi.query_args(hlsmi.QUERY_FIELDS,
                                                                 loop_s=loop_seconds(interval_s))])
            self._set_state(STATE_STARTING, f"running {program} every {interval_s:g} s")
        self._program = program
        try:
            while not self._closed:
                ok, state, words = await self._run_once(program, explicit, interval_s, table_s, backoff)
                if ok:
                    backoff.reset()
                delay = backoff.next()
                if fallback is None or fallback.done():
                    fallback = asyncio.get_running_loop().create_task(self._fallback(interval_s))
                retry = f"\nretrying in {delay:.0f} s"
                self._set_state(state, words + retry)
                await asyncio.sleep(delay)
                if fallback is not None:
                    fallback.cancel()
                    fallback = None
        finally:
            if fallback is not None:
                fallback.cancel()

    async def _run_once(self, program: str, explicit: bool, interval_s: float, table_s: float,
                        backoff: Backoff) -> tuple[bool, str, str]:
        """One hl-smi loop until it ends: (it streamed, the state, the words for a person)."""
        argv = [program, *hlsmi.query_args(hlsmi.QUERY_FIELDS, loop_s=loop_seconds(interval_s))]
        self.command = " ".join(argv)
        stream = hlsmi.CsvStream(expected=self._known_cards or None)
        spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True))
        try:
            proc = await asyncio.shield(spawn)
        except OSError as exc:
            return False, *self._cannot_start(program, explicit, exc)
        except asyncio.CancelledError:  # a restart while it was being started: it must not live on
            while not spawn.done():  # a second cancel (tasks.end repeats them) must not lose it
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({spawn})
            if not spawn.cancelled() and spawn.exception() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(spawn.result().pid, signal.SIGKILL)
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(spawn.result().wait(), 5.0)
            raise
        self.starts += 1
        self._proc, self._seen = proc, set()
        stderr: deque[str] = deque(maxlen=8)
        err_task = asyncio.get_running_loop().create_task(self._drain(proc, stderr))
        table_task = asyncio.get_running_loop().create_task(self._tables(program, table_s, stream))
        self._snapshots, hung = 0, None
        try:
            assert proc.stdout is not None
            last = time.monotonic()
            while True:
                limit = max(HANG_FACTOR * interval_s, 1.0)
                if self._snapshots == 0:
                    limit = max(limit, FIRST_OUTPUT_GRACE_S)
                try:
                    left = max(0.05, last + limit - time.monotonic())
                    raw = await asyncio.wait_for(proc.stdout.readline(), left)
                except TimeoutError:
                    hung = time.monotonic() - last
                    break
                if not raw:
                    # Its last rows: a whole snapshot only when no card set is known (then they are
                    # all it printed); a partial one is dropped, never shown as every card.
                    tail = stream.flush()
                    if tail:
                        self._snapshots += 1
                        self._known_cards = [s.index for s in tail]
                        self._publish_cards(tail, "hl-smi")
                    break
                last = time.monotonic()
                self._remember_tree(proc.pid)
                before = stream.rejected + stream.bad_values
                snapshot = stream.feed_line(raw.decode("utf-8", "replace"))
                if stream.rejected + stream.bad_values > before:
                    self._rejected_total += stream.rejected + stream.bad_values - before
                    self._rejected_reason = hlsmi.clean_text(stream.errors[-1]) if stream.errors else ""
                if snapshot:
                    self._snapshots += 1
                    self._known_cards = [s.index for s in snapshot]
                    if self.state != STATE_OK:
                        self._set_state(STATE_OK, f"{self.command}: {len(snapshot)} card(s)")
                    backoff.reset()
                    self._publish_cards(snapshot, "hl-smi")
        finally:
            table_task.cancel()
            await self._kill()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(err_task, 1.0)
        said = hlsmi.clean_text("\n".join([ln for ln in stderr if ln.strip()]
                                          + [f"(unparsed: {e})" for e in stream.errors[-3:]]))
        what = (f"printed nothing for {hung:.1f} s and was killed (hung)" if hung is not None
                else describe_returncode(proc.returncode))
        detail = f"{self.command}\n{what}" + (f"\nit said:\n{said}" if said else "\nit printed nothing")
        if self._snapshots == 0:
            detail += "\nno card rows were read: is the habanalabs driver loaded and a card present?"
        return self._snapshots > 0, STATE_FAILED, detail

    def _cannot_start(self, program: str, explicit: bool, exc: OSError) -> tuple[str, str]:
        from gaudi_gui.core.health import Roots, gaudi_evidence

        reason = exc.strerror or str(exc)
        if explicit or shutil.which(program) is not None:
            return STATE_FAILED, (f"{self.command}\n{reason}\nCheck the hl-smi path in the settings or "
                                  "GAUDI_GUI_HL_SMI.")
        evidence = gaudi_evidence(Roots.from_env())
        if evidence:
            return STATE_FAILED, (f"{self.command}\n{reason}\nno hl-smi, but {evidence}: the cards cannot be "
                                  "read. Install habanalabs-firmware-tools or give its path in the settings "
                                  "or GAUDI_GUI_HL_SMI.")
        return STATE_ABSENT, (f"{self.command}\n{reason}\nhl-smi comes with Intel Gaudi's driver package "
                              "(habanalabs-firmware-tools); install it or set GAUDI_GUI_HL_SMI.")

    @staticmethod
    async def _drain(proc: asyncio.subprocess.Process, lines: deque[str]) -> None:
        assert proc.stderr is not None
        while raw := await proc.stderr.readline():
            lines.append(raw.decode("utf-8", "replace").rstrip())

    async def _tables(self, program: str, table_s: float, stream: hlsmi.CsvStream) -> None:
        """The plain table now (its cards end the first snapshot early) and every ``table_s``: the
        card processes (the only place PIDs appear), described by psutil."""
        while True:
            text = await _run_text([program], TABLE_TIMEOUT_S)
            if text is not None:
                result = hlsmi.parse_table(text)
                if result.samples and stream.known is None:
                    snapshot = stream.expect(s.index for s in result.samples)
                    if snapshot:  # a snapshot of this run (the hang watchdog's first grace is over)
                        self._snapshots += 1
                        self._publish_cards(snapshot, "hl-smi")
                from gaudi_gui.core import host
                self.processes = await asyncio.to_thread(host.describe_processes, result.processes)
            await asyncio.sleep(table_s)

    async def _fallback(self, interval_s: float) -> None:
        """While hl-smi does not stream: NVIDIA GPUs (nvidia-smi) or the host alone, every interval."""
        from gaudi_gui.core import host
        nvidia = shutil.which("nvidia-smi") is not None
        while True:
            cards: list[DeviceSample] = []
            if nvidia:
                text = await _run_text(["nvidia-smi", *host.nvidia_args()], TABLE_TIMEOUT_S)
                cards = host.parse_nvidia(text) if text else []
            if cards:
                self._publish_cards(cards, "nvidia-smi")
            else:
                self.source = "host"
                self._publish([], "host")
            await asyncio.sleep(interval_s)

    # -- publishing -------------------------------------------------------------------------------
    def _publish_cards(self, samples: list[DeviceSample], source: str) -> None:
        now = time.time()
        for s in samples:
            if not s.timestamp:
                s.timestamp = now
        if self.processes and samples and samples[0].kind == "hpu":
            attach_processes(samples, self.processes)
        self.source = source
        self._publish(samples, source)

    def _publish(self, samples: list[DeviceSample], source: str) -> None:
        from gaudi_gui.core import host
        fields: dict[str, Any] = {
            "t": time.time(), "samples": [s.to_dict() for s in samples],
            "processes": [p.to_dict() for p in self.processes] if source == "hl-smi" else [],
            "source": source, "machine": host.host_sample().to_dict(),
            "rejected": self._rejected_total, "rejected_reason": self._rejected_reason}
        self.latest = fields
        self.agent.publish(Ev.DEVICES, **fields)
        for callback in list(self._callbacks):
            callback(fields)

    def _set_state(self, state: str, message: str) -> None:
        if (state, message) == (self.state, self.message):
            return
        self.state, self.message = state, message
        fields = {"state": state, "message": message, "command": self.command}
        self.agent.publish(Ev.DEVICES_STATE, **fields)
        for on_state in list(self._callbacks.values()):
            if on_state is not None:
                on_state(fields)

    # -- the child's tree -------------------------------------------------------------------------
    def _remember_tree(self, pid: int) -> None:
        with contextlib.suppress(psutil.Error):
            self._seen.update(p.pid for p in psutil.Process(pid).children(recursive=True))

    async def _kill(self) -> None:
        """End the hl-smi loop, its group and every descendant seen while it ran."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._remember_tree(proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in self._seen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._seen = set()
        with contextlib.suppress(ProcessLookupError, TimeoutError):
            await asyncio.wait_for(proc.wait(), 5.0)


def _log(text: str) -> None:
    from gaudi_gui.agent.server import _log as log
    log(text)


async def _run_text(argv: list[str], timeout_s: float) -> str | None:
    """``argv``'s standard output when it ends with 0 within ``timeout_s``; None otherwise (its whole
    group killed)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5.0)
        raise_cancel = asyncio.current_task()
        if raise_cancel is not None and raise_cancel.cancelling():
            raise
        return None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # a wrapper's helpers left in its group
    return out.decode("utf-8", "replace") if proc.returncode == 0 else None


def make(agent: Agent) -> DevicesService:
    return DevicesService(agent)
