"""The queue process: one per machine and user, the only writer of the queue's state (core/queue.py).

Started on demand (``queue.ensure_running``: ``gaudi-gui queue run`` in a session of its own), it
holds ``queue.lock`` for its whole life (a second one finds it taken and ends), records itself in
``queue.pid``, and ends when no job is queued, starting or running and no request waits.

Each turn (``TICK_S``, a quarter second) it applies the requests, follows its starting and started
jobs (a start child's announce file, a run's status), and, when a job waits for cards, decides what
starts (``queue.plan``). The cards are looked at by the doctor (``health.check_host``: hl-smi and
/proc, the same sources and the same gate as Start) only when something changed: a request, one of
its runs ended, a process that held a wanted card ended (its pid is watched, a /proc lookup per
turn), or ``RECHECK_S`` passed (a holder this /proc cannot see: another container). Waiting costs
a directory listing and a few stat calls per turn.

A start goes through the kind's existing detached path: a training job through ``gaudi-gui train
--announce FILE`` in a session of its own, the run's supervisor (exactly what ``train --detach``
starts), its run folder and output folder made by ``prepare_run``; a serve, eval or download job
through its kind's detached supervisor (``python -m gaudi_gui.commands.detach KIND``, exactly what
``serve|eval|download --detach`` starts), its run folder a ``core.jobkind`` one. Before it, the
entry is written "starting" with the announce file's name, so a queue process killed at any moment
is reconciled at its next start: the announce file says the run started (and where), a live start
child is waited for, a start child found by its command line is adopted; only a start that left
nothing is made again.

Qt-free and torch-free.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic, queue
from gaudi_gui.core.queue import CardsView, Entry, QueueState
from gaudi_gui.core.runstore import is_pid_alive

#: Seconds between two turns of the loop.
TICK_S = 0.25
#: Seconds between two looks at the cards while a job waits and nothing was seen to change.
RECHECK_S = 10.0
#: A look at the cards older than this is taken again before a start on cards.
FRESH_S = 2.0
#: Seconds to wait for the lock (a queue process that is just ending still holds it).
LOCK_WAIT_S = 5.0
#: The first retry of a transient start fault waits this long, each next one twice as long.
RETRY_S = 2.0
#: Replies nobody fetched are removed after this long.
REPLY_TTL_S = 600.0


def _env_float(name: str, default: float) -> float:
    with contextlib.suppress(ValueError):
        value = float(os.environ.get(name, ""))
        if value > 0:
            return value
    return default


def _log(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [queue {os.getpid()}] {text}", flush=True)


def check_cards() -> CardsView:
    """The doctor's look at this machine's cards (no hl-smi, /dev/accel node or habanalabs driver:
    none to look at; with a node or the driver, a missing hl-smi is the look's error)."""
    from gaudi_gui.core import health, hlsmi
    hl_smi = hlsmi.find_hl_smi()
    roots = health.Roots.from_env(hl_smi)
    if not hl_smi and not hlsmi.hl_smi_program()[1] and not health.gaudi_evidence(roots):
        return CardsView(None, time.time())
    return CardsView(health.check_host(roots), time.time())


class Runner:
    def __init__(self, root: Path | None = None, *,
                 cards: Callable[[], CardsView] = check_cards) -> None:
        self.root = queue.make_dirs(root)
        self.tick_s = _env_float("GAUDI_GUI_QUEUE_TICK_S", TICK_S)
        self.recheck_s = _env_float("GAUDI_GUI_QUEUE_RECHECK_S", RECHECK_S)
        self._cards = cards
        self.state = QueueState()
        self.view: CardsView | None = None
        self.dirty = True          # look at the cards again
        self.changed = False       # write the state
        self.watched: set[int] = set()
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self._lock_fd = -1
        self._stop = False

    # -- life ----------------------------------------------------------------------------------------

    def _lock(self) -> bool:
        fd = os.open(queue.lock_path(self.root), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lock_fd = fd
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)

    def _write_pid(self) -> None:
        from gaudi_gui.core.proctree import ProcessRef
        me = ProcessRef.of(os.getpid())
        atomic.write_json(queue.pid_path(self.root), {"pid": os.getpid(),
                                                      "create_time": me.create_time if me else 0.0},
                          fsync=False)

    def run(self) -> int:
        if not self._lock():
            _log("another queue process holds the lock: nothing to do")
            return 0
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self._write_pid()
        self.state = queue.read_state(self.root)
        if self.state.problem:
            # Kept aside for a person to look at; the queue goes on from an empty state.
            aside = queue.state_path(self.root).with_name(f"state.json.damaged-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(queue.state_path(self.root), aside)
            _log(f"{self.state.problem}: kept as {aside.name}; starting from an empty queue")
            self.state = QueueState()
        _log(f"started ({len(self.state.live())} jobs not ended)")
        self.reconcile()
        self._save()
        try:
            while not self._stop:
                try:
                    self.turn()
                except Exception:  # a bug or a disk error in one turn must not end the queue
                    import traceback
                    _log("a turn failed (the next one tries again):\n" + traceback.format_exc())
                    time.sleep(max(1.0, self.tick_s))
                if not self.state.live() and not queue.pending_requests(self.root) and self._may_end():
                    _log("the queue is empty: ending")
                    return 0
                time.sleep(self.tick_s)
            _log("asked to stop: the queue's state is kept; the next queue process goes on from it")
            return 0
        finally:
            self._save()
            os.close(self._lock_fd)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop = True

    def _may_end(self) -> bool:
        """Leave the pidfile, then look for a request once more: a requester that wrote its request
        before it read the pidfile is seen here; one that wrote it after starts a new queue process
        (which waits for this one's lock)."""
        with contextlib.suppress(OSError):
            queue.pid_path(self.root).unlink()
        if queue.pending_requests(self.root):
            self._write_pid()
            return False
        return True

    def _save(self) -> None:
        if len([e for e in self.state.entries if e.state == "ended"]) > queue.KEEP_ENDED:
            ended = [e for e in self.state.entries if e.state == "ended"]
            drop = {e.id for e in sorted(ended, key=lambda e: e.ended_at)[:-queue.KEEP_ENDED]}
            self.state.entries = [e for e in self.state.entries if e.id not in drop]
        queue.write_state(self.state, self.root)
        self.changed = False

    # -- one turn ------------------------------------------------------------------------------------

    def turn(self) -> None:
        self.apply_requests()
        self.follow()
        self.schedule()
        if self.changed:
            self._save()

    def _set(self, entry: Entry, state: str, why: str = "") -> None:
        if entry.state != state or entry.why != why:
            if entry.state != state:
                entry.since = time.time()
            entry.state = state
            entry.why = why
            self.changed = True

    # -- requests ------------------------------------------------------------------------------------

    def apply_requests(self) -> None:
        for path, request in queue.pending_requests(self.root):
            request_id = str(request.get("id") or path.stem)
            try:
                reply = self._apply(request)
            except queue.QueueError as exc:
                reply = {"ok": False, "message": str(exc)}
            except Exception as exc:  # one bad request must not end the queue
                reply = {"ok": False, "message": f"the queue process could not apply it: {exc!r}"}
            # The state first (what a reply promises is in it), then the reply, then the request gone.
            if self.changed:
                self._save()
            with contextlib.suppress(OSError):
                queue.write_reply(request_id, reply, self.root)
            with contextlib.suppress(OSError):
                path.unlink()
            _log(f"request {request.get('action')}: {reply.get('message')}")
            self.dirty = True
        self._clean_replies()

    def _apply(self, request: dict[str, Any]) -> dict[str, Any]:
        if "problem" in request:
            raise queue.QueueError(f"unreadable request: {request['problem']}")
        action = request.get("action")
        if action == "add":
            return self._add(request)
        if action == "set":
            return self._set_limits(request)
        if action in ("pause", "resume"):
            self.state.paused = action == "pause"
            self.changed = True
            return {"ok": True, "message": "queue paused" if self.state.paused else "queue resumed"}
        entry = self._entry(str(request.get("entry") or ""))
        if action == "remove":
            if entry.state in queue.ACTIVE:
                raise queue.QueueError(f"{entry.label()} has started: stop it (gaudi-gui queue stop "
                                       f"{entry.id}, or Stop in the Queue view)")
            if entry.state == "ended":
                raise queue.QueueError(f"{entry.label()} has already ended ({entry.outcome})")
            self._set(entry, "ended", "removed from the queue")
            entry.outcome = "removed"
            entry.ended_at = time.time()
            return {"ok": True, "message": f"removed {entry.label()}", "entry": entry.id}
        if action == "stop":
            return self._stop_entry(entry)
        if action == "move":
            target = self._entry(str(request.get("before") or ""))
            for e in (entry, target):
                if e.state not in queue.PENDING:
                    raise queue.QueueError(f"{e.label()} is {e.state}: only jobs not started yet move")
            if entry is target:
                return {"ok": True, "message": f"{entry.label()} stays where it is", "entry": entry.id}
            self.state.entries.remove(entry)
            self.state.entries.insert(self.state.entries.index(target), entry)
            # It runs before the target: it takes the target's priority (the order is priority first).
            entry.priority = target.priority
            self.changed = True
            return {"ok": True, "message": f"moved {entry.label()} before {target.label()} "
                                           f"(priority {entry.priority})", "entry": entry.id}
        raise queue.QueueError(f"unknown queue request {action!r}")

    def _set_limits(self, request: dict[str, Any]) -> dict[str, Any]:
        """``set``: the queue's own settings (how many CPU jobs run at once)."""
        if "cpu_jobs" not in request:
            raise queue.QueueError("set: nothing to set (--cpu-jobs N)")
        limit = queue.cpu_jobs_value(request["cpu_jobs"])
        if limit != self.state.cpu_jobs:
            self.state.cpu_jobs = limit
            self.changed = True
        return {"ok": True, "message": queue.cpu_jobs_text(limit), "cpu_jobs": limit}

    def _stop_entry(self, entry: Entry) -> dict[str, Any]:
        """``stop``: a started job is stopped as ``runs stop`` stops any run (its supervisor saves a
        checkpoint at the end of the current step, then escalates after its grace period); one still
        starting is stopped as soon as its run is known."""
        if entry.state in queue.PENDING:
            raise queue.QueueError(f"{entry.label()} has not started: Remove takes it out of the queue")
        if entry.state == "ended":
            raise queue.QueueError(f"{entry.label()} has already ended ({entry.outcome})")
        if entry.state == "starting":
            entry.stop_asked = True
            self.changed = True
            return {"ok": True, "message": f"{entry.label()} is stopped as soon as it has started",
                    "entry": entry.id}
        return {"ok": True, "message": f"{entry.label()}: {self._signal_stop(entry)}", "entry": entry.id}

    def _signal_stop(self, entry: Entry) -> str:
        from gaudi_gui.core.runstore import Run
        run = Run(entry.run_folder)
        supervisor = run.supervisor()
        if supervisor is not None:
            supervisor.signal(signal.SIGTERM)
            return ("stop requested: the run saves a checkpoint at the end of its current step, then "
                    "ends" if entry.kind == "train" else "stop requested")
        from gaudi_gui.core.stopper import Stopper
        if any(r.is_alive() for r in run.rank_refs()):
            return Stopper(run, run.status().launcher).request()
        return "the run is not running"

    def _entry(self, entry_id: str) -> Entry:
        entry = self.state.find(entry_id)
        if entry is None:
            known = ", ".join(e.id for e in self.state.entries if e.state != "ended") or "none"
            raise queue.QueueError(f"no queued job {entry_id!r} (queued now: {known})")
        return entry

    def _add(self, request: dict[str, Any]) -> dict[str, Any]:
        kind = str(request.get("kind") or "train")
        kind = queue.kind_name(kind)
        job = request.get("job")
        if not isinstance(job, dict):
            raise queue.QueueError("the request holds no job")
        if kind != "train" and not isinstance(job.get("words"), list):
            raise queue.QueueError(f"a {kind} job needs its command's words")
        if request.get("cpu_jobs") is not None:
            # The window's setting travels with its adds: the queue keeps the requester's limit.
            self._set_limits({"cpu_jobs": request["cpu_jobs"]})
        client_id = str(request.get("client_id") or "")
        made = next((e for e in self.state.entries if client_id and e.client_id == client_id), None)
        if made is not None:
            # The same add again (a retry after a dropped connection): the job is queued once.
            return {"ok": True, "message": f"already queued as {made.label()}", "entry": made.id,
                    "position": self.state.positions().get(made.id, 0)}
        output_dir = queue.resolved_dir(str(request.get("output_dir") or ""))
        other = queue.same_output(output_dir, self.state.entries)
        if other:
            raise queue.QueueError(queue.output_refusal(output_dir, other))
        entry = Entry(id=f"q{self.state.next_seq}", job=job, kind=kind, name=str(request.get("name") or ""),
                      priority=int(request.get("priority") or 0),
                      card_ids=[int(c) for c in request.get("card_ids") or []],
                      card_count=int(request.get("card_count") or 0),
                      device=str(request.get("device") or "auto"), output_dir=output_dir,
                      added_at=time.time(), added_by=str(request.get("added_by") or ""), client_id=client_id,
                      state="queued", since=time.time())
        self.state.next_seq += 1
        self.state.entries.append(entry)
        self.changed = True
        position = self.state.positions().get(entry.id, 0)
        return {"ok": True, "message": f"queued {entry.label()} at position {position}", "entry": entry.id,
                "position": position}

    def _clean_replies(self) -> None:
        now = time.time()
        with contextlib.suppress(OSError):
            for item in os.scandir(queue.replies_dir(self.root)):
                with contextlib.suppress(OSError):
                    if now - item.stat().st_mtime > REPLY_TTL_S:
                        os.unlink(item.path)

    # -- following the jobs it started ---------------------------------------------------------------

    def reconcile(self) -> None:
        """After a restart: what became of the starts and runs the last queue process left."""
        for entry in self.state.entries:
            if entry.state == "starting" and not Path(entry.announce).is_file():
                if entry.start_pid and self._start_child_alive(entry):
                    continue  # it is still making its run folder: followed as usual
                found = self._find_start_child(entry.announce)
                if found:
                    entry.start_pid, entry.start_create_time = found
                    self.changed = True
                    _log(f"{entry.label()}: adopted its start child (pid {found[0]})")
        self.follow()

    def _start_child_alive(self, entry: Entry) -> bool:
        from gaudi_gui.core.proctree import ProcessRef
        if entry.start_pid <= 0:
            return False
        if entry.id in self.children:
            return self.children[entry.id].poll() is None
        return ProcessRef(entry.start_pid, entry.start_create_time).is_alive()

    @staticmethod
    def _find_start_child(announce: str) -> tuple[int, float] | None:
        """A start child (killed before its pid was recorded) by the announce file in its command."""
        if not announce:
            return None
        import psutil
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            with contextlib.suppress(psutil.Error, TypeError):
                if announce in (proc.info["cmdline"] or []):
                    return proc.pid, float(proc.info["create_time"])
        return None

    def follow(self) -> None:
        for entry in self.state.entries:
            if entry.state == "starting":
                self._follow_start(entry)
            elif entry.state == "started":
                self._follow_run(entry)
        # Reap the supervisors this process started whose runs are over.
        for entry_id, proc in list(self.children.items()):
            if proc.poll() is not None:
                owner = self.state.find(entry_id)
                if owner is None or owner.state == "ended":
                    del self.children[entry_id]

    def _follow_start(self, entry: Entry) -> None:
        announce = Path(entry.announce)
        try:
            info = json.loads(announce.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict) and info.get("folder"):
            entry.run_folder = str(info["folder"])
            entry.run_name = str(info.get("name") or Path(entry.run_folder).name)
            entry.started_at = time.time()
            entry.retry_at = 0.0
            self._set(entry, "started", "")
            _log(f"{entry.label()}: started run {entry.run_name} on {entry.cards_used or 'no cards'}")
            if entry.stop_asked:
                entry.stop_asked = False
                _log(f"{entry.label()}: stop asked while it started: {self._signal_stop(entry)}")
            return
        if entry.start_pid and self._start_child_alive(entry):
            return
        # The start child is gone without announcing a run: why, from its own output.
        code = self.children.pop(entry.id).returncode if entry.id in self.children else None
        prelog = announce.with_suffix(".log")
        try:
            text = prelog.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = ""
        last = " ".join(text.splitlines()[-3:])[:600]
        if code == 2 or (code is None and "gaudi-gui train:" in text):
            # The job itself was refused (a bad field, an output folder of another run): not transient.
            self._end(entry, "not started", last or f"the start was refused (exit {code})")
            self.dirty = True
            return
        what = last or (f"the start exited with code {code}" if code is not None
                        else "the start was interrupted")
        if entry.attempts >= queue.MAX_START_ATTEMPTS:
            self._end(entry, "not started", f"{what} (after {entry.attempts} attempts)")
        else:
            delay = RETRY_S * 2 ** (entry.attempts - 1)
            entry.retry_at = time.time() + delay
            entry.cards_used = []
            self._set(entry, "waiting", f"start attempt {entry.attempts} of {queue.MAX_START_ATTEMPTS} "
                                        f"failed ({what}): retrying in {delay:g} s")
            _log(f"{entry.label()}: {entry.why}")
        self.dirty = True

    def _follow_run(self, entry: Entry) -> None:
        proc = self.children.get(entry.id)
        if proc is not None and proc.poll() is None:
            return  # its supervisor (our child) still runs
        from gaudi_gui.core.runstore import FINAL_STATES, Run
        run = Run(entry.run_folder)
        status = run.reconcile()
        if status.state in FINAL_STATES:
            entry.summary = status.summary or status.error
            self._end(entry, status.state, "")
            self.dirty = True

    def _end(self, entry: Entry, outcome: str, why: str) -> None:
        entry.outcome = outcome
        entry.ended_at = time.time()
        if why:
            entry.summary = entry.summary or why
        self._set(entry, "ended", why)
        _log(f"{entry.label()}: ended ({outcome}) {entry.summary}")
        # The start files were copies (the job is in the run folder, the reason in the entry).
        for attempt in range(1, entry.attempts + 1):
            for suffix in (".json", ".run", ".log"):
                with contextlib.suppress(OSError):
                    (queue.starts_dir(self.root) / f"{entry.id}-{attempt}{suffix}").unlink()

    # -- deciding and starting -----------------------------------------------------------------------

    def schedule(self) -> None:
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
                self._look()
        elif self.view is None:
            self.view = CardsView(None, 0.0)
        decisions = queue.plan(self.state, self.view or CardsView(None, 0.0))
        if wants_cards and any(d.action == "start" and d.cards for d in decisions) and self.view is not None \
                and time.time() - self.view.checked_at > FRESH_S:
            self._look()
            decisions = queue.plan(self.state, self.view)
        for decision in decisions:
            entry = self.state.find(decision.entry_id)
            if entry is None:
                continue
            if decision.action == "wait":
                if not (entry.state == "waiting" and entry.retry_at > time.time()):
                    self._set(entry, "waiting", decision.why)
                continue
            for passed in decision.passes:
                earlier = self.state.find(passed)
                if earlier is not None:
                    earlier.passed += 1
                    self.changed = True
            self.start(entry, list(decision.cards))

    def _look(self) -> None:
        self.view = self._cards()
        self.dirty = False
        wanted: set[int] = set()
        for e in self.state.pending():
            wanted |= set(e.cards.ids) if e.cards.ids else set(range(64))
        self.watched = {p for p in (self.view.holder_pids(wanted) if self.view else set()) if is_pid_alive(p)}

    def start_argv(self, entry: Entry, cards: list[int], config: Path,
                   announce: Path) -> tuple[list[str], dict[str, str] | None]:
        """The start child of ``entry`` (and its environment; None: this one). Training: ``gaudi-gui
        train --announce`` (what ``train --detach`` runs). Serve, eval, download: the kind's own
        detached supervisor (``python -m gaudi_gui.commands.detach KIND``, what ``serve|eval|download
        --detach`` starts), with ``config`` as its payload: the command and the run's name."""
        if entry.kind == "train":
            atomic.write_json(config, entry.job, fsync=False)
            argv = [sys.executable, "-m", "gaudi_gui", "train", "--config", str(config), "--device",
                    entry.device, "--announce", str(announce), "--no-preflight"]
            if cards:
                argv += ["--cards", ",".join(str(c) for c in cards)]
            return argv, None
        from gaudi_gui.core.visibility import device_env, format_ids
        what, run_kind = queue.KIND_COMMAND[entry.kind]
        words = entry.words()
        env: dict[str, str] | None = None
        if cards and entry.kind == "serve":
            words += ["--cards", format_ids(cards)]
        elif cards:
            # eval has no --cards: the cards are the visible ones of its environment.
            on = "hpu" if self.view is not None and self.view.has_cards else \
                "cuda" if shutil.which("nvidia-smi") else ""
            env = {**os.environ, **device_env(on, cards)} if on else None
        payload = {"argv": [sys.executable, "-m", "gaudi_gui", what, *words, "--events"],
                   "name": entry.job.get("name") or entry.name or entry.kind}
        atomic.write_json(config, payload, fsync=False)
        return [sys.executable, "-m", "gaudi_gui.commands.detach", run_kind, str(config), str(announce),
                "30", ""], env

    def start(self, entry: Entry, cards: list[int]) -> None:
        """Start ``entry`` through its kind's detached path; "starting" is written first."""
        starts = queue.starts_dir(self.root)
        config = starts / f"{entry.id}-{entry.attempts + 1}.json"
        announce = config.with_suffix(".run")
        prelog = config.with_suffix(".log")
        entry.attempts += 1
        entry.announce = str(announce)
        entry.cards_used = cards
        entry.start_pid = 0
        entry.start_create_time = 0.0
        self._set(entry, "starting", "")
        self._save()  # before the start: a queue process killed after it never starts it twice
        try:
            argv, env = self.start_argv(entry, cards, config, announce)
            with open(prelog, "wb") as out:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, close_fds=True, env=env)
        except OSError as exc:
            with contextlib.suppress(OSError):
                prelog.write_text(f"could not start: {exc}\n", encoding="utf-8")
            _log(f"{entry.label()}: could not start: {exc}")
            return  # followed as a start child that is gone: a transient fault, retried
        from gaudi_gui.core.proctree import ProcessRef
        ref = ProcessRef.of(proc.pid)
        entry.start_pid = proc.pid
        entry.start_create_time = ref.create_time if ref else 0.0
        self.children[entry.id] = proc
        self.changed = True
        _log(f"{entry.label()}: starting on {cards or 'no cards'} (attempt {entry.attempts}, pid {proc.pid})")


def main(root: Path | None = None) -> int:
    return Runner(root).run()


__all__ = ["RECHECK_S", "TICK_S", "Runner", "check_cards", "main"]
