"""A queue per machine and user: jobs that start by themselves when their cards are free (issue 29).

The queue is kept by the machine it runs on, in ``<data>/queue/``:

- ``state.json``: the queue as it is (entries, their state, why each waits, paused). ONE writer: the
  queue process (``core.queue_runner``), through ``core.atomic``; the app and the command line only
  read it.
- ``requests/``: what the app and the command line ask for (add, remove, move, pause, resume), one
  file per request, written atomically (``atomic.write_json``: a reader sees a whole file or none)
  under a name that sorts by time. The queue process reads them in name order, applies each to its
  state, writes a reply to ``replies/<request id>.json`` and deletes the request.

  Why request files and not an append to one file under a lock: every requester writes its own file,
  so there is no read-modify-write of a shared file, no lock a requester killed at the wrong moment
  can leave held, no torn line when two requesters write at once, and the queue process never waits
  on a requester (nor a requester on a queue process that is busy starting a job). A request written
  while no queue process runs is simply there when one starts (``ensure_running`` starts one).
- ``queue.lock`` (flock, held by the queue process for its whole life: only one runs) and
  ``queue.pid`` (its pid and create time: how a reader tells that it runs); ``queue.log`` its notes;
  ``starts/<entry id>.*`` the job file, announce file and early output of each start.

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
import json
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
#: (written BEFORE the start, so a queue process killed then never starts it twice); started: its
#: run is going (``run_folder``); ended: done (``outcome``: finished, failed, stopped, killed,
#: removed, or "not started" when the start itself failed).
STATES = ("queued", "waiting", "starting", "started", "ended")
PENDING = ("queued", "waiting")
ACTIVE = ("starting", "started")
KINDS = kinds_mod.NAMES
#: A kind's command (``gaudi-gui WHAT``) and its run folder's kind: one name (``core.kinds``).
KIND_COMMAND = {name: (name, name) for name in KINDS if name != "train"}
#: Kinds that may ask for cards (a download uses none; serve and eval do when on a device).
CARD_KINDS = ("train", "serve", "eval")
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
CPU_KINDS = ("train", "eval")
#: How many CPU jobs run at once unless the queue is told otherwise (0 means no limit).
DEFAULT_CPU_JOBS = 1
#: The largest ``cpu_jobs`` accepted.
MAX_CPU_JOBS = 256

REQUEST_ACTIONS = ("add", "remove", "move", "pause", "resume", "set", "stop")


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


def requests_dir(root: Path | None = None) -> Path:
    return (root or queue_dir()) / "requests"


def replies_dir(root: Path | None = None) -> Path:
    return (root or queue_dir()) / "replies"


def starts_dir(root: Path | None = None) -> Path:
    return (root or queue_dir()) / "starts"


def pid_path(root: Path | None = None) -> Path:
    return (root or queue_dir()) / "queue.pid"


def lock_path(root: Path | None = None) -> Path:
    return (root or queue_dir()) / "queue.lock"


def log_path(root: Path | None = None) -> Path:
    return (root or queue_dir()) / "queue.log"


def make_dirs(root: Path | None = None) -> Path:
    root = root or queue_dir()
    for folder in (root, requests_dir(root), replies_dir(root), starts_dir(root)):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
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
    #: The queue process that wrote it.
    pid: int = 0
    #: A damaged state file's problem (read as an empty queue; the queue process keeps the file aside).
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
        """Everything not ended: what keeps the queue process alive."""
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
    """Only the queue process calls this (one writer)."""
    state.updated_at = time.time()
    state.pid = os.getpid()
    atomic.write_json(state_path(root), state.to_dict(), fsync=True)


def ordered(entries: Iterable[Entry]) -> list[Entry]:
    """Priority (higher first), then the order they stand in the state (first come first served;
    ``move`` changes that order). ``sorted`` is stable."""
    return sorted(entries, key=lambda e: -e.priority)


# -- requests ---------------------------------------------------------------------------------------


def new_request_id() -> str:
    # Sorts by time (ns), unique across processes (pid and a random part).
    return f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def send_request(action: str, root: Path | None = None, **values: Any) -> str:
    """Write one request file (atomic); its id. The queue process answers in ``replies/``."""
    if action not in REQUEST_ACTIONS:
        raise QueueError(f"unknown queue request {action!r}")
    root = make_dirs(root)
    request_id = new_request_id()
    atomic.write_json(requests_dir(root) / f"{request_id}.json",
                      {"id": request_id, "action": action, "at": time.time(), **values})
    return request_id


def pending_requests(root: Path | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """The request files not applied yet, oldest first; unreadable ones as {"id", "problem"}."""
    folder = requests_dir(root)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    out: list[tuple[Path, dict[str, Any]]] = []
    for name in names:
        path = folder / name
        try:
            data = jsonfile.read(path)
        except jsonfile.FileProblem as exc:
            out.append((path, {"id": name[:-5], "problem": str(exc)}))
            continue
        out.append((path, data if isinstance(data, dict) else {"id": name[:-5], "problem": "not an object"}))
    return out


def write_reply(request_id: str, reply: Mapping[str, Any], root: Path | None = None) -> None:
    atomic.write_json(replies_dir(root) / f"{request_id}.json", dict(reply), fsync=False)


def wait_reply(request_id: str, timeout_s: float, root: Path | None = None,
               poll_s: float = 0.05) -> dict[str, Any] | None:
    """The queue process's answer to a request (and the reply file removed); None after
    ``timeout_s``."""
    path = replies_dir(root) / f"{request_id}.json"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            with contextlib.suppress(OSError):
                path.unlink()
            return data
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


# -- checks made when a job is added -----------------------------------------------------------------


def resolved_dir(path: str) -> str:
    if not path.strip():
        return ""
    with contextlib.suppress(OSError, RuntimeError):
        return str(Path(path).expanduser().resolve())
    return path


def same_output(output_dir: str, entries: Iterable[Entry], requests: Iterable[Mapping[str, Any]] = ()) -> str:
    """The label of a queued or running job (or a pending add request) that writes into
    ``output_dir`` too; "" when none. Two jobs of one queue never share an output folder: the
    second would write over the first one's checkpoints."""
    wanted = resolved_dir(output_dir)
    if not wanted:
        return ""
    for entry in entries:
        if entry.state != "ended" and entry.output_dir and entry.output_dir == wanted:
            return entry.label()
    for request in requests:
        if request.get("action") == "add" and request.get("output_dir") == wanted:
            return f"a job being added ({request.get('name') or 'unnamed'})"
    return ""


def output_refusal(output_dir: str, other: str) -> str:
    return (f"output folder {output_dir} is already the output folder of queued job {other}: the second "
            f"job would write over the first one's checkpoints. Leave output_dir empty (each run gets "
            f"its own folder) or choose another")


def add_values(job: Any, *, kind: str = "train", cards: CardRequest | None = None, priority: int = 0,
               device: str = "auto", added_by: str = "", client_id: str = "",
               root: Path | None = None, scan_limit: int | None = None,
               schema: Any = "ask") -> dict[str, Any]:
    """The values of an add request for ``job`` (a JobConfig) after the checks a requester makes: the
    kind, the job's own problems, its output folder holding another run's files, or being the output
    folder of a queued job or of an add not applied yet (the queue process checks that last one again
    when it applies the request: two requesters at once). QueueError, one line. ``scan_limit``: read at
    most that much of a dataset file (the window's thread; the queued `train` reads it whole).
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
    other = same_output(output_dir, read_state(root).entries, [r for _p, r in pending_requests(root)])
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


# -- the queue process: is it there, start it --------------------------------------------------------


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


def runner_pid(root: Path | None = None) -> int:
    """The queue process's pid while it runs (its pidfile names a live process with the recorded
    create time); 0 when none runs."""
    from gaudi_gui.core.proctree import ProcessRef
    try:
        data = json.loads(pid_path(root).read_text(encoding="utf-8"))
        ref = ProcessRef(int(data["pid"]), float(data["create_time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return ref.pid if ref.is_alive() else 0


def runner_argv(root: Path | None = None) -> list[str]:
    import sys
    argv = [sys.executable, "-m", "gaudi_gui", "queue", "run"]
    if root is not None:
        argv += ["--queue-dir", str(root)]
    return argv


#: A tiny trampoline: starts the queue process in a session of its own and exits at once, so the
#: queue process is nobody's child (no zombie left in a long-lived caller) and outlives the caller.
_TRAMPOLINE = ("import subprocess,sys\n"
               "log=open(sys.argv[1],'ab')\n"
               "subprocess.Popen(sys.argv[2:],stdin=subprocess.DEVNULL,stdout=log,stderr=log,"
               "start_new_session=True,close_fds=True)\n")


def ensure_running(root: Path | None = None) -> bool:
    """Start the queue process unless one runs; True when one was started. A second one started at
    the same moment finds the lock taken and ends by itself."""
    import subprocess
    import sys
    root = make_dirs(root)
    if runner_pid(root):
        return False
    subprocess.run([sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(log_path(root)),
                    *runner_argv(root)], check=False, timeout=60, stdin=subprocess.DEVNULL)
    return True


def request(action: str, *, timeout_s: float = 30.0, root: Path | None = None,
            start: bool = True, **values: Any) -> dict[str, Any]:
    """Send a request, start the queue process if none runs, and wait for its reply
    ({"ok": bool, "message": str, ...}). QueueError when no reply came within ``timeout_s``."""
    request_id = send_request(action, root, **values)
    if start:
        ensure_running(root)
    reply = wait_reply(request_id, timeout_s, root)
    if reply is None:
        raise QueueError(f"the queue process did not answer within {timeout_s:g} s (the request stays "
                         f"and is applied when it runs; its log: {log_path(root)})")
    return reply


__all__ = ["ACTIVE", "KINDS", "MAX_PASSED", "MAX_START_ATTEMPTS", "PENDING", "STATES", "CardRequest",
           "CardsView", "Decision", "Entry", "QueueError", "QueueState", "add_values", "cpu_jobs_text",
           "cpu_jobs_value", "ensure_running",
           "kind_add_values", "kind_name",
           "make_dirs", "ordered", "output_refusal", "pending_requests", "plan", "queue_dir", "read_state",
           "request", "runner_pid", "same_output", "send_request", "wait_reply", "write_reply", "write_state"]
