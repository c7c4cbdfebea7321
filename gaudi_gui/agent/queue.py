"""The queue as a service of the agent (issue 38): jobs that start by themselves when their cards are free.

Before, the queue was a process of its own (``gaudi-gui queue run``: a lock, a pidfile, a turn every
0.25 s) that its clients reached through request and reply files. Now the agent keeps it: its clients
(``gaudi-gui queue …``, the window's Queue view, a workstation's agent over a host link) send requests on
the wire and hear every change as a ``queue`` event; the agent alone writes ``<data>/queue/state.json``.

- Ops (docs/agent-protocol.md): ``queue.add``, ``queue.remove``, ``queue.move``, ``queue.pause``,
  ``queue.resume``, ``queue.set``, ``queue.stop``, ``queue.list``. A refusal is ``ok:false`` with one
  line (the same words ``gaudi-gui queue`` printed before).
- Event ``queue`` (no key): ``paused``, ``cpu_jobs``, ``problem``, ``entries`` (``wire_entry``), sent
  on subscribe and after every change.
- Planning (``core.queue.plan``: priorities, card claims, backfill, ``cpu_jobs``) runs when something
  changed: a request, a job's end (the jobs service tells its listeners), a process that held a wanted
  card ending (its pid looked at once a second while a job waits for it), a start's back-off over,
  or every ``RECHECK_S`` while a job waits for cards (a holder this /proc cannot see: another container).
- A start is the jobs service's own (``Jobs.start_job``: the kind's ``--detach``, a run folder, a
  supervisor in a session of its own). "starting" is written before it, with the start command's pid
  once it runs; a new agent finds what became of it: the start command still running is waited for,
  then the run it made (the entry's kind, begun after the entry started starting, claimed by no
  other entry) is taken; only a start that left nothing is made again.
- A new agent takes the queue up from state.json: its started entries are watched again through the
  jobs service (which re-adopted their supervisors), and those whose runs ended meanwhile end with the
  outcome their run folder proves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gaudi_gui.agent.server import Agent, Handler, Refused, Session
from gaudi_gui.core import queue
from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.queue import CardRequest, CardsView, Entry, QueueError, QueueState, wire_entry
from gaudi_gui.core.runstore import FINAL_STATES, Run, RunStore, is_pid_alive

if TYPE_CHECKING:
    from gaudi_gui.agent.jobs import Jobs

#: Seconds between two looks at the cards while a job waits and nothing was seen to change.
RECHECK_S = 10.0
#: A look at the cards older than this is taken again before a start on cards.
FRESH_S = 2.0
#: Seconds between two looks at the pids that hold a card a waiting job wants.
HOLDERS_S = 1.0
#: The first retry of a transient start fault waits this long, each next one twice as long.
RETRY_S = 2.0
#: How long a check child (a host's kind words checked by its own command) may take.
CHECK_S = 60.0


def _env_float(name: str, default: float) -> float:
    with contextlib.suppress(ValueError):
        value = float(os.environ.get(name, ""))
        if value > 0:
            return value
    return default


def check_cards() -> CardsView:
    """The doctor's look at this machine's cards (no hl-smi, /dev/accel node or habanalabs driver:
    none to look at; with a node or the driver, a missing hl-smi is the look's error)."""
    from gaudi_gui.core import health, hlsmi
    hl_smi = hlsmi.find_hl_smi()
    roots = health.Roots.from_env(hl_smi)
    if not hl_smi and not hlsmi.hl_smi_program()[1] and not health.gaudi_evidence(roots):
        return CardsView(None, time.time())
    return CardsView(health.check_host(roots), time.time())


class Book:
    """The queue's state and the requests that change it (no I/O, no loop: what the unit tests drive)."""

    def __init__(self, state: QueueState | None = None) -> None:
        self.state = state or QueueState()
        #: Something changed since the state was last written and published.
        self.changed = False

    def set(self, entry: Entry, state: str, why: str = "") -> None:
        if entry.state != state or entry.why != why:
            if entry.state != state:
                entry.since = time.time()
            entry.state = state
            entry.why = why
            self.changed = True

    def end(self, entry: Entry, outcome: str, why: str = "") -> None:
        entry.outcome = outcome
        entry.ended_at = time.time()
        if why:
            entry.summary = entry.summary or why
        self.set(entry, "ended", why)

    def entry(self, entry_id: str) -> Entry:
        entry = self.state.find(entry_id)
        if entry is None:
            known = ", ".join(e.id for e in self.state.entries if e.state != "ended") or "none"
            raise QueueError(f"no queued job {entry_id!r} (queued now: {known})")
        return entry

    def apply(self, action: str, values: dict[str, Any]) -> dict[str, Any]:
        """One request (``add`` with the checked values of ``core.queue.add_values`` /
        ``kind_add_values``); its reply's fields ({"message", …}); QueueError, one line, for a refusal.
        ``stop`` only checks here: the service stops the run."""
        if action == "add":
            return self._add(values)
        if action == "set":
            return self._set_limits(values)
        if action in ("pause", "resume"):
            paused = action == "pause"
            if self.state.paused != paused:
                self.state.paused = paused
                self.changed = True
            return {"message": "queue paused" if paused else "queue resumed"}
        if action == "list":
            return {}
        entry = self.entry(str(values.get("entry") or ""))
        if action == "remove":
            if entry.state in queue.ACTIVE:
                raise QueueError(f"{entry.label()} has started: stop it (gaudi-gui queue stop "
                                 f"{entry.id}, or Stop in the Queue view)")
            if entry.state == "ended":
                raise QueueError(f"{entry.label()} has already ended ({entry.outcome})")
            self.end(entry, "removed", "removed from the queue")
            return {"message": f"removed {entry.label()}", "entry": entry.id}
        if action == "stop":
            if entry.state in queue.PENDING:
                raise QueueError(f"{entry.label()} has not started: Remove takes it out of the queue")
            if entry.state == "ended":
                raise QueueError(f"{entry.label()} has already ended ({entry.outcome})")
            if entry.state == "starting":
                entry.stop_asked = True
                self.changed = True
                return {"message": f"{entry.label()} is stopped as soon as it has started", "entry": entry.id}
            return {"entry": entry.id}
        if action == "move":
            target = self.entry(str(values.get("before") or ""))
            for e in (entry, target):
                if e.state not in queue.PENDING:
                    raise QueueError(f"{e.label()} is {e.state}: only jobs not started yet move")
            if entry is target:
                return {"message": f"{entry.label()} stays where it is", "entry": entry.id}
            self.state.entries.remove(entry)
            self.state.entries.insert(self.state.entries.index(target), entry)
            # It runs before the target: it takes the target's priority (the order is priority first).
            entry.priority = target.priority
            self.changed = True
            return {"message": f"moved {entry.label()} before {target.label()} (priority {entry.priority})",
                    "entry": entry.id}
        raise QueueError(f"unknown queue request {action!r}")

    def _set_limits(self, values: dict[str, Any]) -> dict[str, Any]:
        if "cpu_jobs" not in values:
            raise QueueError("set: nothing to set (--cpu-jobs N)")
        limit = queue.cpu_jobs_value(values["cpu_jobs"])
        if limit != self.state.cpu_jobs:
            self.state.cpu_jobs = limit
            self.changed = True
        return {"message": queue.cpu_jobs_text(limit), "cpu_jobs": limit}

    def made(self, client_id: str) -> Entry | None:
        """The entry an add with this client id made (a retry finds it instead of queueing twice)."""
        return next((e for e in self.state.entries if client_id and e.client_id == client_id), None)

    def _add(self, values: dict[str, Any]) -> dict[str, Any]:
        kind = queue.kind_name(str(values.get("kind") or "train"))
        job = values.get("job")
        if not isinstance(job, dict):
            raise QueueError("the request holds no job")
        if kind != "train" and not isinstance(job.get("words"), list):
            raise QueueError(f"a {kind} job needs its command's words")
        if values.get("cpu_jobs") is not None:
            # The window's setting travels with its adds: the queue keeps the requester's limit.
            self._set_limits({"cpu_jobs": values["cpu_jobs"]})
        client_id = str(values.get("client_id") or "")
        made = self.made(client_id)
        if made is not None:
            return {"message": f"already queued as {made.label()}", "entry": made.id,
                    "position": self.state.positions().get(made.id, 0)}
        output_dir = queue.resolved_dir(str(values.get("output_dir") or ""))
        other = queue.same_output(output_dir, self.state.entries)
        if other:
            raise QueueError(queue.output_refusal(output_dir, other))
        now = time.time()
        entry = Entry(id=f"q{self.state.next_seq}", job=job, kind=kind, name=str(values.get("name") or ""),
                      priority=int(values.get("priority") or 0),
                      card_ids=[int(c) for c in values.get("card_ids") or []],
                      card_count=int(values.get("card_count") or 0),
                      device=str(values.get("device") or "auto"), output_dir=output_dir,
                      added_at=now, added_by=str(values.get("added_by") or ""), client_id=client_id,
                      state="queued", since=now)
        self.state.next_seq += 1
        self.state.entries.append(entry)
        self.changed = True
        position = self.state.positions().get(entry.id, 0)
        return {"message": f"queued {entry.label()} at position {position}", "entry": entry.id,
                "position": position}

    def trim(self) -> None:
        """Keep the newest ``KEEP_ENDED`` ended entries."""
        ended = [e for e in self.state.entries if e.state == "ended"]
        if len(ended) > queue.KEEP_ENDED:
            drop = {e.id for e in sorted(ended, key=lambda e: e.ended_at)[:-queue.KEEP_ENDED]}
            self.state.entries = [e for e in self.state.entries if e.id not in drop]


class QueueService:
    """The queue service (``make(agent)``)."""

    name = "queue"

    def __init__(self, agent: Agent, root: Path | None = None,
                 cards: Callable[[], CardsView] = check_cards) -> None:
        self.agent = agent
        self.root = root
        self.book = Book()
        self.recheck_s = _env_float("GAUDI_GUI_QUEUE_RECHECK_S", RECHECK_S)
        self._cards = cards
        self.view: CardsView | None = None
        #: Look at the cards again before the next plan.
        self.dirty = True
        #: Pids that hold a card a waiting job wants (when one ends, look again).
        self.watched: set[int] = set()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Set once the queue was taken up from its state: requests wait for it.
        self._ready = asyncio.Event()

    @property
    def state(self) -> QueueState:
        return self.book.state

    def ops(self) -> dict[str, Handler]:
        ops: dict[str, Handler] = {f"queue.{action}": self._op for action in queue.ACTIONS}
        ops["queue.add"] = self._op_add
        ops["queue.stop"] = self._op_stop
        return ops

    def jobs(self) -> Jobs:
        found = next((s for s in self.agent.services if s.name == "jobs"), None)
        if found is None:
            raise Refused("this agent has no jobs service")
        return found  # type: ignore[return-value]

    # -- life -------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._wake = asyncio.Event()
        path = queue.state_path(self.root)
        state = queue.read_state(self.root)
        if state.problem:
            # Kept aside for a person to look at; the queue goes on from an empty state.
            aside = path.with_name(f"state.json.damaged-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(path, aside)
            self.agent.publish(Ev.NOTICE, message=f"queue: {state.problem}: kept as {aside}", level="warning")
            state = QueueState()
        self.book = Book(state)
        self._forget_old_files()
        with contextlib.suppress(Refused):
            self.jobs().listeners.append(self._job_changed)
        for entry in self.state.entries:
            if entry.state == "started":
                self._take_up(entry)
            elif entry.state == "starting":
                self._spawn(self._recover_start(entry))
        self._changed()
        self._ready.set()
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    def _forget_old_files(self) -> None:
        """What the queue process of earlier versions left (its request and reply files, its pidfile):
        state.json is read as it was; the rest is of no use any more."""
        root = queue.queue_dir() if self.root is None else self.root
        for name in ("requests", "replies", "starts"):
            shutil.rmtree(root / name, ignore_errors=True)
        for name in ("queue.pid", "queue.lock"):
            with contextlib.suppress(OSError):
                (root / name).unlink()

    async def stop(self) -> None:
        for task in [self._loop_task, *self._tasks]:
            if task is not None:
                task.cancel()
        self._save()

    def holds(self) -> list[str]:
        return []

    def busy(self) -> list[str]:
        """Jobs that wait to start keep the agent up (a paused queue does not: it starts nothing, and
        the next client's agent takes it up from its state); started ones are the jobs service's."""
        if self.state.paused:
            return []
        waiting = self.state.pending()
        starting = [e for e in self.state.entries if e.state == "starting"]
        out = [f"queue: {e.label()} starting" for e in starting]
        if waiting:
            out.append(f"queue: {len(waiting)} job{'s' if len(waiting) != 1 else ''} waiting to start")
        return out

    def status(self) -> dict[str, Any]:
        pending = len(self.state.pending())
        started = len(self.state.active())
        return {"summary": f"{pending} queued, {started} started" + (", paused" if self.state.paused else ""),
                "pending": pending, "started": started, "paused": self.state.paused}

    def subscribed(self, session: Session, ev: str, key: str | None) -> None:
        # Before the queue was taken up, its first event (``start``) reaches the session anyway.
        if ev == Ev.QUEUE.value and self._ready.is_set():
            session.send({"ev": ev, **self.snapshot()})

    def session_gone(self, session: Session) -> None:
        return None

    def snapshot(self) -> dict[str, Any]:
        """The queue as clients see it (the ``queue`` event's fields, ``queue.list``'s reply)."""
        positions = self.state.positions()
        return {"paused": self.state.paused, "cpu_jobs": self.state.cpu_jobs, "problem": self.state.problem,
                "pid": os.getpid(),
                "entries": [wire_entry(e, positions.get(e.id, 0)) for e in self.state.entries]}

    def _save(self) -> None:
        self.book.trim()
        try:
            queue.make_dirs(self.root)
            queue.write_state(self.state, self.root)
        except OSError as exc:
            self.agent.publish(Ev.NOTICE, message=f"queue: its state could not be written: {exc}",
                               level="error")
        self.book.changed = False

    def _changed(self) -> None:
        """Write the state and tell the listeners (every change), then plan again."""
        self._save()
        self.agent.publish(Ev.QUEUE, **self.snapshot())
        self.kick()

    def kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- requests ---------------------------------------------------------------------------------
    async def _op(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        await self._ready.wait()
        action = str(message.get("op", "")).removeprefix("queue.")
        try:
            reply = self.book.apply(action, message)
        except QueueError as exc:
            raise Refused(str(exc)) from None
        if self.book.changed:
            self.dirty = True
            self._changed()
        if action == "list":
            return self.snapshot()
        return reply

    async def _op_stop(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        await self._ready.wait()
        try:
            reply = self.book.apply("stop", message)
        except QueueError as exc:
            raise Refused(str(exc)) from None
        if "message" in reply:  # still starting: stopped once its run is known
            self._changed()
            return reply
        entry = self.book.entry(str(reply["entry"]))
        words = self.jobs().stop_job(entry.run_name)["words"]
        return {"message": f"{entry.label()}: {words}", "entry": entry.id}

    async def _op_add(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        """``queue.add``: a training job (``config``, the job file's JSON) or a serve / eval / download
        job (``words``, as its ``--detach`` takes them), checked here, on the machine that runs it."""
        await self._ready.wait()
        made = self.book.made(str(message.get("client_id") or ""))
        if made is not None:
            return self.book.apply("add", {"job": made.job, "kind": made.kind, "client_id": made.client_id})
        try:
            values = await self._checked(message)
            reply = self.book.apply("add", {**values, "cpu_jobs": message.get("cpu_jobs")})
        except QueueError as exc:
            raise Refused(str(exc)) from None
        self.dirty = True
        self._changed()
        return reply

    async def _checked(self, message: dict[str, Any]) -> dict[str, Any]:
        """The add's values after the checks (QueueError, one line)."""
        kind = queue.kind_name(str(message.get("kind") or "train"))
        try:
            cards = CardRequest.parse(str(message.get("cards") or ""))
        except ValueError as exc:
            raise QueueError(str(exc)) from None
        priority = message.get("priority") or 0
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise QueueError(f"--priority takes a whole number, not {priority!r}")
        added_by = str(message.get("added_by") or "")[:40]
        client_id = str(message.get("client_id") or "")
        if kind == "train":
            config = message.get("config")
            if not isinstance(config, dict):
                raise QueueError("--config JOB: a training job is given as a job file")
            from gaudi_gui.core.jobconfig import JobConfig, JobConfigError
            try:
                job = JobConfig.from_dict(config)
            except (JobConfigError, TypeError, ValueError) as exc:
                raise QueueError(str(exc)) from None
            device = str(message.get("device") or "auto")
            entries = list(self.state.entries)
            # The job's check reads its files (a dataset, the model's config): not on the agent's loop.
            return await asyncio.to_thread(queue.add_values, job, kind="train", cards=cards, device=device,
                                           entries=entries, priority=priority, added_by=added_by,
                                           client_id=client_id)
        words = message.get("words")
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise QueueError(f"a {kind} job needs its command's words")
        name = str(message.get("name") or "")
        if not message.get("checked") or not name:
            words, name = await self._check_words(kind, words)
        if kind == "serve" and not cards.none and any(w == "--device=cpu" for w in words):
            raise QueueError("--cards: a serve on --device cpu uses no cards")
        return queue.kind_add_values(kind, words, name=name, cards=cards, priority=priority,
                                     added_by=added_by, client_id=client_id)

    async def _check_words(self, kind: str, words: list[str]) -> tuple[list[str], str]:
        """A serve / eval / download job's words checked by that command's own parser and checks, on
        this machine (its files, its models): ``gaudi-gui queue check`` as a short child."""
        argv = [sys.executable, "-m", "gaudi_gui", "queue", "check", "--kind", kind, "--", *words]
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), CHECK_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise QueueError(f"the check of the {kind} job's words took longer than {CHECK_S:g} s") from None
        import json
        try:
            checked = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
            return [str(w) for w in checked["words"]], str(checked["name"])
        except (ValueError, IndexError, KeyError, TypeError):
            said = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
            raise QueueError((said[-1] if said else f"the check failed (exit {proc.returncode})")
                             .removeprefix("gaudi-gui queue add: ")) from None

    # -- planning -----------------------------------------------------------------------------------
    def _timeout(self) -> float | None:
        """How long the loop may sleep when nothing is asked (None: until something is)."""
        pending = self.state.pending()
        if not pending or self.state.paused:
            return None
        now = time.time()
        waits: list[float] = []
        retries = [e.retry_at - now for e in pending if e.retry_at > now]
        if retries:
            waits.append(min(retries))
        if any(not e.cards.none for e in pending):
            if self.watched:
                waits.append(HOLDERS_S)
            checked = self.view.checked_at if self.view is not None else 0.0
            waits.append(max(0.05, checked + self.recheck_s - now))
        return max(0.05, min(waits)) if waits else None

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._timeout())
            self._wake.clear()
            try:
                await self._schedule()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug or a disk error in one plan must not end the queue
                import traceback
                traceback.print_exc()
                self.agent.publish(Ev.NOTICE, message=f"queue: a plan failed: {exc}", level="warning")
                await asyncio.sleep(1.0)
            if self.book.changed:
                self._save()
                self.agent.publish(Ev.QUEUE, **self.snapshot())

    async def _schedule(self) -> None:
        pending = self.state.pending()
        if not pending:
            self.watched = set()
            return
        wants_cards = any(not e.cards.none for e in pending) and not self.state.paused
        if wants_cards:
            if self.watched and not all(is_pid_alive(p) for p in self.watched):
                self.dirty = True  # a process that held a wanted card ended
            stale = self.view is None or time.time() - self.view.checked_at > self.recheck_s
            if self.dirty or stale:
                await self._look()
        elif self.view is None:
            self.view = CardsView(None, 0.0)
        decisions = queue.plan(self.state, self.view or CardsView(None, 0.0))
        if wants_cards and self.view is not None and time.time() - self.view.checked_at > FRESH_S \
                and any(d.action == "start" and d.cards for d in decisions):
            await self._look()
            decisions = queue.plan(self.state, self.view)
        for decision in decisions:
            entry = self.state.find(decision.entry_id)
            if entry is None or entry.state not in queue.PENDING:
                continue  # a request changed it while the cards were looked at
            if decision.action == "wait":
                if not (entry.state == "waiting" and entry.retry_at > time.time()):
                    self.book.set(entry, "waiting", decision.why)
                continue
            for passed in decision.passes:
                earlier = self.state.find(passed)
                if earlier is not None:
                    earlier.passed += 1
                    self.book.changed = True
            self._begin(entry, list(decision.cards))

    async def _look(self) -> None:
        self.view = await asyncio.to_thread(self._cards)
        self.dirty = False
        wanted: set[int] = set()
        for e in self.state.pending():
            wanted |= set(e.cards.ids) if e.cards.ids else set(range(64))
        self.watched = {p for p in self.view.holder_pids(wanted) if is_pid_alive(p)}

    # -- starting -----------------------------------------------------------------------------------
    def _begin(self, entry: Entry, cards: list[int]) -> None:
        """"starting" written (and published) before the start: an agent killed after it never
        starts it twice (a new one finds the run it made)."""
        entry.attempts += 1
        entry.cards_used = cards
        entry.start_pid = 0
        entry.start_create_time = 0.0
        entry.announce = ""
        self.book.set(entry, "starting", "")
        self._save()
        self.agent.publish(Ev.QUEUE, **self.snapshot())
        self._spawn(self._start(entry, cards))

    def job_of(self, entry: Entry, cards: list[int]) -> dict[str, Any]:
        """The ``job.start`` message of ``entry`` on ``cards``: a training job with its config and the
        options that shape the run; a serve, a calibration or a benchmark with ``--cards``; an
        evaluation with its cards as the visible devices of its environment (eval has no --cards); a
        download as it is."""
        from gaudi_gui.core.visibility import device_env, format_ids
        if entry.kind == "train":
            args = ["--device", entry.device, "--no-preflight"]
            if cards:
                args += ["--cards", format_ids(cards)]
            return {"kind": "train", "job": {"config": dict(entry.job), "args": args}}
        words = entry.words()
        message: dict[str, Any] = {"kind": entry.kind, "job": {"args": words}}
        if cards and entry.kind in ("serve", "calibrate", "benchmark"):
            words += ["--cards", format_ids(cards)]
        elif cards:
            on = "hpu" if self.view is not None and self.view.has_cards else \
                "cuda" if shutil.which("nvidia-smi") else ""
            if on:
                message["env"] = {k: str(v) for k, v in device_env(on, cards).items()}
        return message

    def _spawned(self, entry: Entry, pid: int) -> None:
        from gaudi_gui.core.proctree import ProcessRef
        ref = ProcessRef.of(pid)
        entry.start_pid = pid
        entry.start_create_time = ref.create_time if ref else 0.0
        self._save()

    async def _start(self, entry: Entry, cards: list[int]) -> None:
        from gaudi_gui.agent.jobs import StartRefused
        try:
            reply = await self.jobs().start_job(self.job_of(entry, cards),
                                                on_spawn=lambda pid: self._spawned(entry, pid))
        except StartRefused as exc:
            if exc.code == 2:
                # The job itself was refused (a bad field, another run's output folder): not transient.
                self.book.end(entry, "not started", str(exc))
            else:
                self._retry(entry, str(exc))
        except Refused as exc:
            self.book.end(entry, "not started", str(exc))
        except OSError as exc:
            self._retry(entry, f"could not start: {exc}")
        else:
            self._started(entry, reply["job"])
        self.dirty = True
        self._changed()

    def _retry(self, entry: Entry, what: str) -> None:
        if entry.state == "ended":
            return
        if entry.attempts >= queue.MAX_START_ATTEMPTS:
            self.book.end(entry, "not started", f"{what} (after {entry.attempts} attempts)")
            return
        delay = RETRY_S * 2 ** (entry.attempts - 1)
        entry.retry_at = time.time() + delay
        entry.cards_used = []
        self.book.set(entry, "waiting", f"start attempt {entry.attempts} of {queue.MAX_START_ATTEMPTS} "
                                        f"failed ({what}): retrying in {delay:g} s")

    def _started(self, entry: Entry, rec: dict[str, Any]) -> None:
        entry.run_folder = str(rec["folder"])
        entry.run_name = str(rec["job_id"])
        entry.started_at = time.time()
        entry.retry_at = 0.0
        entry.start_pid = 0
        self.book.set(entry, "started", "")
        if entry.stop_asked:
            entry.stop_asked = False
            with contextlib.suppress(Refused):
                self.jobs().stop_job(entry.run_name)
        # A run that ended before this line (a job that fails at once) was told to nobody yet.
        if rec.get("state") in FINAL_STATES and not rec.get("alive"):
            self._ended(entry, rec)

    def _ended(self, entry: Entry, rec: dict[str, Any]) -> None:
        entry.summary = str(rec.get("summary") or "")
        self.book.end(entry, str(rec.get("state") or "failed"))
        self.dirty = True  # its cards are free

    def _job_changed(self, rec: dict[str, Any]) -> None:
        """The jobs service's word on a run: one of ours that ended frees its turn and its cards."""
        if rec.get("state") not in FINAL_STATES or rec.get("alive"):
            return
        folder = str(rec.get("folder") or "")
        for entry in self.state.entries:
            if entry.state == "started" and entry.run_folder == folder:
                self._ended(entry, rec)
                self._changed()

    # -- a new agent takes the queue up ---------------------------------------------------------------
    def _take_up(self, entry: Entry) -> None:
        """A started entry of the previous agent: watched again, or ended as its run folder proves."""
        from gaudi_gui.agent.jobs import record
        run = Run(entry.run_folder)
        if not entry.run_folder or not run.exists():
            self.book.end(entry, "failed", "its run folder is gone")
            return
        if run.supervisor() is not None:
            with contextlib.suppress(Refused):
                rec = self.jobs().adopt(run.folder)
                if not (rec.get("state") in FINAL_STATES and not rec.get("alive")):
                    return
        self._ended(entry, record(run.folder))

    async def _recover_start(self, entry: Entry) -> None:
        """A start the previous agent did not see end: its command waited for, then its run taken."""
        from gaudi_gui.core.proctree import ProcessRef
        if entry.start_pid:
            ref = ProcessRef(entry.start_pid, entry.start_create_time)
            while ref.is_alive():
                await asyncio.sleep(0.2)
        run = self._run_made_by(entry)
        if entry.state != "starting":
            return
        if run is None:
            self._retry(entry, "the start was interrupted (the agent ended)")
        else:
            from gaudi_gui.agent.jobs import record
            rec = record(run.folder)
            if run.supervisor() is not None:
                with contextlib.suppress(Refused):
                    rec = self.jobs().adopt(run.folder)
            self._started(entry, rec)
        self.dirty = True
        self._changed()

    def _run_made_by(self, entry: Entry) -> Run | None:
        """The run a start of ``entry`` made: of its kind, begun once it was starting, no other
        entry's."""
        from gaudi_gui.core import kinds
        claimed = {e.run_folder for e in self.state.entries if e.run_folder}
        for run in RunStore().runs():
            if str(run.folder) in claimed or kinds.canonical(run.kind) != entry.kind:
                continue
            status = run.status()
            if status.started_at and status.started_at >= entry.since - 1.0:
                return run
        return None


def make(agent: Agent) -> QueueService:
    return QueueService(agent)
