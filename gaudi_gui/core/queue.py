"""A queue per machine and user: jobs that start by themselves when their cards are free (issue 29).

The queue is a service of this machine's agent (``agent/queue.py``, issue 38): the agent alone keeps
it, applies what its clients ask (``queue.add``, ``queue.remove``, …: docs/agent-protocol.md), starts
each entry through its own job start (``agent/jobs.py``) and pushes every change as a ``queue`` event.
Its state is ``<data>/queue/state.json`` (entries, their state, why each waits, paused), written by the
agent alone through ``core.atomic``: a new agent (after a crash or a reboot) takes the queue up from it.
This module is the Qt-free, asyncio-free part: the state, the checks made when a job is added, and
the plan (which entry starts on which cards).

Ordering: by priority (higher first), then first come, first served (the order entries were added;
``move`` reorders). A job later in that order may start before an earlier one that waits for cards
(backfill: a 1-card job need not wait behind an 8-card one while cards sit idle), but each time that
happens the earlier job's ``passed`` count goes up; once it has been passed ``MAX_PASSED`` times it
holds its claim: no later job may start on cards it could use (any card, for a job that asks for N
cards; the named ones, for a job that names its cards) until it has started. The cards then drain to
it as the running jobs end, so a stream of small jobs can delay a large one only a bounded number of
times, never forever. Jobs that ask for no cards (CPU) are never held back by a card claim.

The CPU: a training or evaluation job that asks for no cards runs on the machine's cores, and two of
them at once on a small machine each take twice as long and can run it out of memory. So at most
``cpu_jobs`` of them are started or running at a time (``DEFAULT_CPU_JOBS``, one; 0: no limit; kept in
the state, changed by a ``set`` request: ``gaudi-gui queue set --cpu-jobs N``, or the window's
``queue/cpu_jobs`` setting, which every add from the window carries); the next one waits, saying for
which job. Serve and download jobs are not counted: a server waits for requests and a download for the
network, and either could hold the CPU's turn for ever.

Cards: a job asks for specific cards (module ids) or for N cards; N cards are chosen by the doctor's
pick of free healthy cards (``HostHealth.pick``: one of Intel's groups for 2 or 4 cards, clean cards
first), and the chosen cards pass the same gate as Start (``health.gate``). A card held by another
process, or unhealthy, means wait (the entry says why), never fail. The queue's own started jobs
hold their cards until their runs end (hl-smi may not show a run that just started). On a machine
without hl-smi the ids are bookkept among the queue's own jobs only (N cards: ids 0..N-1), so jobs
asking for the same cards still run one after the other.

Qt-free and torch-free.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic, jsonfile, paths
from gaudi_gui.core import kinds as kinds_mod
from gaudi_gui.core.devices import cards_name
from gaudi_gui.core.visibility import format_ids

STATE_VERSION = 1
#: queued: not started yet and not looked at for cards yet (or the queue is paused); waiting: its
#: cards are not free/healthy now (``why`` says which and why); starting: its start is under way
#: (written BEFORE the start, so an agent killed then never starts it twice); started: its
#: run is going (``run_folder``); ended: done (``outcome``: finished, failed, stopped, killed,
#: removed, or "not started" when the start itself failed).
STATES = ("queued", "waiting", "starting", "started", "ended")
PENDING = ("queued", "waiting")
ACTIVE = ("starting", "started")
KINDS = kinds_mod.NAMES
#: A kind's command (``gaudi-gui WHAT``) and its run folder's kind: one name (``core.kinds``).
KIND_COMMAND = {name: (name, name) for name in KINDS if name != "train"}
#: Kinds that may ask for cards (a download uses none; serve and eval do when on a device).
CARD_KINDS = ("train", "serve", "eval", "calibrate", "benchmark")
#: ``--kind`` spellings that name one of KINDS.
KIND_ALIASES = {old: k.name for k in kinds_mod.KINDS.values() for old in k.old}
#: How a job's kind is shown (queue list, the Queue view).
KIND_TEXT = {k.name: k.text for k in kinds_mod.KINDS.values()}
#: How many times a job may be passed by later ones before it holds its cards (see the module note).
MAX_PASSED = 3
#: Start attempts for a transient fault of the start itself (the start child died before its run
#: folder was made, a host that did not answer): retried with back-off, then the entry ends.
MAX_START_ATTEMPTS = 3
#: Ended entries kept in the state for `queue list` and the view (older ones are dropped).
KEEP_ENDED = 50
#: Kinds that compute on the CPU until they are done when they ask for no cards (see the module note).
CPU_KINDS = ("train", "eval", "calibrate", "benchmark")
#: How many CPU jobs run at once unless the queue is told otherwise (0 means no limit).
DEFAULT_CPU_JOBS = 1
#: The largest ``cpu_jobs`` accepted.
MAX_CPU_JOBS = 256

#: What a client may ask of the queue (the agent's ops are ``queue.<action>``).
ACTIONS = ("add", "remove", "move", "pause", "resume", "set", "stop", "list")


class QueueError(ValueError):
    """A request that cannot be honoured; the message is one line for the user."""


# -- where ------------------------------------------------------------------------------------------


def queue_dir() -> Path:
    """This user's queue on this machine (``GAUDI_GUI_QUEUE_DIR`` moves it; tests keep it in their
    home through ``GAUDI_GUI_HOME``)."""
    value = os.environ.get("GAUDI_GUI_QUEUE_DIR")
    return Path(value).expanduser() if value else paths.data_dir() / "queue"


def state_path(root: Path | None = None) -> Path:
    return (root or queue_dir()) / "state.json"


def make_dirs(root: Path | None = None) -> Path:
    root = root or queue_dir()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


# -- what a job asks for ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CardRequest:
    """Specific cards (``ids``), N cards (``count``), or none (neither: a CPU job)."""

    ids: tuple[int, ...] = ()
    count: int = 0

    @property
    def none(self) -> bool:
        return not self.ids and not self.count

    def text(self) -> str:
        if self.ids:
            return cards_name(self.ids)
        if self.count:
            return f"{self.count} card{'s' if self.count != 1 else ''}"
        return "no cards"

    @classmethod
    def parse(cls, text: str) -> CardRequest:
        """``--cards``: "N" (a count: N free healthy cards), "A,B" (those module ids; one card by id
        is written "A,"), "" (no cards). ValueError, one line, on anything else."""
        text = (text or "").strip()
        if not text:
            return cls()
        if "," not in text:
            if not (text.isascii() and text.isdigit()) or int(text) < 1 or int(text) > 64:
                raise ValueError(f"--cards takes a count of cards (e.g. 2) or card ids separated by commas "
                                 f"(e.g. 2,3; one card by id: 3,), not {text!r}")
            return cls(count=int(text))
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or any(not (p.isascii() and p.isdigit()) for p in parts):
            raise ValueError(f"--cards takes a count of cards (e.g. 2) or card ids separated by commas "
                             f"(e.g. 2,3; one card by id: 3,), not {text!r}")
        return cls(ids=tuple(sorted({int(p) for p in parts})))

    def to_text(self) -> str:
        if self.ids:
            return format_ids(self.ids) + ("," if len(self.ids) == 1 else "")
        return str(self.count) if self.count else ""


# -- the state --------------------------------------------------------------------------------------


@dataclass
class Entry:
    id: str
    #: The job file's content (JobConfig.to_dict()).
    job: dict[str, Any]
    kind: str = "train"
    name: str = ""
    priority: int = 0
    card_ids: list[int] = field(default_factory=list)
    card_count: int = 0
    device: str = "auto"
    #: The job's own output folder, resolved ("" when it names none: the run gets outputs/<run name>).
    output_dir: str = ""
    added_at: float = 0.0
    added_by: str = ""
    #: The requester's own id for this add: an add sent again (a retry over a connection that dropped
    #: after the host applied it) finds the entry it made instead of queueing the job twice.
    client_id: str = ""
    state: str = "queued"
    #: When the entry got its present state.
    since: float = 0.0
    #: Why it waits (or why it ended, for an entry that never started).
    why: str = ""
    #: How many later jobs started before it while it waited (anti-starvation, see the module note).
    passed: int = 0
    attempts: int = 0
    #: Not before this time (a transient start fault's back-off).
    retry_at: float = 0.0
    #: The cards it was started on.
    cards_used: list[int] = field(default_factory=list)
    #: The start child (``train --announce``): pid and create time, the announce file.
    start_pid: int = 0
    start_create_time: float = 0.0
    announce: str = ""
    run_folder: str = ""
    run_name: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    #: finished | failed | stopped | killed | removed | not started
    outcome: str = ""
    summary: str = ""
    #: A stop was asked while it was starting: it is stopped as soon as its run is known.
    stop_asked: bool = False

    @property
    def cards(self) -> CardRequest:
        return CardRequest(tuple(self.card_ids), self.card_count)

    def words(self) -> list[str]:
        """A serve / eval / download job's own command words (what ``gaudi-gui KIND … --detach``
        would be given), as checked when it was added."""
        words = self.job.get("words") if isinstance(self.job, dict) else None
        return [str(w) for w in words] if isinstance(words, list) else []

    def label(self) -> str:
        return f"{self.id} ({self.name})" if self.name else self.id

    @property
    def on_cpu(self) -> bool:
        """A job that takes a turn of the CPU (``cpu_jobs``): training or evaluation on no cards."""
        return self.kind in CPU_KINDS and self.cards.none

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Entry:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        entry = cls(**values)
        if entry.state not in STATES:
            entry.state = "ended"
            entry.outcome = entry.outcome or "failed"
        return entry

    def state_text(self, now: float | None = None) -> str:
        """"waiting for cards 2,3 — held by pid 10 (python) · 3 min" as a person reads it."""
        if self.state == "waiting":
            head = f"waiting for {self.cards.text()}" if not self.cards.none else \
                "waiting for the CPU" if self.why.startswith("waiting for the CPU") else "waiting"
        elif self.state == "ended":
            head = f"ended: {self.outcome}" if self.outcome else "ended"
        elif self.state == "started":
            head = f"started on {cards_name(self.cards_used)}" if self.cards_used else "started"
        else:
            head = self.state
        return head


@dataclass
class QueueState:
    paused: bool = False
    next_seq: int = 1
    entries: list[Entry] = field(default_factory=list)
    #: How many CPU jobs (``Entry.on_cpu``) may be started or running at once; 0: no limit.
    cpu_jobs: int = DEFAULT_CPU_JOBS
    updated_at: float = 0.0
    #: The agent that wrote it.
    pid: int = 0
    #: A damaged state file's problem (read as an empty queue; the agent keeps the file aside).
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "paused": self.paused, "next_seq": self.next_seq,
                "cpu_jobs": self.cpu_jobs, "updated_at": self.updated_at, "pid": self.pid,
                "entries": [e.to_dict() for e in self.entries]}

    @classmethod
    def from_dict(cls, data: Any) -> QueueState:
        if not isinstance(data, Mapping):
            return cls(problem="state.json does not hold an object")
        entries = []
        for item in data.get("entries") or []:
            if isinstance(item, Mapping):
                with contextlib.suppress(TypeError, ValueError):
                    entries.append(Entry.from_dict(item))
        seq = data.get("next_seq")
        cpu = data.get("cpu_jobs", DEFAULT_CPU_JOBS)
        return cls(paused=bool(data.get("paused", False)),
                   next_seq=seq if isinstance(seq, int) and seq > 0 else len(entries) + 1,
                   cpu_jobs=cpu if isinstance(cpu, int) and not isinstance(cpu, bool)
                   and 0 <= cpu <= MAX_CPU_JOBS else DEFAULT_CPU_JOBS,
                   entries=entries, updated_at=float(data.get("updated_at") or 0.0),
                   pid=int(data.get("pid") or 0))

    def find(self, entry_id: str) -> Entry | None:
        return next((e for e in self.entries if e.id == entry_id), None)

    def pending(self) -> list[Entry]:
        """Entries not started yet, in the order they will be considered."""
        return ordered([e for e in self.entries if e.state in PENDING])

    def active(self) -> list[Entry]:
        return [e for e in self.entries if e.state in ACTIVE]

    def live(self) -> list[Entry]:
        """Everything not ended."""
        return [e for e in self.entries if e.state != "ended"]

    def positions(self) -> dict[str, int]:
        """Entry id -> position (1 = next to start) of the entries not started yet."""
        return {e.id: i for i, e in enumerate(self.pending(), start=1)}


def read_state(root: Path | None = None) -> QueueState:
    """The queue as its process last wrote it; an empty queue when there is none, one with ``problem``
    set when the file is damaged (never an exception)."""
    path = state_path(root)
    if not path.exists():
        return QueueState()
    try:
        return QueueState.from_dict(jsonfile.read(path))
    except jsonfile.FileProblem as exc:
        return QueueState(problem=str(exc))


def write_state(state: QueueState, root: Path | None = None) -> None:
    """Only the agent calls this (one writer)."""
    state.updated_at = time.time()
    state.pid = os.getpid()
    atomic.write_json(state_path(root), state.to_dict(), fsync=True)


def wire_entry(entry: Entry, position: int) -> dict[str, Any]:
    """An entry as clients see it (``queue list --json``, the ``queue`` event): its fields without a
    training job's config (the words of a serve, eval or download job stay), its position (0: started
    or ended), its state as a person reads it and its cards as ``--cards`` takes them."""
    data = entry.to_dict()
    data["job"] = {} if entry.kind == "train" else dict(entry.job)
    data["position"] = position
    data["state_text"] = entry.state_text()
    data["cards"] = entry.cards.to_text()
    return data


def state_of(message: dict[str, Any]) -> QueueState:
    """The QueueState of a ``queue`` event or a ``queue.list`` reply (what a client shows)."""
    state = QueueState.from_dict({"paused": bool(message.get("paused")),
                                  "entries": message.get("entries") or [],
                                  "cpu_jobs": message.get("cpu_jobs", DEFAULT_CPU_JOBS)})
    state.pid = int(message.get("pid") or 0)
    state.problem = str(message.get("problem") or "")
    return state


def ordered(entries: Iterable[Entry]) -> list[Entry]:
    """Priority (higher first), then the order they stand in the state (first come first served;
    ``move`` changes that order). ``sorted`` is stable."""
    return sorted(entries, key=lambda e: -e.priority)


# -- checks made when a job is added -----------------------------------------------------------------


def resolved_dir(path: str) -> str:
    if not path.strip():
        return ""
    with contextlib.suppress(OSError, RuntimeError):
        return str(Path(path).expanduser().resolve())
    return path


def same_output(output_dir: str, entries: Iterable[Entry]) -> str:
    """The label of a queued or running job that writes into
    ``output_dir`` too; "" when none. Two jobs of one queue never share an output folder: the
    second would write over the first one's checkpoints."""
    wanted = resolved_dir(output_dir)
    if not wanted:
        return ""
    for entry in entries:
        if entry.state != "ended" and entry.output_dir and entry.output_dir == wanted:
            return entry.label()
    return ""


def output_refusal(output_dir: str, other: str) -> str:
    return (f"output folder {output_dir} is already the output folder of queued job {other}: the second "
            f"job would write over the first one's checkpoints. Leave output_dir empty (each run gets "
            f"its own folder) or choose another")


def add_values(job: Any, *, kind: str = "train", cards: CardRequest | None = None, priority: int = 0,
               device: str = "auto", added_by: str = "", client_id: str = "",
               entries: Iterable[Entry] = (), scan_limit: int | None = None,
               schema: Any = "ask") -> dict[str, Any]:
    """The values of an add for ``job`` (a JobConfig) after the checks the agent makes where it enters
    (on the machine that runs it): the kind, the job's own problems, its output folder holding another
    run's files, or being the output folder of one of ``entries`` (checked again as the add is applied:
    two adds at once). QueueError, one line. ``scan_limit``: read at most that much of a dataset file.
    ``schema``: what the training arguments are checked by (``jobcheck.check``'s)."""
    if kind_name(kind) != "train":
        raise QueueError(f"--kind {kind}: a job file (--config) is a training job; a {kind} job is given "
                         f"as its own command's words")
    from gaudi_gui.core import jobcheck
    # The whole job, checked where it enters the queue (the same check as `train`'s): a job that
    # cannot start is refused now, not when its cards free up.
    problems = jobcheck.check(job, schema=schema, scan_limit=scan_limit)
    if problems:
        raise QueueError("; ".join(f"{f}: {p}" + (" (or set overwrite_output in the job)"
                                                   if "a new run would write over them" in p else "")
                                   for f, p in problems))
    output_dir = resolved_dir(job.output_dir)
    other = same_output(output_dir, entries)
    if other:
        raise QueueError(output_refusal(output_dir, other))
    cards = cards or CardRequest()
    return {"job": job.to_dict(), "kind": "train", "name": job.name or Path(job.model).name,
            "priority": priority, "card_ids": list(cards.ids), "card_count": cards.count,
            "device": device, "output_dir": output_dir, "added_by": added_by,
            "client_id": client_id or uuid.uuid4().hex}


def cpu_jobs_value(value: Any) -> int:
    """``cpu_jobs`` as the queue keeps it (0..MAX_CPU_JOBS; 0: no limit); QueueError, one line, for
    anything else (a bool, a float, text that is not a whole number)."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_CPU_JOBS:
        raise QueueError(f"--cpu-jobs takes how many CPU jobs run at once, a whole number from 1 to "
                         f"{MAX_CPU_JOBS} (0: no limit), not {value!r}")
    return value


def cpu_jobs_text(limit: int) -> str:
    """How the limit reads in a listing."""
    if not limit:
        return "CPU jobs: no limit (all start at once)"
    return f"CPU jobs: {limit} at a time"


def kind_name(kind: str) -> str:
    """``--kind``'s word as one of KINDS (``evaluate`` is ``eval``); QueueError for an unknown one."""
    name = KIND_ALIASES.get(kind.strip().lower(), kind.strip().lower())
    if name not in KINDS:
        raise QueueError(f"--kind {kind}: one of {', '.join(KINDS)}")
    return name


def kind_add_values(kind: str, words: Sequence[str], *, name: str, cards: CardRequest | None = None,
                    priority: int = 0, added_by: str = "", client_id: str = "") -> dict[str, Any]:
    """The values of an add request for a serve / eval / download job: ``words`` are that kind's
    command words as its ``--detach`` takes them (already checked by the kind's own parser: the
    command line's queue add does that). The job holds only the words and a name; it is started by
    the kind's own detached supervisor (``gaudi_gui.commands.detach``). QueueError, one line."""
    kind = kind_name(kind)
    if kind == "train":
        raise QueueError("--kind train: give the job with --config")
    cards = cards or CardRequest()
    if not cards.none and kind not in CARD_KINDS:
        raise QueueError(f"--cards: a {kind} uses no cards")
    return {"job": {"words": [str(w) for w in words], "name": name}, "kind": kind, "name": name,
            "priority": priority, "card_ids": list(cards.ids), "card_count": cards.count,
            "device": "auto", "output_dir": "", "added_by": added_by,
            "client_id": client_id or uuid.uuid4().hex}


# -- cards: what the doctor saw, and the plan -------------------------------------------------------


_PID = re.compile(r"\bpid (\d+)")


@dataclass
class CardsView:
    """The cards of this machine as the doctor saw them (``health`` is a HostHealth), or none (no
    hl-smi: ids bookkept among the queue's own jobs only)."""

    health: Any = None
    checked_at: float = 0.0

    @property
    def has_cards(self) -> bool:
        h = self.health
        return h is not None and bool(h.cards or h.free_modules)

    def healthy_free(self) -> set[int]:
        return set(self.health.healthy_free()) if self.has_cards else set()

    def why_not(self, card: int) -> str:
        """Why ``card`` cannot be used now (the doctor's worst finding about it)."""
        if not self.has_cards:
            return ""
        known = {int(c.get("module_id", c.get("index", -1))) for c in self.health.cards}
        if known and card not in known:
            return f"{cards_name([card])}: not on this machine"
        worst = self.health.card_worst(card)
        if worst is not None and worst.severity == "error":
            return f"{cards_name([card])}: {worst.seen}"
        return f"{cards_name([card])}: not free"

    def holder_pids(self, cards: Iterable[int]) -> set[int]:
        """The pids named as holding ``cards`` (what the queue watches: when one ends, look again)."""
        if not self.has_cards:
            return set()
        wanted = set(cards)
        out: set[int] = set()
        for finding in self.health.findings:
            if finding.check == "busy.held" and (finding.module_id in wanted or not wanted):
                out |= {int(p) for p in _PID.findall(finding.seen)}
        return out

    def gate(self, ids: Sequence[int]) -> list[str]:
        """The Start gate's errors for a run on ``ids`` (empty: it may start)."""
        if not self.has_cards:
            return []
        from gaudi_gui.core import health
        result = health.gate(health.Report(hosts=(self.health,)), list(ids), multi_node=False)
        return list(result.errors)


@dataclass
class Decision:
    entry_id: str
    #: "start" (on ``cards``) or "wait" (``why``).
    action: str
    cards: tuple[int, ...] = ()
    why: str = ""
    #: Entries earlier in the order that this start passes (their ``passed`` count goes up).
    passes: tuple[str, ...] = ()


def plan(state: QueueState, view: CardsView, now: float | None = None) -> list[Decision]:
    """What to do with each entry not started yet, in order (see the module note for the rule)."""
    now = time.time() if now is None else now
    taken: set[int] = set()
    for entry in state.active():
        taken |= set(entry.cards_used)
    decisions: list[Decision] = []
    held_all = ""          # an entry that holds every card (it asks for N and was passed too often)
    held_cards: dict[int, str] = {}  # card -> the entry that holds it
    waiting: list[Entry] = []  # earlier entries that wait (a start now passes them)
    owners = {c: e.label() for e in state.active() for c in e.cards_used}
    on_cpu = [e.label() for e in state.active() if e.on_cpu]  # the CPU jobs started or running
    for entry in state.pending():
        if state.paused:
            decisions.append(Decision(entry.id, "wait", why="the queue is paused"))
            continue
        if entry.retry_at and entry.retry_at > now:
            decisions.append(Decision(entry.id, "wait", why=entry.why or "start retried shortly"))
            waiting.append(entry)
            continue
        want = entry.cards
        if entry.on_cpu and state.cpu_jobs and len(on_cpu) >= state.cpu_jobs:
            # The CPU's turns are taken: it waits for one of those jobs to end, in its order.
            names = ", ".join(on_cpu)
            decisions.append(Decision(entry.id, "wait", why=(
                f"waiting for the CPU: {names} {'is' if len(on_cpu) == 1 else 'are'} running (CPU jobs "
                f"run {state.cpu_jobs} at a time: gaudi-gui queue set --cpu-jobs N)")))
            continue
        if want.none:
            decisions.append(Decision(entry.id, "start"))
            if entry.on_cpu:
                on_cpu.append(entry.label())
            continue
        chosen, why = _choose(want, view, taken, owners)
        blocker = ""
        if chosen:
            blocker = held_all or next((held_cards[c] for c in chosen if c in held_cards), "")
        if chosen and not blocker:
            # Only a start that takes cards the earlier job could have used passes it.
            passes = tuple(e.id for e in waiting if e.cards.count or set(e.cards.ids) & set(chosen))
            decisions.append(Decision(entry.id, "start", tuple(chosen), passes=passes))
            taken |= set(chosen)
            for c in chosen:
                owners[c] = entry.label()
            continue
        if blocker:
            why = (f"{cards_name(chosen)} free, but held for {blocker}, which has waited while "
                   f"{MAX_PASSED} later jobs started")
        decisions.append(Decision(entry.id, "wait", why=why))
        waiting.append(entry)
        if entry.passed >= MAX_PASSED:
            if want.count:
                held_all = held_all or entry.label()
            for c in want.ids:
                held_cards.setdefault(c, entry.label())
    return decisions


def _choose(want: CardRequest, view: CardsView, taken: set[int],
            owners: Mapping[int, str]) -> tuple[list[int], str]:
    """The cards to start on now ([] and why not)."""
    if want.ids:
        busy = [c for c in want.ids if c in taken]
        if busy:
            who = sorted({owners.get(c, "") for c in busy} - {""})
            return [], f"{cards_name(busy)} in use by queued job {', '.join(who)}"
        if view.has_cards:
            free = view.healthy_free()
            missing = [c for c in want.ids if c not in free]
            if missing:
                return [], "; ".join(view.why_not(c) for c in missing)
            errors = view.gate(want.ids)
            if errors:
                return [], "; ".join(errors)
        return list(want.ids), ""
    if not view.has_cards:
        ids = list(range(want.count))
        busy = [c for c in ids if c in taken]
        if busy:
            who = sorted({owners.get(c, "") for c in busy} - {""})
            return [], f"{cards_name(busy)} in use by queued job {', '.join(who)}"
        return ids, ""
    pick = view.health.pick(want.count, exclude=sorted(taken))
    if not pick.ids:
        free_now = sorted(view.healthy_free() - taken)
        what = (f"healthy and free now: {cards_name(free_now)}" if free_now
                else "no card is healthy and free now")
        if pick.note:
            what += f"; none {pick.note} is whole"
        return [], what
    errors = view.gate(pick.ids)
    if errors:
        return [], "; ".join(errors)
    return list(pick.ids), ""


# -- how it reads ---------------------------------------------------------------------------------


def since_text(moment: float, now: float) -> str:
    """How long ago ``moment`` was, as the queue shows it ("–" for never)."""
    if not moment:
        return "–"
    seconds = max(0, int(now - moment))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


__all__ = ["ACTIONS", "ACTIVE", "KINDS", "MAX_PASSED", "MAX_START_ATTEMPTS", "PENDING", "STATES",
           "CardRequest", "CardsView", "Decision", "Entry", "QueueError", "QueueState", "add_values",
           "cpu_jobs_text", "cpu_jobs_value", "kind_add_values", "kind_name", "make_dirs", "ordered",
           "output_refusal", "plan", "queue_dir", "read_state", "same_output", "since_text", "state_of",
           "wire_entry", "write_state"]
