"""One training run on several hosts, as the Training tab sees it: ONE ``TrainingJob`` made of one
``RemoteTrainingJob`` per host (each follows its host's run folder over ssh, with reconnects).

The hosts run accelerate's own multi-node launch (``core/multi_host.py`` makes each host's job: the
same job with ``num_machines N``, its ``machine_rank``, host 0's address and the main port). Before
anything starts, the pre-flight of ``core/multi_host.py`` asks every host (reachable with this
gaudi-gui, same library versions, the job's paths there, the main port free on host 0) in a plain
thread that touches no Qt object: its answer goes through a queue the GUI thread polls.

What the views get: records, progress and checkpoints from machine rank 0 (global rank 0); every
host's log lines prefixed ``host| ``; ``hosts_changed`` whenever a host's state or connection moves.
Stop asks every host for a stop with a checkpoint (the ranks agree on the step through their own
all-reduce), a second Stop kills every host's ranks. A host whose ranks fail or are killed, or whose
connection stays lost for ``lost_after_s``, is named in the summary and the other hosts are killed at
once: they would otherwise wait for it in a collective until a timeout. ``finished`` comes when every
host's run has ended.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import multi_host
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.remote import Host, RemoteError
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.services.process import delete_when_reaped
from gaudi_gui.services.remote_training import CLOSED, RECONNECTING, HostedJob, RemoteTrainingJob

#: How long a host may stay unreachable before the run counts it as lost (the CLI's default too).
LOST_AFTER_S = 600.0
#: How often the GUI thread looks for the pre-flight's answer.
PREFLIGHT_POLL_MS = 100


def log_prefix(host: str) -> str:
    """What every log line of ``host`` starts with (the log view filters on it)."""
    return f"{host}| "


def _preflight(hosts: list[Host], job: JobConfig, port: int, main_ip: str,
               out: queue.Queue[tuple[str, list[str]]]) -> None:
    """Thread body: host 0's address and the pre-flight's problems, onto ``out``. No Qt here."""
    try:
        address = main_ip or multi_host.main_address(hosts[0])
        problems = multi_host.preflight(hosts, job, port)
    except (RemoteError, OSError, ValueError) as exc:
        address, problems = main_ip, [str(exc)]
    except Exception as exc:  # the thread must always answer, or the run would wait forever
        address, problems = main_ip, [f"the pre-flight failed: {exc!r}"]
    out.put((address, problems))


class MultiHostTrainingJob(HostedJob):
    """One job across ``hosts`` (machine rank = position): composed of a RemoteTrainingJob per host."""

    #: A host's state or connection changed (the tab's host line reads ``host_states()``).
    hosts_changed = Signal()
    #: Every host answered with its run folder: carries host 0's folder.
    run_identified = Signal(str)

    def __init__(self, hosts: list[Host], store: RunStore | None = None, *, stop_grace_s: float = 120.0,
                 lost_after_s: float = LOST_AFTER_S, parent: QObject | None = None) -> None:
        super().__init__(store, stop_grace_s=stop_grace_s, parent=parent)
        if len(hosts) < 2:
            raise ValueError("a multi-host run needs two or more hosts")
        self.hosts = list(hosts)
        #: Host 0 (the main process): what single-host code asks a remote job for.
        self.host = self.hosts[0]
        self.parts: list[RemoteTrainingJob] = []
        self.lost_after_s = lost_after_s
        self.main_ip = ""
        self.port = 0
        self.device = "auto"
        #: Each host's cards by host name (a host not in it: all of its cards).
        self.cards: dict[str, list[int]] = {}
        #: The job as the user wrote it (before each host's machine rank is set in).
        self.job_dict: dict[str, Any] = {}
        #: "host (machine rank i): why" of the host whose failure ended the run ("" otherwise).
        self.failure = ""
        self._active = False
        self._stop_sent = 0  # 1: stop with a checkpoint asked of every host, 2: kill asked
        self._given_up: set[int] = set()
        self._reconnecting_since: dict[int, float] = {}
        self._tail: deque[str] = deque(maxlen=30)
        self._answers: queue.Queue[tuple[str, list[str]]] = queue.Queue()
        self._preflight_thread: threading.Thread | None = None
        self._preflight_timer = QTimer(self)
        self._preflight_timer.setInterval(PREFLIGHT_POLL_MS)
        self._preflight_timer.timeout.connect(self._check_preflight)
        self._lost_timer = QTimer(self)
        self._lost_timer.setInterval(1000)
        self._lost_timer.timeout.connect(self._check_lost)

    # -- state ------------------------------------------------------------------------------------

    @property
    def folder(self) -> str:
        """Host 0's run folder (a path on host 0), "" until it answered."""
        return self.parts[0].folder if self.parts else ""

    @property
    def name(self) -> str:
        return self.parts[0].name if self.parts else ""

    @property
    def resumed_from(self) -> str:
        return ""

    @property
    def remote_status(self) -> dict[str, Any]:
        return self.parts[0].remote_status if self.parts else {}

    def host_names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def describe(self) -> str:
        return (f"training run {self.name or 'starting'} on {len(self.hosts)} hosts "
                f"({', '.join(self.host_names())}; {self.state}, step {self.progress.step}/"
                f"{self.progress.max_steps})")

    def checkpoint(self) -> str:
        """The latest complete checkpoint machine rank 0 reported (a path on host 0), or ""."""
        return self.parts[0].checkpoint() if self.parts else ""

    def host_states(self) -> list[tuple[str, int, str]]:
        """(host, machine rank, a word or two: its state and connection) for every host."""
        out = []
        for rank, host in enumerate(self.hosts):
            part = self.parts[rank] if rank < len(self.parts) else None
            if part is None:
                word = "pre-flight" if self.is_running() else self.state
            elif rank in self._given_up:
                word = "lost"
            elif part.is_running() and part.connection == RECONNECTING:
                word = f"{part.state}, reconnecting"
            else:
                word = part.state
            if self.failure and self.failure.startswith(f"{host.name} "):
                word += " ✗"
            out.append((host.name, rank, word))
        return out

    def to_entry(self) -> dict[str, Any]:
        """What the supervisor keeps to follow this run again after a restart."""
        return {"host": self.host.name, "folder": self.folder, "name": self.name, "job": self.job_dict,
                "hosts": [p.to_entry() for p in self.parts], "main_ip": self.main_ip, "port": self.port}

    # -- starting ---------------------------------------------------------------------------------

    def start_multi(self, job: JobConfig, *, main_ip: str = "", device: str = "auto",
                    cards: Mapping[str, Sequence[int]] | None = None) -> None:
        """Pre-flight on every host (in a thread), then start each host's part; the outcome comes
        asynchronously (``run_identified``, or ``finished`` with "failed" and the reasons).
        ``cards``: each host's cards by host name (``train --cards`` there; absent: all of them)."""
        if self.is_running():
            raise RuntimeError("this job is already running")
        self._reset()
        self.job = job
        self.job_dict = job.to_dict()
        self.port = int(job.launch.main_process_port or multi_host.DEFAULT_PORT)
        self.main_ip = main_ip.strip()
        self.device = device
        self.cards = {name: sorted(set(ids)) for name, ids in (cards or {}).items() if ids}
        self._active = True
        self._set_state("queued")
        self._set_summary(f"pre-flight on {', '.join(self.host_names())}: versions, paths, port "
                          f"{self.port}…")
        self._say(f"pre-flight on {', '.join(self.host_names())} …")
        self._preflight_thread = threading.Thread(
            target=_preflight, args=(list(self.hosts), job, self.port, self.main_ip, self._answers),
            name="multi-host-preflight", daemon=True)
        self._preflight_thread.start()
        self._preflight_timer.start()
        self.hosts_changed.emit()

    def _check_preflight(self) -> None:
        try:
            address, problems = self._answers.get_nowait()
        except queue.Empty:
            return
        self._preflight_timer.stop()
        if self._preflight_thread is not None:
            self._preflight_thread.join(timeout=5)
            self._preflight_thread = None
        if self._ended:
            return
        if self._stop_sent:
            self._end_now("stopped", "Stopped before the run started on any host")
            return
        if problems:
            for line in problems:
                self._say(f"pre-flight: {line}")
            more = f" (and {len(problems) - 1} more: see the log)" if len(problems) > 1 else ""
            self._end_now("failed", f"Failed: pre-flight: {problems[0]}{more}")
            return
        self.main_ip = address
        parts = multi_host.host_jobs(self.job or JobConfig(), len(self.hosts), address, self.port)
        for part in parts:
            invalid = [m for _f, m in part.validate()]
            if invalid:
                self._end_now("failed", f"Failed: {invalid[0]}")
                return
        n = self.job.launch.num_processes if self.job else 1
        self._say(f"main process {address}:{self.port}; {len(self.hosts)} machines × {n} process(es) "
                  f"(the run goes on if the app or a connection ends)")
        for rank, (host, part) in enumerate(zip(self.hosts, parts, strict=True)):
            self._add_part(rank, host).start_remote(part, device=self.device,
                                                    cards=self.cards.get(host.name, ()))
        self._lost_timer.start()
        self.hosts_changed.emit()

    def follow_existing(self, entries: list[dict[str, Any]], *, job: dict[str, Any] | None = None,
                        main_ip: str = "", port: int = 0) -> None:
        """Follow a multi-host run this app started before (after a restart), every host again."""
        self._reset()
        self.job_dict = dict(job or {})
        with contextlib.suppress(Exception):
            self.job = JobConfig.from_dict(self.job_dict)
        self.main_ip, self.port = main_ip, port
        self._active = True
        self._set_state("running")
        self._set_summary(f"re-attaching to the run on {', '.join(self.host_names())}…")
        for rank, (host, entry) in enumerate(zip(self.hosts, entries, strict=True)):
            part = self._add_part(rank, host)
            part_job = entry.get("job")
            part.follow_existing(str(entry.get("folder", "")), name=str(entry.get("name", "") or ""),
                                 job=part_job if isinstance(part_job, dict) else None,
                                 cards=entry.get("cards") or ())
            if part.cards:
                self.cards[host.name] = list(part.cards)
        self._lost_timer.start()
        self.hosts_changed.emit()

    def _add_part(self, rank: int, host: Host) -> RemoteTrainingJob:
        part = RemoteTrainingJob(host, self.store, stop_grace_s=self.stop_grace_s, parent=self)
        # Methods bound with partial, not lambdas: a lambda slot returning emit()'s value leaks
        # references in PySide6 (see TrainingJob._on_progress).
        part.log_line_received.connect(functools.partial(self._on_part_log, rank))
        part.event_received.connect(functools.partial(self._on_part_event, rank))
        part.summary_changed.connect(functools.partial(self._on_part_summary, rank))
        part.status_changed.connect(functools.partial(self._on_part_state, rank))
        part.connection_changed.connect(functools.partial(self._on_part_connection, rank))
        part.run_identified.connect(functools.partial(self._on_part_identified, rank))
        part.finished.connect(functools.partial(self._on_part_finished, rank))
        if rank == 0:
            part.metrics_received.connect(self._on_main_metrics)
        self.parts.append(part)
        return part

    def _reset(self) -> None:
        super()._reset()
        for part in self.parts:
            part.shutdown()
            delete_when_reaped(part)
        self.parts = []
        self.cards = {}
        self.failure = ""
        self._stop_sent = 0
        self._given_up = set()
        self._reconnecting_since = {}
        self._tail.clear()
        self._active = False

    # -- what the parts say -----------------------------------------------------------------------

    def _say(self, text: str) -> None:
        self._line(f"[gaudi-gui] {text}")

    def _line(self, line: str) -> None:
        self._tail.append(line)
        self.log_line_received.emit(line)

    def _on_part_log(self, rank: int, line: str) -> None:
        self._line(log_prefix(self.hosts[rank].name) + line)

    def _on_main_metrics(self, record: dict[str, Any]) -> None:
        # Charts and progress come from machine rank 0 (global rank 0 logs for the whole group).
        self.records.append(record)
        self.progress.update(record)
        if not self._stop_sent and not self.failure and not self.saving_since:
            self._set_summary(f"training on {len(self.hosts)} hosts: step {self.progress.step} of "
                              f"{self.progress.max_steps}")
        self.metrics_received.emit(record)

    def _on_part_event(self, rank: int, event: dict[str, Any]) -> None:
        if rank == 0:
            self.events.append(event)
            if event.get("type") == "training_started":
                self.progress.update(event)
                if isinstance(event.get("start_step"), int):
                    self.progress.step = max(self.progress.step, event["start_step"])
            self.saving_since = self.parts[0].saving_since
            self.event_received.emit(event)
        elif event.get("type") == "error":
            self._say(f"{self.hosts[rank].name}: error ({event.get('kind')}): {event.get('message')}")

    def _on_part_summary(self, rank: int, text: str) -> None:
        if self._ended or self.failure or not text:
            return
        part = self.parts[rank]
        if rank == 0 and part.is_running():
            self._set_summary(text)
        elif part.connection == RECONNECTING:
            self._set_summary(text)  # a host dropped: the reconnecting line names it

    def _on_part_state(self, _rank: int, _state: str) -> None:
        if self.parts and all(p.folder for p in self.parts) and self.state == "queued":
            self._set_state("running")
        self.hosts_changed.emit()

    def _on_part_connection(self, rank: int, state: str, _message: str) -> None:
        if state == RECONNECTING:
            self._reconnecting_since.setdefault(rank, time.monotonic())
        elif state != CLOSED:
            self._reconnecting_since.pop(rank, None)
        self.hosts_changed.emit()

    def _on_part_identified(self, rank: int, folder: str) -> None:
        self._say(f"{self.hosts[rank].name}: machine rank {rank}, run folder {folder}")
        if all(p.folder for p in self.parts):
            if self.state == "queued":
                self._set_state("running")
            self.run_identified.emit(self.folder)
        self.hosts_changed.emit()

    def _check_lost(self) -> None:
        now = time.monotonic()
        for rank, since in list(self._reconnecting_since.items()):
            part = self.parts[rank]
            if rank in self._given_up or not part.is_running() or now - since < self.lost_after_s:
                continue
            self._given_up.add(rank)
            if not self.failure:
                self._host_failed(rank, f"unreachable for {self.lost_after_s:g} s")
            # Asked to kill its ranks in case it comes back; no longer waited for.
            part.kill()
            part.detach()
            self._maybe_finish()

    def _host_failed(self, rank: int, why: str) -> None:
        host = self.hosts[rank].name
        self.failure = f"{host} (machine rank {rank}): {why}"
        self._say(f"{self.failure} — killing the other hosts' ranks, which would otherwise wait for it "
                  f"in a collective")
        self._set_state("stopping")
        self._set_summary(f"{host} failed ({why}); killing the other hosts' ranks…")
        for other, part in enumerate(self.parts):
            if other != rank and part.is_running():
                part.kill("host failed")
        self.hosts_changed.emit()

    def _on_part_finished(self, rank: int, _code: int, state: str, _tail: list[str]) -> None:
        part = self.parts[rank]
        self._say(f"{self.hosts[rank].name}: {part.summary or state}")
        if state not in ("finished", "stopped") and not self.failure and self._stop_sent < 2:
            self._host_failed(rank, part.summary or state)
        self.hosts_changed.emit()
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._ended or any(p.is_running() and i not in self._given_up for i, p in enumerate(self.parts)):
            return
        states = [p.state for p in self.parts]
        main = self.parts[0]
        if self.failure:
            state = "failed"
            summary = f"Failed on {self.failure}; the other hosts' ranks were killed"
        else:
            state = states[0] if len(set(states)) == 1 else ("killed" if self._stop_sent > 1 else "failed")
            summary = str(main.remote_status.get("summary") or main.summary or state)
            if len(set(states)) > 1:
                summary += " — " + ", ".join(f"{h}: {s}" for h, s in zip(self.host_names(), states,
                                                                        strict=True))
        self._end_now(state, f"{summary} (on {len(self.hosts)} hosts: {', '.join(self.host_names())})")

    def _end_now(self, state: str, summary: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._active = False
        for timer in (self._preflight_timer, self._lost_timer, self._tick, self._kill_timer, self._follow):
            timer.stop()
        self.saving_since = 0.0
        self._set_summary(summary)
        self._set_state(state)
        self.hosts_changed.emit()
        self.finished.emit(0 if state in ("finished", "stopped") else 1, state, list(self._tail))

    # -- stopping ---------------------------------------------------------------------------------

    def _request_stop(self) -> None:
        """Every host stops with a checkpoint (Stop again: ``kill`` every host's ranks now)."""
        self._set_summary(f"stopping on every host ({', '.join(self.host_names())}): checkpoint at the "
                          f"end of the current step…")
        self._say("stop: every host saves a checkpoint at the end of the current step (Stop again: "
                  "kill now)")
        for part in self.parts:
            if part.is_running() and not part.stopping:
                part.stop()

    def kill(self, reason: str = "request") -> None:
        """Kill every host's ranks now (no checkpoint from this stop)."""
        if not self.is_running():
            return
        self._stop_sent = 2
        self._set_state("stopping")
        self._say("killing every host's ranks now")
        for part in self.parts:
            if part.is_running():
                part.kill(reason)

    def _on_tick(self) -> None:
        pass  # the parts keep their own clocks; host 0's summary is shown

    # -- the app ends -----------------------------------------------------------------------------

    def detach(self) -> None:
        """Stop following (the app exits): the run goes on on every host."""
        self._active = False
        for timer in (self._preflight_timer, self._lost_timer):
            timer.stop()
        for part in self.parts:
            part.detach()

    def shutdown(self) -> None:
        for timer in (self._preflight_timer, self._lost_timer):
            timer.stop()
        for part in self.parts:
            part.shutdown()
        if self._preflight_thread is not None:
            # Its ssh calls end by their own timeouts; nothing here waits on them.
            self._preflight_thread = None


__all__ = ["LOST_AFTER_S", "MultiHostTrainingJob", "log_prefix"]
