"""One training run at any placement, as the Training tab and the supervisor service see it.

A run is *work × placement* (``core.placement``): this machine, one host, several hosts (accelerate's
multi-node launch) or Slurm. ``TrainingJob`` is the one class for all of them: it follows the run
through N parts (``services.run_parts.AgentPart``: one per place), N = 1 except on several hosts.
Every part is a ``gaudi-gui train --detach`` supervisor (stop, grace, kill-now, step writes, waiting
for killed ranks, leftovers, outcome; for Slurm ``train --slurm --detach``, which submits and follows
the job), the same one a terminal's ``gaudi-gui train`` runs, so the GUI and the CLI stop and judge a
run alike; the agent of its place starts and watches it (this machine's, also for Slurm, or a host's
through this machine's agent's one ssh session): the window holds no process for it.

What the views get is the same for every placement: the console lines (each host's prefixed
``host| `` when there are several), the records and progress of the main part (machine rank 0:
global rank 0 logs for the whole group), one state and one summary. Stop asks every part for a stop
with a checkpoint, a second Stop kills. A part that fails (or stays unreachable for
``lost_after_s``) ends the others at once: they would otherwise wait for it in a collective.

What a run on several hosts asks of the hosts before it starts (the pre-flight) and after it ends (the
whole job's meter kept in host 0's run) are ssh calls: this machine's agent runs each as its child
(``gaudi-gui hosts --preflight`` / ``--keep-job-meter``, agent/children.py), never a thread here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import multi_host
from gaudi_gui.core.events import EventType
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.prepare import PrepareError
from gaudi_gui.core.progress import RunProgress, note
from gaudi_gui.core.remote import Host
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.services.agent_child import AgentChild
from gaudi_gui.services.run_parts import CLOSED, FOLLOWING, RECONNECTING, AgentPart

#: How long a host may stay unreachable before a run on several hosts counts it as lost.
LOST_AFTER_S = 600.0

Part = AgentPart


def log_prefix(host: str) -> str:
    """What every log line of ``host`` starts with in a run on several hosts (the log view filters on it)."""
    return f"{host}| "


def _answer(lines: Sequence[str]) -> dict[str, Any] | None:
    """The one JSON object a child printed last on its stdout, None when it printed none."""
    with contextlib.suppress(ValueError, IndexError):
        answer = json.loads(lines[-1])
        return answer if isinstance(answer, dict) else None
    return None


def _why(child: AgentChild, code: int) -> str:
    """Why a child gave no answer: its last words (its stderr, or the agent's refusal), else its exit."""
    tail = [t for t in child.tail(5) if t.strip()]
    return tail[-1] if tail else f"exit {code}"


class TrainingJob(QObject):
    """One training run at ``placement``: started here, or followed again (a restart, the CLI)."""

    #: The run's supervisor started: carries its pid (on its host).
    started = Signal(int)
    #: A console line (secrets redacted), or a line of this app about the run ("[gaudi-gui] …").
    log_line_received = Signal(str)
    #: A metrics record of the main part (step, max_steps, start_step, loss, learning_rate, ...).
    metrics_received = Signal(dict)
    #: Any other event of the main part (phase, training_started, checkpoint_saving/_saved, error...).
    event_received = Signal(dict)
    #: The run's state changed: queued / running / stopping / finished / failed / stopped / killed.
    status_changed = Signal(str)
    #: One human line about the run changed ("saving checkpoint… 4 s", "Stopped at step 40 — ...").
    summary_changed = Signal(str)
    #: The run ended: (exit code, final state, last lines).
    finished = Signal(int, str, list)
    #: Every part has its run folder: carries the main part's.
    run_identified = Signal(str)
    #: A part's state or connection changed (the tab's host line reads ``host_states()``).
    hosts_changed = Signal()
    #: A profiled run that ended on a host was brought into this machine's runs store: carries the
    #: local copy's folder (its trace opens from Training → Runs, Profile…).
    profile_brought = Signal(str)

    def __init__(self, placement: Placement, store: RunStore | None = None, *, stop_grace_s: float = 120.0,
                 lost_after_s: float = LOST_AFTER_S, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.placement = placement
        self.store = store or RunStore()
        self.stop_grace_s = stop_grace_s
        self.lost_after_s = lost_after_s
        self.parts: list[Part] = []
        #: The job as the user wrote it (what a Resume sends again, with its checkpoint).
        self.job: JobConfig | None = None
        self.job_dict: dict[str, Any] = {}
        #: The run this one resumes (a folder at the same place), "" for a fresh run.
        self.resumed_from = ""
        self.device = "auto"
        #: Several hosts: host 0's address as the others reach it, and the main port.
        self.main_ip = ""
        self.port = 0
        self.state = "idle"
        self.summary = ""
        #: (machine rank, why) of every host that failed, in the order they were heard of.
        self._failures: list[tuple[int, str]] = []
        #: The main part's events, and where they say the run is (``core.progress``, as the CLI reads it).
        self.progress = RunProgress()
        self.events: list[dict[str, Any]] = []
        self._active = False
        self._ended = False
        self._followed = False
        self._stop_sent = 0  # 1: stop with a checkpoint asked of every part, 2: kill asked
        #: The checkpoint the stop saved ("" until then): the stop's notes never go back to "waiting
        #: for the current step" once it is written.
        self._stop_saved = ""
        self._stop_at = 0.0
        self._results: dict[int, tuple[str, str]] = {}
        self._codes: dict[int, int] = {}
        self._resumed_parts: list[str] = []
        self._given_up: set[int] = set()
        self._reconnecting_since: dict[int, float] = {}
        self._tail: deque[str] = deque(maxlen=30)
        #: Several hosts: the agent's ``hosts_preflight`` child before the start, and the stdout lines
        #: it printed (its answer is the last).
        self._preflight_child: AgentChild | None = None
        self._preflight_said: list[str] = []
        #: Several hosts: the agent's ``keep_job_meter`` child after the end (the whole job's meter kept
        #: in host 0's run), the host it keeps it on and what it printed; its answer is said in the log.
        self._keep_child: AgentChild | None = None
        self._keep_host: Host | None = None
        self._keep_said: list[str] = []
        #: A profiled run on a host, once it ended: the agent's ``fetch`` child bringing it here, and
        #: where it was brought ("" until then).
        self._fetch_child: AgentChild | None = None
        self.local_copy = ""
        self._lost_timer = QTimer(self)
        self._lost_timer.setInterval(1000)
        self._lost_timer.timeout.connect(self._check_lost)
        self._tick = QTimer(self)
        self._tick.setInterval(1000)
        self._tick.timeout.connect(self._on_tick)

    # -- what the views read ----------------------------------------------------------------------

    @property
    def records(self) -> list[dict[str, Any]]:
        """The main part's metrics records (the chart's points)."""
        return self.progress.records

    @property
    def kind(self) -> str:
        return self.placement.kind

    @property
    def is_remote(self) -> bool:
        """The run's processes are elsewhere: this machine's cards and their chart do not apply."""
        return self.placement.kind != "local"

    @property
    def hosts(self) -> list[Host]:
        return self.placement.places

    @property
    def host(self) -> Host:
        """The main part's host (Slurm: its login host)."""
        return self.parts[0].host if self.parts else self.hosts[0]

    def host_names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def job_meter(self) -> dict[str, Any] | None:
        """A job of several parts (hosts): its meter, the parts' summaries summed
        (``core.meter_account.combine``); None for a job of one part (its run's own summary says it all)."""
        if len(self.parts) < 2:
            return None
        from gaudi_gui.core import meter_account
        return meter_account.combine([(p.host.name, p.meter) for p in self.parts])

    @property
    def _main(self) -> Part | None:
        return self.parts[0] if self.parts else None

    @property
    def folder(self) -> str:
        """The main part's run folder (a path at its place), "" until known."""
        return self._main.folder if self._main else ""

    @property
    def name(self) -> str:
        return self._main.name if self._main else ""

    @property
    def pid(self) -> int:
        return self._main.pid if self._main else 0

    @property
    def run(self) -> Run | None:
        """The run folder on this machine (a run here), None elsewhere or before it exists."""
        return Run(self.folder) if self.placement.kind == "local" and self.folder else None

    @property
    def remote_status(self) -> dict[str, Any]:
        """The main part's last status as its supervisor wrote it (state, step, checkpoint, ...)."""
        return self._main.remote_status if self._main else {}

    @property
    def connection(self) -> str:
        return self._main.connection if self._main else CLOSED

    @property
    def job_id(self) -> str:
        """The Slurm job id ("" elsewhere, or before sbatch answered)."""
        return self._main.slurm_job_id if self._main else ""

    @property
    def cards(self) -> dict[str, list[int]]:
        """Each place's cards by host name (a place not in it: its default)."""
        return {p.host.name: list(p.cards) for p in self.parts if p.cards}

    def checkpoint(self) -> str:
        """The latest complete checkpoint the main part reported (a path at its place), or ""."""
        return self._main.checkpoint() if self._main else ""

    def is_running(self) -> bool:
        return self._active and not self._ended

    @property
    def attached(self) -> bool:
        """Followed again (a restart, or a run the CLI started), not started by this job."""
        return self._followed and self.is_running()

    @property
    def stopping(self) -> bool:
        return self._stop_sent > 0 and self.is_running()

    @property
    def where(self) -> str:
        """The words a sentence about the run ends with: "", " on HOST", " on 2 hosts", " on Slurm"."""
        if self.placement.kind == "host":
            return f" on {self.placement.host.name}"
        if self.placement.kind == "hosts":
            return f" on {len(self.hosts)} hosts"
        return " on Slurm" if self.placement.kind == "slurm" else ""

    def describe(self) -> str:
        what = f"Slurm job {self.job_id}" if self.job_id else ""
        where = f" as {what}" if what else (f" on {', '.join(self.host_names())}" if self.is_remote
                                            and self.placement.kind != "slurm" else self.where)
        return (f"training run {self.name or 'starting'}{where} ({self.state}, step {self.progress.step}/"
                f"{self.progress.max_steps})")

    def host_states(self) -> list[tuple[str, int, str]]:
        """(host, machine rank, a word or two: its state and connection) for every place; the host
        whose end caused the run's is marked ✗."""
        out = []
        cause = self._cause()
        for rank, host in enumerate(self.hosts):
            part = self.parts[rank] if rank < len(self.parts) else None
            if part is None:
                word = "pre-flight" if self.is_running() else self.state
            elif rank in self._given_up:
                word = "lost"
            elif rank in self._results:
                word = self._results[rank][0]
            elif part.connection == RECONNECTING:
                word = f"{self._part_word(part)}, reconnecting"
            else:
                word = self._part_word(part)
            if cause is not None and cause[0] == rank:
                word += " ✗"
            out.append((host.name, rank, word))
        return out

    def _part_word(self, part: Part) -> str:
        if not part.folder:
            return "queued"
        return "stopping" if part.stop_sent else "running"

    def to_record(self) -> dict[str, Any] | None:
        """What is kept to follow this run again after a restart, the same for every placement:
        ``{"placement", "parts": [{"host", "folder", "name", ...}], "job", "resumed_from", "main_ip",
        "port"}``; None while there is nothing to follow yet (a part without its folder)."""
        if not self.parts or not all(p.folder for p in self.parts):
            return None
        return {"placement": self.placement.to_record(), "parts": [p.to_entry() for p in self.parts],
                "job": self.job_dict, "resumed_from": self.resumed_from, "main_ip": self.main_ip,
                "port": self.port}

    def resume_config(self) -> JobConfig:
        """The job that continues this one from its latest complete checkpoint, where it ran;
        ValueError when it reported none."""
        checkpoint = self.checkpoint()
        if not checkpoint or not self.job_dict:
            raise ValueError(f"{self.name or 'the run'}{self.where} has no complete checkpoint to "
                             f"resume from")
        return JobConfig.from_dict({**self.job_dict, "resume_from_checkpoint": checkpoint})

    # -- state ------------------------------------------------------------------------------------

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.status_changed.emit(state)

    def _set_summary(self, text: str) -> None:
        if text != self.summary:
            self.summary = text
            self.summary_changed.emit(text)

    def _say(self, text: str) -> None:
        self._line(f"[gaudi-gui] {text}")

    def _line(self, line: str) -> None:
        self._tail.append(line)
        self.log_line_received.emit(line)

    def _reset(self) -> None:
        for part in self.parts:
            part.shutdown()
            part.blockSignals(True)  # retired: mute, then gone (it holds no process)
            part.deleteLater()
        self.parts = []
        self.events = []
        self.progress = RunProgress()
        self._failures = []
        self.summary = ""
        self._ended = False
        self._stop_sent = 0
        self._stop_saved = ""
        self._stop_at = 0.0
        self._results, self._codes = {}, {}
        self._given_up = set()
        self._reconnecting_since = {}
        self._tail.clear()

    # -- starting ---------------------------------------------------------------------------------

    def start(self, job: JobConfig, *, device: str = "auto", resumed_from: str = "",
              main_ip: str = "", resumed_parts: Sequence[str] = (), gated: bool = False) -> None:
        """Start ``job`` at the placement; the outcome comes asynchronously (``run_identified``, state
        changes, ``finished``). On several hosts a pre-flight runs first (the agent's child); ``main_ip``:
        host 0's address for the others (empty: resolved from ``ssh -G``); ``resumed_parts``: the run
        folder each host's part resumes (default: ``resumed_from`` for host 0 only)."""
        if self.is_running():
            raise RuntimeError("this job is already running")
        if self.placement.kind == "local":
            # What this machine can check is refused at once, at the form's fields (elsewhere the
            # paths are the place's own: its supervisor checks them).
            problems = job.validate()
            if problems:
                raise PrepareError(problems)
        self._reset()
        self.job, self.job_dict, self.resumed_from, self.device = job, job.to_dict(), resumed_from, device
        self._resumed_parts = list(resumed_parts) or [resumed_from]
        #: The app's start gate checked the cards: each place's `train` does not check them again.
        self._gated = gated
        self._active, self._followed = True, False
        self._set_state("queued")
        if self.placement.kind == "hosts":
            self.port = int(job.launch.main_process_port or multi_host.DEFAULT_PORT)
            self.main_ip = main_ip.strip()
            names = ", ".join(self.host_names())
            self._set_summary(f"pre-flight on {names}: versions, paths, port {self.port}…")
            self._say(f"pre-flight on {names} …")
            self._start_preflight()
            self.hosts_changed.emit()
            return
        self._set_summary("submitting the job to Slurm…" if self.placement.kind == "slurm"
                          else f"starting the run{self.where}…")
        host = self.hosts[0]
        self._add_part(host).start(self.job_dict, device=device, resumed_from=resumed_from,
                                   cards=self.placement.cards_of(host.name), gated=gated)

    def _start_preflight(self) -> None:
        """This machine's agent runs the pre-flight (``hosts --preflight``: every host asked over ssh,
        host 0's address looked up); its answer comes to ``_on_preflight_done``. Slots are bound
        methods: the child's connections hold no reference to this job."""
        child = self._preflight_child = AgentChild(self, tail_lines=20)
        self._preflight_said = []
        child.line_received.connect(self._on_preflight_line)
        child.finished.connect(self._on_preflight_done)
        child.start("hosts_preflight", {
            "hosts": [{"name": h.name, "remote_command": h.remote_command} for h in self.hosts],
            "job": self.job_dict, "port": self.port, "main_ip": self.main_ip})

    def _on_preflight_line(self, stream: str, line: str) -> None:
        if stream == "stdout" and self.sender() is self._preflight_child:
            self._preflight_said.append(line)

    def _on_preflight_done(self, code: int, _status: str) -> None:
        child = self._preflight_child
        if child is None or self.sender() is not child:
            return
        self._preflight_child = None
        answer = _answer(self._preflight_said) if code in (0, 1) else None
        problems_ = answer.get("problems") if answer is not None else None
        if answer is not None and isinstance(problems_, list):
            address, problems = str(answer.get("main_ip") or self.main_ip), [str(p) for p in problems_]
        else:
            # No answer (the agent refused it, it crashed): said as a problem of the pre-flight.
            address, problems = self.main_ip, [f"the pre-flight failed: {_why(child, code)}"]
        child.deleteLater()
        self._check_preflight(address, problems)

    def _check_preflight(self, address: str, problems: list[str]) -> None:
        if self._ended or not self._active:
            return  # ended, or detached (the app exits): nothing is started
        if self._stop_sent:
            self._end(1, "stopped", "Stopped before the run started on any host")
            return
        if problems:
            for line in problems:
                self._say(f"pre-flight: {line}")
            more = f" (and {len(problems) - 1} more: see the log)" if len(problems) > 1 else ""
            self._end(1, "failed", f"Failed: pre-flight: {problems[0]}{more}")
            return
        self.main_ip = address
        jobs = multi_host.host_jobs(self.job or JobConfig(), len(self.hosts), address, self.port)
        for part_job in jobs:
            invalid = [m for _f, m in part_job.validate()]
            if invalid:
                self._end(1, "failed", f"Failed: {invalid[0]}")
                return
        n = self.job.launch.num_processes if self.job else 1
        self._say(f"main process {address}:{self.port}; {len(self.hosts)} machines × {n} process(es) "
                  f"(the run goes on if the app or a connection ends)")
        for rank, (host, part_job) in enumerate(zip(self.hosts, jobs, strict=True)):
            resumed = self._resumed_parts[rank] if rank < len(self._resumed_parts) else ""
            self._add_part(host).start(part_job.to_dict(), device=self.device, resumed_from=resumed,
                                       cards=self.placement.cards_of(host.name), gated=self._gated)
        self._lost_timer.start()
        self.hosts_changed.emit()

    def follow(self, record: dict[str, Any]) -> None:
        """Follow again a run ``to_record`` described (after a restart): every part from its
        beginning, so the curve and log are whole again."""
        self._reset()
        job = record.get("job")
        self.job_dict = dict(job) if isinstance(job, dict) else {}
        try:
            self.job = JobConfig.from_dict(self.job_dict) if self.job_dict else None
        except Exception:  # a damaged record still follows the run; only Resume needs the job
            self.job = None
        entries = [e for e in record.get("parts") or [] if isinstance(e, dict)]
        first = entries[0] if entries else {}
        self.resumed_from = str(record.get("resumed_from") or first.get("resumed_from") or "")
        self.main_ip, self.port = str(record.get("main_ip") or ""), int(record.get("port") or 0)
        self._active, self._followed = True, True
        self._set_state("running" if self.placement.kind != "slurm" else "queued")
        self._set_summary("following the Slurm job again…" if self.placement.kind == "slurm"
                          else f"re-attaching to {first.get('name') or 'the run'}{self.where}…")
        for host, entry in zip(self.hosts, entries, strict=False):
            self._add_part(host).follow(str(entry.get("folder", "")), name=str(entry.get("name") or ""),
                                        cards=entry.get("cards") or ())
        if len(self.parts) > 1:
            self._lost_timer.start()
        self.hosts_changed.emit()

    def attach(self, run: Run) -> bool:
        """Follow a run folder on this machine that a terminal's ``gaudi-gui train`` or an earlier
        session left going; False when its processes are gone (its status is then brought to what
        its events prove) or its pid was recycled. A run still "queued" with its supervisor alive (the
        queue's start, announced before its launcher runs) is being started: followed too."""
        state = run.reconcile().state
        # A "queued" run with no supervisor yet may be a folder made a moment ago and never started
        # (reconcile gives such a folder a minute): only a live supervisor makes it a start under way.
        if state != "running" and not (state == "queued" and run.supervisor() is not None):
            return False
        self.follow({"parts": [{"host": "local", "folder": str(run.folder), "name": run.name}],
                     "resumed_from": run.status().resumed_from or ""})
        try:
            self.job = run.user_job()
            self.job_dict = self.job.to_dict()
        except Exception:
            self.job = None
        return True

    def _add_part(self, host: Host) -> Part:
        rank = len(self.parts)
        slurm = self.placement.slurm_target() if self.placement.kind == "slurm" else None
        # A Slurm job is this machine's agent's (its run folder is on the file system shared with the nodes).
        place = Host.local() if slurm is not None else host
        part = AgentPart(place, grace_s=self.stop_grace_s, slurm=slurm, parent=self,
                         runs_dir=str(self.store.root) if place.is_local else "")
        part.slurm_state_changed.connect(self._on_slurm_state)
        # Methods bound with partial, not lambdas: a lambda slot returning emit()'s value leaks
        # references in PySide6.
        part.line_received.connect(functools.partial(self._on_part_line, rank))
        part.event_received.connect(functools.partial(self._on_part_event, rank))
        part.note_changed.connect(functools.partial(self._on_part_note, rank))
        part.connection_changed.connect(functools.partial(self._on_part_connection, rank))
        part.identified.connect(functools.partial(self._on_part_identified, rank))
        part.stop_failed.connect(functools.partial(self._on_stop_failed, rank))
        part.ended.connect(functools.partial(self._on_part_ended, rank))
        self.parts.append(part)
        return part

    # -- what the parts say -----------------------------------------------------------------------

    def _on_part_line(self, rank: int, line: str) -> None:
        self._line(log_prefix(self.hosts[rank].name) + line if len(self.hosts) > 1 else line)

    def _on_part_event(self, rank: int, event: dict[str, Any]) -> None:
        if rank == 0:
            self._take_event(event)
        elif event.get("type") == EventType.ERROR:
            self._say(f"{self.hosts[rank].name}: {note(event)}")
        elif event.get("type") == EventType.WARNING:
            # Another host's meter found its compilations rising: shown as the main host's would be,
            # named (every rank waits for that host's at each collective).
            from gaudi_gui.core.compile_rise import named
            self.event_received.emit(named(event, self.hosts[rank].name))

    def _take_event(self, event: dict[str, Any]) -> None:
        """The reducer moves on (``core.progress``); this turns its changes into signals and the line."""
        self.events.append(event)
        kind = event.get("type")
        had_error = self.progress.error is not None
        record = self.progress.apply(event)
        if kind == EventType.METRICS:
            if record is not None:
                if not self._stop_sent and not self.failure and not self.progress.saving_step:
                    self._set_summary(self._training_line())
                self.metrics_received.emit(record)
            return
        line = note(event, self.where)
        if kind == EventType.CHECKPOINT_SAVING:
            self._tick.start()
            line += " 0 s"
        elif kind == EventType.CHECKPOINT_SAVED and self._stop_sent:
            self._stop_saved = f"checkpoint-{event.get('step')}"
            line += "; the processes are ending"
        # While this job stops, its own line stays; a stop_requested it did not send (preemption, a
        # terminal) is still a stop, said.
        quiet = (self._stop_sent and kind in (EventType.PHASE, EventType.STOP_REQUESTED)) or (
            kind == EventType.ERROR and had_error)
        if line and not quiet:
            self._set_summary(line)
        self.event_received.emit(event)

    def _training_line(self) -> str:
        step = f"step {self.progress.step} of {self.progress.max_steps}"
        if self.job_id:
            phase = self._main.slurm_phase if self._main else ""
            return f"Slurm job {self.job_id} {phase if phase.startswith('running') else 'running'}: {step}"
        return f"training{self.where}: {step}"

    def _on_part_note(self, rank: int, text: str) -> None:
        if self.is_running() and not self.failure and text:
            self._set_summary(text)

    def _on_slurm_state(self, state: str, word: str) -> None:
        if self._stop_sent:
            self._set_summary(f"Slurm job {self.job_id} {word}; stopping…")
            return
        if state:
            self._set_state(state)
        self._set_summary(f"Slurm job {self.job_id} {word}" if state else f"Slurm job {self.job_id}: {word}")

    def _on_part_connection(self, rank: int, state: str, _message: str) -> None:
        if state == RECONNECTING:
            self._reconnecting_since.setdefault(rank, time.monotonic())
        elif state != CLOSED:
            self._reconnecting_since.pop(rank, None)
        if state == FOLLOWING and self.is_running() and not self.failure:
            # Back after a drop (or re-attached): the line says what the run does again.
            if self._stop_sent:
                self._set_summary(f"stopping{self.where}: checkpoint at the end of the current step…")
            elif self.progress.step:
                self._set_summary(self._training_line())
        self.hosts_changed.emit()

    def _on_part_identified(self, rank: int, folder: str) -> None:
        if len(self.hosts) > 1:
            self._say(f"{self.hosts[rank].name}: machine rank {rank}, run folder {folder}")
        if all(p.folder for p in self.parts) and len(self.parts) == len(self.hosts):
            if self.state == "queued" and self.placement.kind != "slurm":
                self._set_state("stopping" if self._stop_sent else "running")
            self.run_identified.emit(self.folder)
            if self.pid:
                self.started.emit(self.pid)
        self.hosts_changed.emit()

    def _on_stop_failed(self, rank: int, now: bool, text: str) -> None:
        self._say(f"could not stop the run: {text}")
        if self._ended:
            return
        self._stop_sent = 1 if now else 0
        self._set_summary(f"could not stop the run: {text}; press Stop again")
        if not now and not any(p.stop_sent for p in self.parts):
            self._tick.stop()
            self._set_state("running")

    # -- a part that fails ends the others ---------------------------------------------------------

    def _check_lost(self) -> None:
        now = time.monotonic()
        for rank, since in list(self._reconnecting_since.items()):
            part = self.parts[rank]
            if rank in self._given_up or not part.is_running() or now - since < self.lost_after_s:
                continue
            self._given_up.add(rank)
            self._host_failed(rank, f"unreachable for {self.lost_after_s:g} s")
            # Asked to kill its ranks in case it comes back; no longer waited for.
            part.kill()
            part.detach()
            self._maybe_finish()

    def _cause(self) -> tuple[int, str] | None:
        """(machine rank, why) of the host whose end caused the others' (``multi_host.first_cause``:
        not the peer that heard of it first); None while no host failed."""
        if not self._failures:
            return None
        return self._failures[multi_host.first_cause([why for _rank, why in self._failures])]

    @property
    def failure(self) -> str:
        """"host (machine rank i): why" of the host whose failure ended the run ("" otherwise)."""
        cause = self._cause()
        return f"{self.hosts[cause[0]].name} (machine rank {cause[0]}): {cause[1]}" if cause else ""

    def _host_failed(self, rank: int, why: str) -> None:
        """A host's part failed (or was lost): every failure is kept for naming the cause at the end;
        the first ends the others."""
        self._failures.append((rank, why))
        if len(self._failures) > 1:
            return
        host = self.hosts[rank].name
        self._say(f"{self.failure} — killing the other hosts' ranks, which would otherwise wait for it "
                  f"in a collective")
        self._set_state("stopping")
        self._set_summary(f"{host} failed ({why}); killing the other hosts' ranks…")
        for other, part in enumerate(self.parts):
            if other != rank and part.is_running():
                part.kill()
        self.hosts_changed.emit()

    def _on_part_ended(self, rank: int, code: int, state: str, summary: str, tail: list[str]) -> None:
        self._results[rank] = (state, summary)
        self._codes[rank] = code
        self._tail.extend(tail)
        if len(self.parts) > 1:
            self._say(f"{self.hosts[rank].name}: {summary or state}")
            if state not in ("finished", "stopped") and self._stop_sent < 2:
                self._host_failed(rank, summary or state)
        self.hosts_changed.emit()
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._ended or any(p.is_running() and i not in self._given_up for i, p in enumerate(self.parts)):
            return
        if len(self.parts) < len(self.hosts) and not self._given_up:
            return  # the other hosts' parts are still being added
        if len(self.parts) == 1:
            state, summary = self._results.get(0, ("failed", "Failed"))
            self._end(self._codes.get(0, 1), state, summary)
            return
        states = [self._results.get(i, ("lost", ""))[0] for i in range(len(self.parts))]
        if self.failure:
            state = "failed"
            summary = f"Failed on {self.failure}; the other hosts' ranks were killed"
        else:
            state = states[0] if len(set(states)) == 1 else ("killed" if self._stop_sent > 1 else "failed")
            summary = str(self.remote_status.get("summary") or self._results.get(0, ("", state))[1] or state)
            if len(set(states)) > 1:
                summary += " — " + ", ".join(f"{h}: {s}"
                                             for h, s in zip(self.host_names(), states, strict=True))
        self._keep_job_meter()
        self._end(0 if state in ("finished", "stopped") else 1, state,
                  f"{summary} (on {len(self.hosts)} hosts: {', '.join(self.host_names())})")

    def _keep_job_meter(self) -> None:
        """Keep the whole job's meter (every host's part summed) in host 0's run, as ``train --hosts``
        does: ``runs show`` / ``runs list`` there, and the Runs list where host 0 is this machine,
        then say the whole job. This machine's agent runs it (``hosts --keep-job-meter``, an ssh
        call); what it answers is said in the log."""
        whole = self.job_meter()
        main = self._main
        if whole is None or main is None:
            return
        host, folder = main.host, main.folder
        if not folder:
            self._say(multi_host.no_run_folder(host))
            return
        child = self._keep_child = AgentChild(self, tail_lines=20)
        self._keep_host, self._keep_said = host, []
        child.line_received.connect(self._on_keep_line)
        child.finished.connect(self._on_kept)
        child.start("keep_job_meter", {"host": host.name, "remote_command": host.remote_command,
                                       "folder": folder, "meter": whole})

    def _on_keep_line(self, stream: str, line: str) -> None:
        if stream == "stdout" and self.sender() is self._keep_child:
            self._keep_said.append(line)

    def _on_kept(self, code: int, _status: str) -> None:
        child, host = self._keep_child, self._keep_host
        if child is None or host is None or self.sender() is not child:
            return
        self._keep_child = None
        answer = _answer(self._keep_said) if code in (0, 1) else None
        said = answer.get("said") if answer is not None else None
        self._say(str(said) if said else multi_host.not_kept(host, _why(child, code)))
        child.deleteLater()

    def _end(self, code: int, state: str, summary: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._active = False
        for timer in (self._lost_timer, self._tick):
            timer.stop()
        self.progress.saving_since = 0.0
        self._set_summary(summary)
        self._set_state(state)
        self.hosts_changed.emit()
        self.finished.emit(code, state, list(self._tail))
        self._bring_profile(state)

    def _bring_profile(self, state: str) -> None:
        """A profiled run that ended on a host: this machine's agent brings its records and its trace
        into the Runs list's store (``runs --host H fetch FOLDER``, core.run_copy), so that Profile…
        opens the trace here; what it did is said in the log."""
        main = self._main
        profiled = self.job is not None and self.job.profile_steps > 0
        if self.placement.kind not in ("host", "hosts") or main is None or not main.folder or not profiled \
                or state not in ("finished", "stopped"):
            return
        child = self._fetch_child = AgentChild(self, tail_lines=20)
        said: list[str] = []
        child.line_received.connect(lambda stream, line: said.append(line) if stream == "stdout" else None)
        host, folder = main.host, main.folder
        child.finished.connect(lambda code, _status: self._profile_brought(host, folder, code, said))
        self._say(f"bringing the profile back from {host.name}…")
        child.start("fetch", {"host": host.name, "remote_command": host.remote_command, "folder": folder,
                              "runs_dir": str(self.store.root)})

    def _profile_brought(self, host: Host, folder: str, code: int, said: list[str]) -> None:
        answer: dict[str, Any] = {}
        with contextlib.suppress(ValueError, IndexError):
            answer = json.loads(said[-1])
        if code == 0 and isinstance(answer, dict) and answer.get("folder"):
            # This machine's copy of the run (its profile opens from Training → Runs, Profile…).
            self.local_copy = str(answer["folder"])
            trace = answer.get("trace") or "no trace file"
            self._say(f"profile brought back: {self.local_copy} (Training → Runs, Profile…; trace: {trace})")
            self.profile_brought.emit(self.local_copy)
            return
        child = self._fetch_child
        tail = [t for t in (child.tail(3) if child is not None else []) if t.strip()]
        why = tail[-1].removeprefix("gaudi-gui runs fetch: ") if tail else f"exit {code}"
        self._say(f"the profile stays on {host.name} in {folder}/profile ({why}); bring it later: gaudi-gui "
                  f"runs --host {host.name} fetch {folder}")

    # -- stopping ---------------------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> None:
        """Stop with a checkpoint (every part's ranks save at the end of their current step);
        pressed again while stopping: kill now. ``grace_s``: only for a run not started by this
        job (its supervisor has its own); the parts were given ``stop_grace_s``."""
        if not self.is_running():
            return
        if self._stop_sent:
            self.kill()
            return
        self._stop_sent = 1
        self._stop_at = time.time()
        self._set_state("stopping")
        if self.placement.kind == "slurm":
            self._set_summary("stopping: the job saves a checkpoint at the end of its current step…"
                              if self.job_id else "stopping: the job is cancelled once submitted")
            self._say("stop: scancel --batch --signal=USR1: the ranks save a checkpoint, then end (press "
                      "Kill now to cancel the job at once)")
        else:
            self._set_summary(f"stopping{self.where}: checkpoint at the end of the current step…")
            self._say(f"stop: the ranks save a checkpoint at the end of the current step, then end; "
                      f"killed after {self.stop_grace_s:g} s (press Stop again to kill now)")
        self._tick.start()
        for part in self.parts:
            part.stop()

    def kill(self, reason: str = "request") -> None:
        """Kill the run's processes now, at every place (no checkpoint from this stop)."""
        if not self.is_running():
            return
        self._stop_sent = 2
        self._stop_at = self._stop_at or time.time()
        self._set_state("stopping")
        if self.placement.kind == "slurm":
            self._set_summary(f"cancelling Slurm job {self.job_id or '(submitting)'} now (no checkpoint)")
            self._say("stop: cancelling the job now")
        else:
            self._say(f"killing the run's processes{self.where} now")
        for part in self.parts:
            part.kill()

    def _on_tick(self) -> None:
        if self.progress.saving_since:
            name = f"checkpoint-{self.progress.saving_step}" if self.progress.saving_step else "checkpoint"
            self._set_summary(f"saving {name}… {time.time() - self.progress.saving_since:.0f} s")
        elif self._stop_sent and self.is_running() and not self.failure and self.connection == FOLLOWING:
            waited = time.time() - self._stop_at
            left = max(0.0, self.stop_grace_s - waited)
            what = (f"{self._stop_saved} saved; waiting for the processes to end" if self._stop_saved
                    else "waiting for the current step to end")
            self._set_summary(f"stopping{self.where}: {what} ({waited:.0f} s; killed in {left:.0f} s, or "
                              f"press Stop again)")

    # -- the app ends -----------------------------------------------------------------------------

    def detach(self) -> None:
        """Stop following (the app exits): the run goes on at its place, followed again next time."""
        self._active = False
        for timer in (self._lost_timer, self._tick):
            timer.stop()
        # A pre-flight under way: nothing was started, nothing is left to follow.
        if self._preflight_child is not None and self._preflight_child.is_running():
            self._preflight_child.kill_tree()
        for part in self.parts:
            part.detach()

    def shutdown(self) -> None:
        for timer in (self._lost_timer, self._tick):
            timer.stop()
        # The agent's children of this job end with it (their ssh calls with them).
        for child in (self._fetch_child, self._preflight_child, self._keep_child):
            if child is not None and child.is_running():
                child.kill_tree()
        self._preflight_child = self._keep_child = None
        for part in self.parts:
            part.shutdown()


__all__ = ["LOST_AFTER_S", "TrainingJob", "log_prefix"]
