"""The agent's jobs: it starts, watches, stops and re-adopts every job of every kind (core/kinds.py).

- ``job.start {kind, job, runs_dir?, cwd?, env?, origin?}``: the job's shape is checked
  (``kinds.job_words``), then the kind's own command starts it exactly as its ``--detach`` does (a
  supervisor in a session of its own, the output in its run folder; the command checks what the job
  says, once, and its refusal is the reply's error). ``origin`` ("gui" or "cli", a training run only)
  is what its status records as who started it (the agent sets ``--origin``: a job's words may not).
  The reply is the job's record, with the start's ``pid`` (its supervisor) and ``device``.
- ``job.stop {job_id, now}``: SIGTERM to its supervisor (a training run saves a checkpoint first), or
  ``now``: kill. A Slurm training run (``train`` with ``--slurm`` in its words) is the same: its
  supervisor follows the job and stops it with ``scancel`` (``commands/slurm_run.py``). Should that
  supervisor die while the job goes on in Slurm (the ranks are on the cluster's nodes, not its
  children), the agent takes over after ``TAKEOVER_S``: it starts ``gaudi-gui runs attach RUN`` in a
  session of its own, which follows the job as its new supervisor (stop, kill now and the true outcome
  work again); a ``runs attach`` a terminal already follows with takes over by itself first.
- ``jobs.list {all, runs_dir?}``: the running jobs (``all``: every run of the stores too).
- Events ``job`` {job_id, job}, ``log`` {job_id, lines}, ``event`` {job_id, events}: a subscription with
  ``key`` = a job's id replays its history from the run folder (``replay``: true, at least one message
  each, empty or not), then follows it live (a run of the
  stores that its supervisor still runs and this agent did not watch yet, e.g. one a terminal's
  ``gaudi-gui train --no-agent`` started, is taken up then).
- Event ``meter`` {job_id, meter}: while a running job's meter is subscribed to (``key`` = its id; any
  run of the stores, watched or not: the window's own training runs too), its meter.jsonl is read
  here as it grows and what it says so far (``core.meter_files.LiveReader.reading``: power now, energy
  and card-hours so far, the line a person reads) is sent every ``METER_S``, new samples or not (a
  reading that grew old says so). Not the samples themselves: a long run's meter.jsonl is tens of MB,
  which a late subscriber (and a host's one ssh session) would otherwise carry again.

Nothing is lost when the agent dies: the supervisors are not its children, and what it watches is
written down (``agent-jobs.json`` in the data folder: the runs stores it uses and the jobs it watched).
A new agent re-adopts the running ones from the run store (each supervisor's pid and create time) and
reports the ones that ended while it was away with the outcome their run folder proves. The agent only
reads the run folders: each supervisor stays the one writer of its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gaudi_gui.agent.server import Agent, Handler, Refused, Session
from gaudi_gui.core import atomic, kinds, meter_files, paths
from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.events import EventFollower, LogFollower
from gaudi_gui.core.events import decode as decode_event
from gaudi_gui.core.filewatch import FolderWatch
from gaudi_gui.core.runstore import FINAL_STATES, SLURM_INFO, Run, RunStore
from gaudi_gui.core.secrets import redact_lines

#: How often a running job's files are read for new lines and events where inotify cannot say that they
#: were written (elsewhere they are read on each write, at most every ``WAKE_GAP_S``).
POLL_S = 0.2
#: Writes closer together than this are read together: a line written after a quiet spell goes out at
#: once, while a run logging hundreds of steps a second is read (and the window woken) at most 12 times a
#: second. Each wake of the agent and then of the window takes a slice from the run's ranks on the same
#: cores, and ranks that wait for each other lose more than the slice. The demo model on 2 cores, steps/s
#: through the agent over direct (5 interleaved pairs each): 0.88 reading every 25 ms, 0.94 every 50 ms,
#: 1.00 every 100 ms, 1.02 every 200 ms. log.txt -> window p95 under a flood: ~WAKE_GAP_S.
WAKE_GAP_S = 0.08
#: How often a running job's record (state, step, supervisor) is read.
RECORD_S = 0.5
#: A Slurm run whose supervisor has been gone this long (its job still unfinished) gets a new one.
TAKEOVER_S = 5.0
#: How long a job's start (its ``--detach``: the run folder made, the supervisor recorded) may take.
START_S = 180.0
#: Lines and events per message of a replay (a message is at most 4 MiB).
CHUNK = 2000
#: A replayed log starts at most this far before its end.
REPLAY_BYTES = 8 << 20
LEDGER = "agent-jobs.json"
#: How often a followed meter's reading is sent (its supervisor samples once a second).
METER_S = 1.0


def record(folder: str | Path) -> dict[str, Any]:
    """A job's record as the wire carries it: job_id (its run folder's name), kind (one spelling), name,
    state (reconciled: a run whose supervisor died reads as its run folder proves), folder, step,
    max_steps, summary, exit_code, times, alive (its supervisor runs), checkpoint (a training run's
    latest complete one, as its status says), a Slurm run's ``slurm_job_id``, a server's url; once a
    training run has ended, its ``meter`` (meter-summary.json, None without one: what a job of several
    hosts sums)."""
    run = Run(folder)
    status = run.reconcile()
    out: dict[str, Any] = {"job_id": run.name, "kind": kinds.canonical(status.kind) or status.kind,
                           "name": run.name, "state": status.state, "folder": str(run.folder),
                           "step": status.step, "max_steps": status.max_steps, "summary": status.summary,
                           "exit_code": status.exit_code, "started_at": status.started_at,
                           "ended_at": status.ended_at, "alive": run.supervisor() is not None,
                           "checkpoint": status.checkpoint}
    if out["kind"] == "train" and (run.folder / SLURM_INFO).is_file():
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            info = json.loads((run.folder / SLURM_INFO).read_text(encoding="utf-8"))
            out["slurm_job_id"] = str(info["job_id"])
    if out["kind"] == "train" and out["state"] in FINAL_STATES and not out["alive"]:
        out["meter"] = meter_files.read_summary(run.folder)
    if out["kind"] == "serve":
        with contextlib.suppress(OSError, ValueError):
            endpoint = json.loads((run.folder / "endpoint.json").read_text(encoding="utf-8"))
            if isinstance(endpoint, dict):
                out["url"] = str(endpoint.get("url") or "")
    return out


class _Watch:
    """One running job: its files read from where the agent took it up."""

    def __init__(self, folder: Path, *, from_start: bool) -> None:
        self.run = Run(folder)
        self.job_id = self.run.name
        self.log = LogFollower(self.run.log_path)
        self.events = EventFollower(self.run.events_path)
        if not from_start:
            # History is replayed from the files on subscribe; live ones follow from here.
            self.log.offset = _size(self.run.log_path)
            self.events.offset = _size(self.run.events_path)
            _skip_partial(self.log, self.events)
        self.record: dict[str, Any] = {}
        self.task: asyncio.Task[None] | None = None
        #: A Slurm run's: since when no supervisor follows it (monotonic), 0 while one does.
        self.orphan_since = 0.0
        #: The ``runs attach`` this agent started to take it over, while it runs (none is started beside it).
        self.attach: asyncio.Task[None] | None = None


def _orphaned_slurm(run: Run) -> bool:
    """A Slurm run not ended whose supervisor is gone (the agent takes it over)."""
    with contextlib.suppress(OSError):
        return (run.folder / SLURM_INFO).is_file() and run.status().state not in FINAL_STATES
    return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _skip_partial(log: LogFollower, events: EventFollower) -> None:
    """Followers put at a file's end start at its last complete line (a cut line is read whole later)."""
    for follower in (log, events):
        with contextlib.suppress(OSError), open(follower.path, "rb") as fh:
            data = fh.read()[: follower.offset]
            follower.offset = data.rfind(b"\n") + 1


class _Meter:
    """One running job's meter.jsonl, read here while anyone listens to its ``meter``."""

    def __init__(self, folder: Path) -> None:
        self.run = Run(folder)
        self.job_id = self.run.name
        self.reader = meter_files.LiveReader(folder, started_t=self.run.status().started_at or None)
        #: The last reading sent (what a new listener gets at once), None before the first sample.
        self.last: dict[str, Any] | None = None
        self.task: asyncio.Task[None] | None = None

    def caught_up(self) -> bool:
        """Everything written so far is read (a long run's file is taken 4 MiB a turn, never whole)."""
        return self.reader.offset >= _size(self.reader.path)


class StartRefused(Refused):
    """A job's start command refused it or failed; ``code`` its exit status (None: it did not end)."""

    def __init__(self, words: str, code: int | None) -> None:
        super().__init__(words)
        self.code = code


class Jobs:
    """The jobs service (``make(agent)``)."""

    name = "jobs"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.watched: dict[str, _Watch] = {}
        #: Jobs that ended while this agent ran, or while no agent did (``while_away``): job_id -> record.
        self.ended: dict[str, dict[str, Any]] = {}
        #: The runs stores in use ("": the data folder's).
        self.stores: set[str] = {""}
        self._ledger = paths.data_dir() / LEDGER
        #: Told every record of a watched job that changed, its last one included (the queue: a job's
        #: end frees its cards).
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        #: job_id -> its meter, read while a session listens to it.
        self.meters: dict[str, _Meter] = {}
        #: The ``runs attach`` supervisors this agent started (waited for, so none is left a zombie).
        self._attaching: set[asyncio.Task[None]] = set()

    def ops(self) -> dict[str, Handler]:
        return {"job.start": self._start, "job.stop": self._stop, "jobs.list": self._list}

    # -- life -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Re-adopt what runs (the previous agent's jobs, and any run of the stores a supervisor still
        owns), and say how the previous agent's jobs that are gone ended."""
        before: list[str] = []
        with contextlib.suppress(OSError, ValueError, TypeError):
            data = json.loads(self._ledger.read_text(encoding="utf-8"))
            self.stores |= {str(s) for s in data.get("runs_dirs", []) if isinstance(s, str)}
            before = [str(f) for f in data.get("jobs", []) if isinstance(f, str)]
        for folder in before:
            run = Run(folder)
            if not run.exists():
                continue
            if run.supervisor() is not None or _orphaned_slurm(run):
                self._watch(run.folder, from_start=False)  # an orphaned Slurm run is taken over there
            else:
                rec = record(run.folder)
                rec["while_away"] = True
                self.ended[rec["job_id"]] = rec
        for store in sorted(self.stores):
            for run in RunStore(store or None).runs():
                if run.name not in self.watched and run.status().state in ("queued", "running") \
                        and run.supervisor() is not None:
                    self._watch(run.folder, from_start=False)
        self._save()

    async def stop(self) -> None:
        tasks = [w.task for w in self.watched.values()] + [m.task for m in self.meters.values()]
        for task in tasks:
            if task is not None:
                task.cancel()
        self._save()

    def holds(self) -> list[str]:
        return []

    def busy(self) -> list[str]:
        return [f"{w.record.get('kind', '?')} {w.job_id}: {w.record.get('state', 'starting')}"
                for w in self.watched.values()]

    def status(self) -> dict[str, Any]:
        away = [r for r in self.ended.values() if r.get("while_away")]
        summary = f"{len(self.watched)} running" + (f", {len(away)} ended while no agent ran" if away else "")
        return {"summary": summary, "running": [w.record for w in self.watched.values()]}

    def session_gone(self, session: Session) -> None:
        return None

    # -- watching ---------------------------------------------------------------------------------
    def _watch(self, folder: Path, *, from_start: bool) -> _Watch:
        watch = _Watch(folder, from_start=from_start)
        watch.record = record(folder)
        self.watched[watch.job_id] = watch
        self.ended.pop(watch.job_id, None)
        watch.task = asyncio.get_running_loop().create_task(self._follow(watch))
        return watch

    async def _follow(self, watch: _Watch) -> None:
        """Streams a job's new log lines and events as they are written (woken by inotify on its folder,
        else every ``POLL_S``) and its record when it changes, until it has ended."""
        loop = asyncio.get_running_loop()
        files = FolderWatch(watch.run.folder)
        written = asyncio.Event()

        def woken() -> None:
            # One wake per pump: the reader is removed until the next one. The loop's readers are
            # level-triggered, and a run writing its log, its events and its status on every step (400
            # writes a second from the demo model) called this on each write, a turn of the loop each,
            # on the cores the run computes on.
            loop.remove_reader(files.fileno())
            written.set()

        next_record = 0.0
        try:
            while True:
                if files.watching:
                    # Drained before the files are read: a write after this wakes the next pump.
                    files.drain()
                    loop.add_reader(files.fileno(), woken)
                self._pump(watch)
                last_pump = now = time.monotonic()
                if now >= next_record:
                    next_record = now + RECORD_S
                    rec = record(watch.run.folder)
                    if rec["state"] in FINAL_STATES and not rec["alive"]:
                        self._pump(watch)  # what was written before the end goes out before its record
                    changed = rec != watch.record
                    if changed:
                        watch.record = rec
                        self.agent.publish(Ev.JOB, watch.job_id, job_id=watch.job_id, job=rec)
                    if rec["state"] in FINAL_STATES and not rec["alive"]:
                        self.watched.pop(watch.job_id, None)
                        self.ended[watch.job_id] = rec
                        self._save()
                        self._tell(rec)
                        return
                    if changed:
                        self._tell(rec)
                    self._take_over(watch, rec, now)
                if not files.watching:
                    await asyncio.sleep(POLL_S)
                    continue
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(written.wait(), max(0.0, next_record - time.monotonic()))
                written.clear()
                gap = last_pump + WAKE_GAP_S - time.monotonic()
                if gap > 0:
                    await asyncio.sleep(gap)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one job's unreadable folder must not end the agent's watching of others
            self.agent.publish(Ev.NOTICE, message=f"stopped watching {watch.job_id}: {exc}", level="warning")
            self.watched.pop(watch.job_id, None)
        finally:
            if files.watching:
                loop.remove_reader(files.fileno())
            files.close()

    def _take_over(self, watch: _Watch, rec: dict[str, Any], now: float) -> None:
        """A Slurm run nobody follows any more (its supervisor died; the job goes on in Slurm): after
        ``TAKEOVER_S`` without one, ``gaudi-gui runs attach RUN`` becomes its supervisor (which also writes
        the true outcome of a job that ended meanwhile)."""
        if rec["alive"] or rec["state"] in FINAL_STATES or not (watch.run.folder / SLURM_INFO).is_file():
            watch.orphan_since = 0.0
            return
        if not watch.orphan_since:
            watch.orphan_since = now
            return
        if now - watch.orphan_since < TAKEOVER_S or watch.run.supervisor() is not None:
            return
        if watch.attach is not None and not watch.attach.done():
            return  # the one started is still coming up (no supervisor written yet): not a second one
        watch.orphan_since = now  # once per TAKEOVER_S at most, should the new one die at once too
        task = watch.attach = asyncio.get_running_loop().create_task(self._attach(watch))
        self._attaching.add(task)
        task.add_done_callback(self._attaching.discard)

    async def _attach(self, watch: _Watch) -> None:
        """``gaudi-gui runs attach RUN`` in a session of its own (its words in the run's supervisor.log),
        reaped when it ends; it outlives this agent as any supervisor does."""
        argv = [sys.executable, "-m", "gaudi_gui", "runs", "attach", str(watch.run.folder)]
        try:
            with open(watch.run.folder / "supervisor.log", "ab") as said:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=said,
                    start_new_session=True)
        except OSError as exc:
            self.agent.publish(Ev.NOTICE, message=f"{watch.job_id}: no supervisor follows its Slurm job and "
                                                  f"none could be started: {exc}", level="warning")
            return
        words = f"its Slurm job's supervisor was gone; `gaudi-gui runs attach` (pid {proc.pid}) follows it"
        self.agent.publish(Ev.NOTICE, message=f"{watch.job_id}: {words}", level="info")
        await proc.wait()

    def _tell(self, rec: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            try:
                listener(rec)
            except Exception as exc:  # a listener's bug must not end the watching of this job
                self.agent.publish(Ev.NOTICE, message=f"a listener of {rec.get('job_id')} failed: {exc}",
                                   level="warning")

    def adopt(self, folder: str | Path) -> dict[str, Any]:
        """Watch the run in ``folder`` (its supervisor still runs) unless watched already; its record."""
        run = Run(folder)
        watch = self.watched.get(run.name)
        if watch is None:
            watch = self._watch(run.folder, from_start=False)
            self._save()
        return watch.record

    def _pump(self, watch: _Watch) -> None:
        lines = redact_lines(watch.log.read(4 << 20))
        if lines:
            for i in range(0, len(lines), CHUNK):
                self.agent.publish(Ev.LOG, watch.job_id, job_id=watch.job_id, lines=lines[i:i + CHUNK])
        events = watch.events.read()
        if events:
            for i in range(0, len(events), CHUNK):
                self.agent.publish(Ev.EVENT, watch.job_id, job_id=watch.job_id, events=events[i:i + CHUNK])

    def subscribed(self, session: Session, ev: str, key: str | None) -> None:
        """A job's history from its run folder, up to where the live events take over."""
        if ev == Ev.JOB.value:
            if key is None:
                for rec in [*(w.record for w in self.watched.values()), *self.ended.values()]:
                    session.send({"ev": ev, "job_id": rec["job_id"], "job": rec})
                return
            found = self._record_of(key)
            if found is not None:
                session.send({"ev": ev, "job_id": key, "job": found})
            else:  # said, not left for the follower to wait on (a run folder deleted or moved)
                stores = ", ".join(str(RunStore(s or None).root) for s in sorted(self.stores)) or "none"
                session.send({"ev": ev, "job_id": key, "job": None,
                              "missing": f"no run {key} in the runs store ({stores}): its folder was "
                                         "deleted or moved, so there is nothing to follow"})
            return
        if ev == Ev.METER.value and key is not None:
            self._meter_wanted(session, key)
            return
        if key is None or ev not in (Ev.LOG.value, Ev.EVENT.value):
            return
        watch = self.watched.get(key)
        folder = watch.run.folder if watch is not None else self._folder_of(key)
        if folder is None:
            return
        run = Run(folder)
        if watch is None and run.supervisor() is not None:
            # A run going on that this agent does not watch (a terminal's, or one that began while
            # no agent ran): followed live from here, its history replayed up to there.
            watch = self._watch(run.folder, from_start=False)
            self._save()
        if ev == Ev.LOG.value:
            end = watch.log.end if watch is not None else _size(run.log_path)
            start = max(0, end - REPLAY_BYTES)
            follower = LogFollower(run.log_path, offset=start)
            text_lines = follower.read(end - start)
            if start and text_lines:
                text_lines = text_lines[1:]  # the first line read from the middle of one is not whole
            lines = redact_lines(text_lines)
            # Marked, and sent even when empty: a follower that hears live lines before its replay (a
            # host's, whose subscription was still live there) knows them for a part of it.
            for i in range(0, max(1, len(lines)), CHUNK):
                session.send({"ev": ev, "job_id": key, "lines": lines[i:i + CHUNK], "replay": True})
        else:
            upto = watch.events.offset - len(watch.events._partial) if watch is not None \
                else _size(run.events_path)
            data = b""
            with contextlib.suppress(OSError), open(run.events_path, "rb") as fh:
                data = fh.read(upto)
            complete = data[: data.rfind(b"\n") + 1]
            decoded = (decode_event(line) for line in complete.split(b"\n") if line)
            events = [e for e in decoded if e is not None]
            for i in range(0, max(1, len(events)), CHUNK):
                session.send({"ev": ev, "job_id": key, "events": events[i:i + CHUNK], "replay": True})

    # -- a running job's meter ----------------------------------------------------------------------
    def _meter_wanted(self, session: Session, job_id: str) -> None:
        """A session listens to ``job_id``'s meter: the reading so far at once, then each ``METER_S``
        while the run runs (read here only while someone listens)."""
        follower = self.meters.get(job_id)
        if follower is not None:
            if follower.last is not None:
                session.send({"ev": Ev.METER.value, "job_id": job_id, "meter": follower.last})
            return
        watch = self.watched.get(job_id)
        folder = watch.run.folder if watch is not None else self._folder_of(job_id)
        if folder is None or Run(folder).status().state in FINAL_STATES:
            return  # an ended run's meter is its summary (meter-summary.json), not a live reading
        follower = _Meter(folder)
        self.meters[job_id] = follower
        follower.task = asyncio.get_running_loop().create_task(self._follow_meter(follower))

    def _meter_heard(self, job_id: str) -> bool:
        return any(s.wants(Ev.METER.value, job_id) and s.subs.get(Ev.METER.value) is not None
                   for s in self.agent.sessions)

    async def _follow_meter(self, follower: _Meter) -> None:
        reader = follower.reader
        try:
            while self._meter_heard(follower.job_id):
                status = follower.run.status()
                reader.started_t = reader.started_t or status.started_at or None
                reader.read()
                if not follower.caught_up():
                    await asyncio.sleep(0)  # the rest of a long file next turn: others' work between
                    continue
                now = time.time()
                reading = reader.reading(now)
                if reading is not None:
                    follower.last = reading
                    self.agent.publish(Ev.METER, follower.job_id, job_id=follower.job_id, meter=reading)
                if status.state in FINAL_STATES:
                    return
                await asyncio.sleep(METER_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one run's unreadable meter must not end the agent
            self.agent.publish(Ev.NOTICE, message=f"stopped reading {follower.job_id}'s meter: {exc}",
                               level="warning")
        finally:
            if self.meters.get(follower.job_id) is follower:
                del self.meters[follower.job_id]

    # -- where a job is ---------------------------------------------------------------------------
    def _folder_of(self, job_id: str) -> Path | None:
        if not job_id or "/" in job_id or job_id.startswith("."):
            return None
        for store in sorted(self.stores):
            run = Run(RunStore(store or None).root / job_id)
            if run.exists():
                return run.folder
        return None

    def _record_of(self, job_id: str) -> dict[str, Any] | None:
        watch = self.watched.get(job_id)
        if watch is not None:
            return watch.record
        if job_id in self.ended:
            return self.ended[job_id]
        folder = self._folder_of(job_id)
        return record(folder) if folder is not None else None

    def _save(self) -> None:
        """What a next agent needs to take the jobs up again and to say how the gone ones ended."""
        folders = sorted(str(w.run.folder) for w in self.watched.values())
        with contextlib.suppress(OSError):
            atomic.write_json(self._ledger, {"runs_dirs": sorted(self.stores), "jobs": folders},
                              mode=0o600, fsync=False)

    # -- operations -------------------------------------------------------------------------------
    async def _start(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        return await self.start_job(message)

    async def start_job(self, message: dict[str, Any],
                        on_spawn: Callable[[int], None] | None = None) -> dict[str, Any]:
        """``job.start``'s work (the queue starts its entries through it too): the kind's ``--detach``,
        waited for; {"job": record, "notes"}. ``StartRefused`` (its ``code``: the command's exit) with
        the command's own words. ``on_spawn``: told the pid of the start command once it runs."""
        try:
            kind = kinds.get(str(message.get("kind") or ""))
            words = kinds.job_words(kind.name, message.get("job"))
        except kinds.KindError as exc:
            raise Refused(str(exc)) from None
        runs_dir = str(message.get("runs_dir") or "")
        cwd = str(message.get("cwd") or "") or None
        if cwd is not None and not os.path.isdir(cwd):
            raise Refused(f"cwd: {cwd} is not a folder")
        # ``whole_env``: the client's environment is the job's (the command line's: a variable unset
        # there must not come from the agent's own, which the first client's environment made).
        env = {} if message.get("whole_env") else dict(os.environ)
        extra = message.get("env") or {}
        if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
            raise Refused("env: an object of strings")
        env.update({str(k): v for k, v in extra.items()})
        env.pop("GAUDI_GUI_NO_AGENT", None)
        origin = str(message.get("origin") or "")
        if origin and (kind.name != "train" or origin not in ("gui", "cli")):
            raise Refused("origin: \"gui\" or \"cli\", for a training job only")
        config_path = ""
        if kind.name == "train":
            incoming = RunStore(runs_dir or None).root / ".incoming"
            incoming.mkdir(parents=True, exist_ok=True, mode=0o700)
            config_path = str(incoming / f"agent-{os.getpid()}-{time.monotonic_ns()}.json")
            atomic.write_json(config_path, dict(message["job"]["config"]), mode=0o600, fsync=False)
        argv = kinds.start_argv(kind.name, words, runs_dir=runs_dir, config_path=config_path, origin=origin)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, cwd=cwd, env=env)
            if on_spawn is not None:
                on_spawn(proc.pid)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), START_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise StartRefused(f"the {kind.name} did not start within {START_S:g} s", None) from None
        finally:
            if config_path:
                with contextlib.suppress(OSError):
                    os.unlink(config_path)
        said = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
        try:
            info = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
            folder = Path(str(info["folder"]))
        except (ValueError, IndexError, KeyError, TypeError):
            words_said = "; ".join(line.removeprefix(f"gaudi-gui {kind.name}: ") for line in said[-3:])
            raise StartRefused(words_said or f"the {kind.name} did not start (exit {proc.returncode})",
                               proc.returncode) from None
        if runs_dir not in self.stores:
            self.stores.add(runs_dir)
        watch = self._watch(folder, from_start=True)
        self._save()
        self.agent.publish(Ev.JOB, watch.job_id, job_id=watch.job_id, job=watch.record)
        started = {"pid": info.get("pid"), "device": info.get("device")} if isinstance(info, dict) else {}
        if isinstance(info, dict) and info.get("job_id"):
            started["slurm_job_id"] = str(info["job_id"])  # a Slurm run's: sbatch took it
        return {"job": {**watch.record, **started}, "notes": [line for line in said if ": note: " in line]}

    async def _stop(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        return self.stop_job(str(message.get("job_id") or ""), now=bool(message.get("now")))

    def stop_job(self, job_id: str, *, now: bool = False) -> dict[str, Any]:
        """``job.stop``'s work: {"words": what the stop does}; Refused when it is not running."""
        folder = self.watched[job_id].run.folder if job_id in self.watched else self._folder_of(job_id)
        if folder is None:
            raise Refused(f"no job {job_id!r}")
        run = Run(folder)
        from gaudi_gui.core.stopper import KILL_NOW_SIGNAL, Stopper
        supervisor = run.supervisor()
        if supervisor is not None:
            supervisor.signal(KILL_NOW_SIGNAL if now else signal.SIGTERM)
            return {"words": "kill requested" if now else f"stop requested: {kinds.stop_words(run.kind)}"}
        if _orphaned_slurm(run):
            # The ranks are on the cluster's nodes: only the job's supervisor (which scancels) stops them.
            # One is started (``_take_over``) once the old one has been gone TAKEOVER_S.
            if run.name not in self.watched:
                self._watch(run.folder, from_start=False)
                self._save()
            raise Refused(f"{job_id}: its Slurm job's supervisor is gone; the agent starts a new one "
                          f"(`gaudi-gui runs attach {job_id}`) within {TAKEOVER_S * 2:g} s: stop again then, "
                          "or scancel the job")
        stopper = Stopper(run, run.status().launcher)
        if now:
            stopper.kill_now("request")
            return {"words": "killed"}
        if any(r.is_alive() for r in run.rank_refs()):
            return {"words": stopper.request()}
        raise Refused(f"{job_id} is not running")

    async def _list(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        runs_dir = str(message.get("runs_dir") or "")
        if runs_dir and runs_dir not in self.stores:
            self.stores.add(runs_dir)
            self._save()
        jobs = {w.job_id: dict(w.record) for w in self.watched.values()}
        for job_id, rec in self.ended.items():
            if rec.get("while_away") or message.get("all"):
                jobs.setdefault(job_id, dict(rec))
        if message.get("all"):
            for store in sorted(self.stores):
                for run in RunStore(store or None).runs():
                    if run.name not in jobs:
                        jobs[run.name] = record(run.folder)
        return {"jobs": sorted(jobs.values(), key=lambda r: r["job_id"], reverse=True)}


def make(agent: Agent) -> Jobs:
    return Jobs(agent)
