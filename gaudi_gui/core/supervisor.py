"""The one supervisor loop: start a prepared run's launcher, follow it, stop it, and write how it ended.

Every local training run goes through :func:`supervise`, whoever asked for it: ``gaudi-gui train`` in
a terminal, its ``--detach`` background child (what a workstation starts on a host over SSH), and the
Qt app, which runs that same ``train --detach`` for a run on this machine and follows it with
``runs follow``. So stop, grace, kill-now, step writes, waiting for killed ranks, leftovers and the
outcome are decided here once, for every placement (DESIGN.md, "One supervisor loop").

What the loop does:

- starts ``PreparedRun.argv`` in a session of its own, records the launcher (pid and create time) in
  the run's status, and hands every console line to ``echo`` (secrets redacted). A training run's
  launcher writes log.txt itself (tee), so a supervisor with no one to echo to (``echo=None``: a
  background one, its stdout /dev/null) does not read the console at all: every line read, redacted
  and thrown away cost it CPU on the cores the run computes on;
- reads the run's events.jsonl: the step and max_steps go into the status at most once every
  ``STEP_WRITE_S`` (``runs list``, the Runs table and ``runs follow`` show progress), checkpoint and
  error events become notes for ``say``;
- a stop request (``signals.count`` grew) asks the ranks for a checkpoint (``core.stopper``), a second
  one, or one named ``KILL_NOW_SIGNAL``, kills at once, and the ranks are killed when ``grace_s``
  runs out; while it stops, a note every 5 s says what it waits for ("saving checkpoint… N s");
- at the end, processes already sent SIGKILL that are still dying are waited for (at most
  ``DYING_WAIT_S``): a run's cards are not free until its ranks are gone. Processes that outlived the
  launcher are then killed (and waited for), and the outcome (``core.outcome``) is written with the
  launcher's exit code;
- the run meter (``core.meter``) samples the run's own cards from before the launcher starts until
  its processes are gone, into meter.jsonl; its summary (wall time, card-hours, energy and its
  source, power, utilization, hl-smi's memory), with the Gaudi compile meter
  (``core.hpu_metrics``) of a Gaudi run, is written to meter-summary.json at the end (status.json
  keeps its fields: the supervisor is still its only writer).

Qt-free and torch-free; signal handlers are the caller's (only a main thread may install them).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from gaudi_gui.core import events as events_mod
from gaudi_gui.core import hpu_metrics, jobkind, meter_words, meter_work
from gaudi_gui.core import meter as meter_mod
from gaudi_gui.core.events import EventFollower, EventType
from gaudi_gui.core.outcome import outcome_from_events
from gaudi_gui.core.prepare import PreparedRun
from gaudi_gui.core.proctree import ProcessRef
from gaudi_gui.core.progress import RunProgress, note
from gaudi_gui.core.runstore import Run, RunStatus
from gaudi_gui.core.secrets import redact_lines
from gaudi_gui.core.stopper import KILL_NOW_SIGNAL, Stopper

#: Seconds between two writes of the run's step into its status file while it trains (a fast model
#: logs 100 steps/s; each write is a whole-file replace).
STEP_WRITE_S = 2.0
#: How long the end of a run waits for processes already sent SIGKILL to disappear, and how often
#: it looks.
DYING_WAIT_S = 30.0
DYING_POLL_S = 0.2
#: Seconds between two "saving checkpoint… N s" notes while a stop waits.
NOTE_EVERY_S = 5.0
#: How long one turn of the loop waits for a console line.
TURN_S = 0.25
#: The shortest turn while the console is busy: a run that prints a line every few milliseconds (a
#: step a line and its progress bar: a small model logs 30 steps/s) is read in batches, at most 20 turns
#: a second (each reads the events file too), not a turn a line on the cores the run computes on
#: (0.8 ms of this process's CPU a step of the demo DPO before). A line waits at most this long.
BUSY_TURN_S = 0.05


class StopRequests(Protocol):
    """What the loop reads to learn about stop requests: ``count`` grows by one per request (a signal
    handler counts them), ``last`` names the newest (``KILL_NOW_SIGNAL.name`` kills at once)."""

    count: int
    last: str


@dataclass(frozen=True)
class Supervised:
    """How a supervised run ended (what was also written to its status)."""

    #: The final state: finished / stopped / killed / failed.
    state: str
    #: One human sentence (with the leftovers and any process still dying appended).
    summary: str
    #: The launcher's exit code (negative: killed by that signal); None when it never started.
    exit_code: int | None
    #: Processes that outlived the launcher and were killed at the end.
    leftover_pids: tuple[int, ...] = ()
    #: Processes sent SIGKILL that were still alive after ``DYING_WAIT_S``.
    dying_pids: tuple[int, ...] = ()
    #: The run meter's summary (what meter-summary.json holds); None when the meter could not run.
    meter: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """The run ended as asked: finished, or stopped (with or without a checkpoint)."""
        return self.state in ("finished", "stopped")


def describe_exit(code: int) -> str:
    """The launcher's exit as the status records it: 'launcher exited with code 1', 'launcher killed by
    signal 9 (SIGKILL)'."""
    if code >= 0:
        return f"launcher exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"launcher killed by signal {-code}"
    return f"launcher killed by signal {-code} ({name})"


def wait_gone(refs: Iterable[ProcessRef], timeout_s: float = DYING_WAIT_S,
              poll_s: float = DYING_POLL_S) -> list[ProcessRef]:
    """Wait until none of ``refs`` is alive (a zombie counts as gone: it holds no memory and no
    device), at most ``timeout_s``; returns those still alive then (empty: all gone)."""
    alive = [r for r in refs if r.is_alive()]
    deadline = time.monotonic() + timeout_s
    while alive and time.monotonic() < deadline:
        time.sleep(poll_s)  # polling processes that are not our children, with a deadline
        alive = [r for r in alive if r.is_alive()]
    return alive


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for raw in stream:
        lines.put(raw.rstrip("\n"))
    lines.put(None)


@dataclass
class _Loop:
    """The state of one supervised run while its launcher lives."""

    run: Run
    grace_s: float
    signals: StopRequests
    say: Callable[[str], None]
    launcher: ProcessRef | None = None
    follower: EventFollower | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    progress: RunProgress = field(default_factory=RunProgress)
    stopper: Stopper | None = None
    handled: int = 0
    last_note: float = 0.0
    step_written_at: float = -STEP_WRITE_S
    #: The job's kind (core.jobkind.KINDS): what its events mean and how it is stopped.
    run_kind: str = "train"

    def take_events(self) -> None:
        assert self.follower is not None
        for event in self.follower.read():
            self.events.append(event)
            if self.progress.apply(event) is not None:
                self._write_step()
            elif event.get("type") in (EventType.CHECKPOINT_SAVED, EventType.ERROR):
                self.say(note(event))
            if self.run_kind != "train":
                # Serve's endpoint and requests, Evaluate's rows and result (one a second at most).
                changes = jobkind.take(self.run, event)
                if changes:
                    with contextlib.suppress(OSError):
                        self.run.update_status(**changes)

    def _write_step(self) -> None:
        now = time.monotonic()
        if now - self.step_written_at < STEP_WRITE_S:
            return
        self.step_written_at = now
        with contextlib.suppress(OSError):  # a full disk must not end the supervision
            self.run.update_status(step=self.progress.step, max_steps=self.progress.max_steps)

    def take_stop_requests(self) -> None:
        if self.signals.count <= self.handled:
            return
        self.handled = self.signals.count
        last = self.signals.last
        if last == KILL_NOW_SIGNAL.name:
            # `gaudi-gui runs stop --now` (a workstation's "Kill now"): no checkpoint.
            self.stopper = self.stopper or Stopper(self.run, self.launcher)
            self.say("kill requested: killing the run now (no checkpoint from this stop)")
            self.stopper.kill_now("request")
        elif self.stopper is None:
            self.stopper = Stopper(self.run, self.launcher, graceful=self.run_kind != "train")
            self.say(f"\n{last}: stopping — {self.stopper.request()}; killed after {self.grace_s:g} s "
                     f"(Ctrl-C again: kill now)")
        else:
            self.say(f"{last} again: killing the run now (no checkpoint from this stop)")
            self.stopper.kill_now("request")

    def watch_stop(self) -> None:
        """While a stop waits: kill when the grace period is over, else a note every few seconds."""
        if self.stopper is None:
            return
        now = time.time()
        if self.stopper.elapsed() > self.grace_s and not self.stopper.killed:
            self.say(f"the ranks did not end within {self.grace_s:g} s: killing them")
            self.stopper.kill_now("grace")
        elif now - self.last_note >= NOTE_EVERY_S:
            self.last_note = now
            saving = self.progress.saving_since
            self.say(f"saving checkpoint… {now - saving:.0f} s" if saving
                     else "checkpoint saved; waiting for the processes to end…" if self.progress.checkpoint
                     else f"waiting for the current step to end… {self.stopper.elapsed():.0f} s")


def supervise(prepared: PreparedRun | jobkind.ChildJob, *, grace_s: float, signals: StopRequests,
              say: Callable[[str], None], echo: Callable[[str], None] | None) -> Supervised:
    """Run ``prepared`` to its end: the one supervisor loop for the GUI and the CLI on every placement,
    for every kind of job. A training run's launcher writes its own log and events; another kind's
    command (``core.jobkind.ChildJob``) prints them, and this loop keeps them in its run folder. That
    command dies with its supervisor (``jobkind.die_with_parent``); a Serve or Evaluate command is
    metered from its start (after the fork) to its end, with the tokens it generated.

    ``grace_s``: how long a stop may take to save its checkpoint before the ranks are killed.
    ``signals``: the stop requests (see :class:`StopRequests`; the caller's signal handlers count
    them). ``say``: the supervisor's own notes (one message each). ``echo``: each console line of the
    launch, secrets already redacted (not yet made safe for a terminal); None: the console is not read (a
    training run's, which its launcher keeps in log.txt; another kind's command is always read).
    Returns how the run ended, which is also what its status now says.
    """
    run_ = prepared.run
    child = isinstance(prepared, jobkind.ChildJob)
    # The kernel's SIGTERM at the supervisor's death is asked for while no other thread runs: before
    # the meter's.
    preexec = jobkind.die_with_parent() if child else None
    meter, cwd = None, str(run_.folder)
    if isinstance(prepared, jobkind.ChildJob):
        echo, cwd = _keeper(run_, echo or _discard), prepared.cwd
    else:
        meter = start_meter(prepared, say)
    try:
        proc = subprocess.Popen(prepared.argv, env=prepared.env, cwd=cwd,
                                stdin=subprocess.DEVNULL if child else None,
                                stdout=subprocess.DEVNULL if echo is None else subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1, start_new_session=True,
                                preexec_fn=preexec)  # noqa: PLW1509 - only with no other thread
    except OSError as exc:
        summary = f"Failed: cannot start the launcher: {exc}"
        run_.update_status(state="failed", summary=summary, ended_at=time.time())
        return Supervised(state="failed", summary=summary, exit_code=None,
                          meter=stop_meter(meter, [], say))
    if isinstance(prepared, jobkind.ChildJob) and prepared.kind in jobkind.METERED_KINDS:
        # Serve's and Evaluate's meter starts once the command is forked: its threads must not exist
        # while the fork runs die_with_parent's preexec_fn.
        meter = start_meter(prepared, say)
    loop = _Loop(run=run_, grace_s=grace_s, signals=signals, say=say, run_kind=run_.kind,
                 launcher=ProcessRef.of(proc.pid), follower=EventFollower(run_.events_path))
    run_.update_status(state="running", pid=proc.pid, started_at=time.time(),
                       pid_create_time=loop.launcher.create_time if loop.launcher else 0.0)
    lines: queue.Queue[str | None] = queue.Queue()
    stdout_open = echo is not None
    if proc.stdout is not None:
        threading.Thread(target=_pump, args=(proc.stdout, lines), name="console", daemon=True).start()
    while stdout_open or proc.poll() is None:
        turn = time.monotonic()
        if echo is None:
            time.sleep(TURN_S)
        else:
            stdout_open = _echo_lines(lines, echo) and stdout_open
        loop.take_events()
        loop.take_stop_requests()
        if proc.poll() is None:
            loop.watch_stop()
            spare = BUSY_TURN_S - (time.monotonic() - turn)
            if spare > 0 and stdout_open:
                time.sleep(spare)  # a busy console: the next lines are taken together
    code = proc.wait()
    loop.take_events()
    return finish(run_, code, stopper=loop.stopper, events=loop.events, say=say, meter=meter)


def _keeper(run_: Run, echo: Callable[[str], None]) -> Callable[[str], None]:
    """For a command of another kind: its protocol lines go to the run's events.jsonl, its other
    lines to log.txt (one write each), and every line to ``echo``."""
    from gaudi_gui.core import protocol

    writer = events_mod.EventWriter(run_.events_path)
    log = os.open(run_.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def keep(line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            message = protocol.decode(line)
            if message is not None and isinstance(message.get("type"), str):
                writer.write(message["type"], **{k: v for k, v in message.items() if k not in ("type", "v")})
            else:
                os.write(log, (line + "\n").encode("utf-8", errors="replace"))
        echo(line)

    return keep


def start_meter(prepared: PreparedRun | jobkind.ChildJob,
                say: Callable[[str], None]) -> meter_mod.Meter | None:
    """The run meter of ``prepared``'s own cards, started; None (and a note) when it cannot start:
    a meter never stops a run. A Serve or Evaluate job's cards are those its command names
    (``jobkind.meter_target``)."""
    try:
        device, env = jobkind.meter_target(prepared) if isinstance(prepared, jobkind.ChildJob) \
            else (prepared.device, prepared.env)
        meter = meter_mod.Meter(prepared.run.folder, device=device, env=env)
        meter.start()
    except Exception as exc:  # the meter is an observer: whatever it meets, the run goes on
        say(f"meter: cannot start: {exc}")
        return None
    return meter


def stop_meter(meter: meter_mod.Meter | None, events: list[dict[str, Any]],
               say: Callable[[str], None], kind: str = "train") -> dict[str, Any] | None:
    """Stop ``meter`` (its tool's tree ends with it), add the Gaudi compile meter the ranks' bridge
    wrote (a Serve or Evaluate ``kind``: the tokens it generated, and the energy per 1,000 of
    them), write meter-summary.json and say it in one line."""
    if meter is None:
        return None
    extra: dict[str, Any] = {}
    if kind in jobkind.METERED_KINDS:
        extra.update(meter_work.generated_tokens(kind, events))
    try:
        base = meter.env.get("PT_HPU_METRICS_FILE") if meter.device == "hpu" else None
        if base:
            # Timed by this machine's own logged steps (another host of a multi-host run: its "step"
            # events, as rank 0 is elsewhere).
            extra["compile"] = hpu_metrics.run_summary(base, events)
        summary = meter.stop(extra=extra)
    except Exception as exc:  # as at the start: the run's outcome is written whatever happens here
        say(f"meter: cannot finish: {exc}")
        return None
    say(f"meter: {meter_words.describe(summary)}")
    if isinstance(summary.get("compile"), dict) and "compilations" in summary["compile"]:
        say(f"compile meter: {hpu_metrics.describe(summary['compile'])}")
    if summary.get("compile_warning"):
        from gaudi_gui.core.compile_rise import rise_text
        say(rise_text(summary["compile_warning"]))
    return summary


def _discard(_line: str) -> None:
    pass


def _echo_lines(lines: queue.Queue[str | None], echo: Callable[[str], None]) -> bool:
    """Echo the console lines waiting (wait up to ``TURN_S`` for the first); False once the console
    has closed."""
    taken: list[str] = []
    open_ = True
    try:
        line = lines.get(timeout=TURN_S)
        while line is not None:
            taken.append(line)
            line = lines.get_nowait()
        open_ = False
    except queue.Empty:
        pass
    for clean in redact_lines(taken):
        echo(clean)
    return open_


def _pids(refs: Iterable[ProcessRef]) -> str:
    return ", ".join(str(r.pid) for r in refs)


def finish(run_: Run, exit_code: int, *, stopper: Stopper | None, events: list[dict[str, Any]],
           say: Callable[[str], None], meter: meter_mod.Meter | None = None) -> Supervised:
    """The end of a supervised run, once its launcher has exited with ``exit_code``: wait for the
    processes ``stopper`` sent SIGKILL (at most ``DYING_WAIT_S``: the run's cards are not free until
    its ranks are gone), kill what outlived the launcher and wait for it too, then write the outcome
    of ``events`` (the run's events so far) into the run's status, exit code included. ``meter``
    is stopped once every process of the run is gone (its summary goes to meter-summary.json)."""
    dying = [r for r in stopper.kill_sent if r.is_alive()] if stopper else []
    if dying:
        say(f"waiting for {len(dying)} killed process(es) to end (pid {_pids(dying)})…")
        dying = wait_gone(dying)
        if dying:
            say(f"WARNING: killed process(es) still alive after {DYING_WAIT_S:g} s: pid {_pids(dying)}")
    leftovers = stopper.leftovers() if stopper else [r for r in run_.rank_refs() if r.is_alive()]
    for ref in leftovers:
        ref.signal(signal.SIGKILL)
    wait_gone(leftovers)  # a rank that outlived its launcher holds its cards until it is gone
    kind = run_.kind
    metered = stop_meter(meter, events, say, kind)
    result = outcome_from_events(events, run_.status(), exit_code=exit_code,
                                 stop_requested=stopper is not None,
                                 killed=bool(stopper and stopper.killed), log_tail=run_.log_tail(40),
                                 kill_reason=stopper.kill_reason if stopper else "") if kind == "train" \
        else jobkind.outcome(kind, events, exit_code=exit_code, stop_requested=stopper is not None,
                             killed=bool(stopper and stopper.killed))
    if stopper is not None and stopper.mode == "tree" and result.get("state") != "failed":
        result.update(state="stopped", summary="Stopped before training began — nothing to save")
    if kind in jobkind.METERED_KINDS and metered is not None:
        # Serve's and Evaluate's outcome says what the run cost, as a training run's meter line does.
        result["summary"] = f"{result['summary']} — {meter_words.outcome_words(metered)}"
    changes = {k: v for k, v in result.items() if k in RunStatus.__dataclass_fields__}
    changes["exit_code"] = exit_code
    run_.update_status(ended_at=time.time(), exit_description=describe_exit(exit_code), **changes)
    summary = str(result["summary"])
    if leftovers:
        summary += f" (killed {len(leftovers)} process(es) that outlived the launcher)"
    if dying:
        summary += f" ({len(dying)} killed process(es) still ending: pid {_pids(dying)})"
    return Supervised(state=str(result["state"]), summary=summary, exit_code=exit_code,
                      leftover_pids=tuple(r.pid for r in leftovers),
                      dying_pids=tuple(r.pid for r in dying), meter=metered)


__all__ = ["DYING_POLL_S", "DYING_WAIT_S", "STEP_WRITE_S", "StopRequests", "Supervised", "describe_exit",
           "finish", "start_meter", "stop_meter", "supervise", "wait_gone"]
