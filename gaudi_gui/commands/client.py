"""The foreground ``train``/``serve``/``eval``/``download``/``benchmark``/``calibrate`` as clients of this
machine's agent.

The command checks the job as it always did (bad input: one line, exit 2, before the agent is asked),
then asks the agent (started on demand) to start it (``job.start``: the kind's own ``--detach``, so the
job has a run folder that ``runs list`` and the window see, and it outlives this terminal), and follows
its log, events and record to the end, printing the console lines as they come (the command's own
one-line messages on stderr, as in-process). Ctrl-C (or SIGTERM, SIGHUP) asks the agent to stop it (a
training run saves a checkpoint first); a second one kills it. The exit status is the job's outcome,
with the numbers the in-process command gives: 0 finished (and a stopped training run or server), 130
another kind stopped, else the job's own exit status (1 where it has none).

``--no-agent`` (and ``GAUDI_GUI_NO_AGENT=1``, which it sets for its children) keeps the job in this
process: for debugging, and for Slurm batch steps (a step inside a Slurm job runs so by itself). A
command run by a supervisor (``--events``, ``--announce``), one that prints for a program (``--json``),
starts in the background (``--detach``) or runs elsewhere (``--host``, ``--hosts``, ``--slurm``) keeps
its own way.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gaudi_gui.commands.terminal import printable, say
from gaudi_gui.core.agentwire import AgentError, Connection
from gaudi_gui.core.runstore import FINAL_STATES

NO_AGENT_ENV = "GAUDI_GUI_NO_AGENT"
NO_AGENT_HELP = ("run the job in this process, not through this machine's agent (no run folder for a "
                 "serve, eval or download unless --detach; for debugging and Slurm batch steps, which "
                 "run so by themselves; also GAUDI_GUI_NO_AGENT=1)")
#: Kinds whose in-process command ends with 0 when stopped (a training run saves its checkpoint, a server
#: is stopped as it should be); the others exit 130 as an interrupted command does.
STOPPED_OK = ("train", "serve")
#: Kinds whose in-process command supervises its job itself and says the supervisor's notes (what a
#: stop waits for, a checkpoint saved, the meter's summary): through the agent, the same notes are read
#: from the run folder's supervisor.log. Serve, eval and download say their own words.
SUPERVISED = ("train", "benchmark", "calibrate")
#: What the command's stop signals (Ctrl-C, a terminal closed, a SIGTERM) are counted by.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: How long a supervisor's note waits before it is said: its last words repeat the outcome this command
#: says, and the job's final state (which the agent sends within a poll or two) comes first.
NOTE_HOLD_S = 1.0
#: How long one turn of following waits for the agent's messages before it looks at stops and notes.
TURN_S = 0.5

#: Called with each of the job's events (``@gaudi-gui`` protocol records): the command's own way of
#: showing them to a person (its log holds only its plain lines).
Shown = Callable[[dict[str, Any]], None]


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-agent", dest="no_agent", action="store_true", help=NO_AGENT_HELP)


def wanted(args: argparse.Namespace) -> bool:
    """Whether this foreground command goes through the agent; when not, its children are told so."""
    in_process = (getattr(args, "no_agent", False) or os.environ.get(NO_AGENT_ENV) == "1"
                  or os.environ.get("SLURM_JOB_ID") or getattr(args, "events", False)
                  or getattr(args, "announce", "") or getattr(args, "json", False)
                  or getattr(args, "detach", False) or getattr(args, "stop_orphan", False)
                  or getattr(args, "slurm", False) or (getattr(args, "hosts", "") or "").strip()
                  or (getattr(args, "host", "") or "").strip() not in ("", "local"))
    if getattr(args, "no_agent", False):
        os.environ[NO_AGENT_ENV] = "1"  # its children (the meter) keep to themselves too
    return not in_process


class _Console:
    """Where the job's lines go: its plain lines on stdout, the command's own messages (``gaudi-gui
    KIND: …`` and the ``  | `` lines under them) on stderr. A reader of stdout that went away
    (``gaudi-gui train … | head -1``) ends the printing there, never the job: said once on stderr, and
    stdout is pointed at /dev/null so no later print (nor the flush at exit) fails again."""

    def __init__(self, kind: str, said: Sequence[str] = ()) -> None:
        self.kind = kind
        self.closed = False
        #: What went to stderr (the command's notes before the start, then the job's own messages).
        self.said: list[str] = list(said)
        #: The job said on its stderr what went wrong (a line of its own, not a note).
        self.job_said = False
        self._to_stderr = False

    def out(self, text: str) -> None:
        if self.closed:
            return
        try:
            print(text, flush=True)
        except OSError as exc:
            if not isinstance(exc, BrokenPipeError) and exc.errno not in (errno.EPIPE, errno.EBADF):
                raise
            self.stdout_gone()

    def stdout_gone(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        say(f"gaudi-gui {self.kind}: stdout was closed (its reader went away): no more lines there; the "
            "job goes on until it ends or Ctrl-C")

    def line(self, raw: str) -> None:
        """One line of the job's log."""
        text = printable(raw)
        if text.startswith(f"gaudi-gui {self.kind}: ") or (self._to_stderr and text.startswith("  | ")):
            self._to_stderr = True
            if text not in self.said or text.startswith("  | "):  # a note said before the start: once
                self.said.append(text)
                self.job_said = self.job_said or ": note: " not in text
                say(text)
            return
        self._to_stderr = False
        self.out(text)

    def show(self, shown: Shown, event: dict[str, Any]) -> None:
        try:
            shown(event)
        except OSError as exc:
            if not isinstance(exc, BrokenPipeError) and exc.errno not in (errno.EPIPE, errno.EBADF):
                raise
            self.stdout_gone()


class _Notes:
    """The job's supervisor's own notes (``supervisor.log`` in its run folder: what a stop waits for, a
    checkpoint saved, the meter's summary), said on stderr as the in-process command says them. Each
    note waits ``NOTE_HOLD_S``: the supervisor's last words repeat the outcome this command says."""

    def __init__(self, folder: str) -> None:
        """``folder`` "": no notes to say."""
        self.path = Path(folder) / "supervisor.log" if folder else None
        self.offset = 0
        self.partial = b""
        self.pending: list[tuple[float, str]] = []
        #: The job's state is final: what its supervisor says now is its last words (``end``).
        self.final = False

    def _read(self) -> list[str]:
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(1 << 20)
        except OSError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [printable(line.decode("utf-8", "replace")) for line in lines if line.strip()]

    def pump(self) -> None:
        if self.final:
            return
        now = time.monotonic()
        self.pending += [(now, line) for line in self._read()]
        while self.pending and now - self.pending[0][0] >= NOTE_HOLD_S:
            say(self.pending.pop(0)[1])

    def end(self, record: dict[str, Any]) -> None:
        summary = str(record.get("summary") or "")
        for line in [*(line for _t, line in self.pending), *self._read()]:
            if not (summary and summary in line) and not line.startswith(("run folder:", "log:")):
                say(line)


def run_job(kind: str, words: list[str], *, config: dict[str, Any] | None = None, runs_dir: str = "",
            shown: Shown | None = None, said: Sequence[str] = ()) -> int:
    """Start the job through the agent and follow it to its end; its outcome as the exit status.
    ``shown``: the command's way of showing the job's events; ``said``: the notes the command printed
    already (its start, which checks the job again, says them too)."""
    job: dict[str, Any] = {"args": words, **({"config": config} if config is not None else {})}
    stops = [0]

    def on_signal(signum: int, _frame: object) -> None:
        stops[0] += 1

    # Counted from the start: a Ctrl-C while the agent starts or the job is being started stops the job
    # once it runs (no job is left behind unseen); the handler replaces an inherited SIG_IGN (nohup).
    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        try:
            conn = Connection.open(client="cli")
        except (AgentError, OSError) as exc:
            say(f"gaudi-gui {kind}: this machine's agent did not start: {exc} (or run it with --no-agent)")
            return 1
        with conn:
            if stops[0]:
                say("interrupted")
                return 130
            try:
                reply = conn.request("job.start", timeout=300, kind=kind, job=job, runs_dir=runs_dir,
                                     cwd=os.getcwd(), env=dict(os.environ), whole_env=True)
            except AgentError as exc:
                words_said = str(exc)
                # A refusal is the command's own check (bad input: 2); the agent lost or failing is not.
                lost = words_said.startswith(("the agent did not answer", "the agent closed",
                                              "the agent failed on"))
                say(f"gaudi-gui {kind}: {words_said}")
                return 1 if lost else 2
            return _follow(conn, kind, reply, stops, shown=shown, said=said)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _follow(conn: Connection, kind: str, reply: dict[str, Any], stops: list[int], *, shown: Shown | None,
            said: Sequence[str]) -> int:
    console = _Console(kind, said)
    for note in reply.get("notes") or []:
        if note not in console.said:
            console.said.append(note)
            say(note)
    record = reply["job"]
    job_id = record["job_id"]
    console.out(f"run folder: {record['folder']} (through the agent; `gaudi-gui runs stop {job_id}` stops "
                "it; --no-agent: in this process)")
    notes = _Notes(record["folder"] if kind in SUPERVISED else "")
    try:
        conn.request("subscribe", events=["log", "job", *(["event"] if shown else [])], key=job_id)
        asked = 0
        while True:
            notes.pump()
            if stops[0] > asked:
                now = stops[0] > 1
                asked = stops[0]
                try:
                    words = str(conn.request("job.stop", job_id=job_id, now=now)["words"])
                except AgentError as exc:
                    say(f"gaudi-gui {kind}: {exc}")
                else:
                    if kind not in SUPERVISED:  # else its supervisor's note says it, with what it waits for
                        say(f"{words} (Ctrl-C again: kill now)" if not now else words)
            turn = time.monotonic()
            for message in conn.stream(timeout=TURN_S):
                if stops[0] > asked or time.monotonic() - turn > TURN_S:
                    conn.events.insert(0, message)  # taken next turn, after the stop or the notes
                    break
                if message.get("job_id") != job_id:
                    continue
                ev = message.get("ev")
                if ev == "log":
                    for line in message["lines"]:
                        console.line(line)
                elif ev == "event" and shown is not None:
                    for event in message.get("events") or []:
                        console.show(shown, event)
                elif ev == "job":
                    record = message["job"]
                    notes.final = notes.final or record["state"] in FINAL_STATES
                    if record["state"] in FINAL_STATES and not record.get("alive"):
                        notes.end(record)
                        return _ended(kind, record, console)
    except AgentError as exc:
        say(f"gaudi-gui {kind}: {exc}; the job goes on: gaudi-gui runs follow {job_id}, gaudi-gui runs stop "
            f"{job_id}")
        return 1


def _ended(kind: str, record: dict[str, Any], console: _Console) -> int:
    """The last words and the exit status, as the in-process command gives them."""
    state, summary, folder = record["state"], str(record.get("summary") or record["state"]), record["folder"]
    if state == "finished" or (state == "stopped" and kind in STOPPED_OK):
        say(f"{summary}\nrun folder: {folder}")
        return 0
    if state in ("stopped", "killed") and kind not in STOPPED_OK:
        say(f"gaudi-gui {kind}: {summary}")
        return 130
    if kind == "train":
        say(f"gaudi-gui train: {summary}\nlog: {folder}/log.txt")
        return 1
    if not console.job_said:  # else the command said why itself, on its stderr, as in-process
        say(f"gaudi-gui {kind}: {summary.removeprefix('Failed: ')}")
    code = record.get("exit_code")
    return code if isinstance(code, int) and 0 < code < 126 else 1


__all__ = ["NO_AGENT_ENV", "Shown", "add_argument", "run_job", "wanted"]
