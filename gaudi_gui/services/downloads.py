"""Hub downloads and model listings, on this machine or a host, for the Models tab (issue 28).

A download is a job of kind ``download`` (core/kinds.py) that the agent of the place where the model
must be starts: this machine's agent for this machine (``job.start``), the host's agent for a host
(``job.start`` with ``host``, carried over this machine's agent's one ssh session to it). The agent runs
``gaudi-gui download REPO_ID … --detach --json``: a supervisor in a session of its own with a run
folder there, which outlives the window, the agents and a dropped connection. The window starts no
process: it follows the job's events (the plan, ``progress``, ``attempt``, ``stalled``, ``retry``,
``done``, ``error``: the progress as it is, everything else as one sentence) and its record (how it
ended), and Cancel is ``job.stop``. The stall watchdog, back-off and plain-HTTP fall-back are the
command's (``gaudi_gui.commands.download``): the app shows what it says.

The window follows a download through ``agent_job.JobFollow``, the follower of every agent job.

A listing is the place's agent's ``models.list`` (what ``gaudi-gui models --json`` prints: its own Hub
cache as ``scan_cache_dir`` sees it), a delete its ``models.delete`` (one revision): requests, answered
on the event loop (``remote_files.AgentListing``), a host's carried over its one ssh session.

The token: the download inherits its agent's environment (the user's login: ``HF_TOKEN`` or the token
file of ``hf auth login``); a token typed in the Download dialog travels in the ``job.start`` request's
``env`` alone (the agent gives it to that one start command's environment, which the supervisor and the
download inherit: readable only by the user, never in an argv, a file or a log). On a host the host's
own login is used: a typed token is refused there (``DownloadRequest.problem``).

A model id or revision from the user is a word of the job's ``args``, checked by the command; never
shell code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import hub
from gaudi_gui.core.events import EventType
from gaudi_gui.core.remote import Host
from gaudi_gui.core.secrets import redact
from gaudi_gui.services.agent_job import FollowsJob, JobFollow
from gaudi_gui.services.remote_files import CACHE, AgentListing

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient

#: A cancelled download's closing sentence (the row puts "Cancelled." before it).
CANCELLED = "Finished files stay in the cache; downloading again continues with the rest."


@dataclass(frozen=True)
class DownloadRequest:
    """What the Download dialog asks for."""

    repo_id: str
    revision: str = ""
    host: Host = field(default_factory=Host.local)
    #: Seconds without a byte before an attempt is ended and retried (the command's ``--stall-s``).
    stall_s: float = 60.0
    #: A token for this one download on this machine ("" = the user's own login). Never in argv.
    token: str = ""

    def problem(self) -> str | None:
        """What is wrong with the request, in one sentence (None: it can start)."""
        bad = hub.check_repo_id(self.repo_id)
        if bad:
            return bad
        if self.revision and (self.revision.startswith("-") or any(c.isspace() for c in self.revision)):
            return f"'{self.revision}' is not a branch, tag or commit"
        if self.stall_s <= 0:
            return "the stall time must be more than 0 s"
        if self.token and not self.host.is_local:
            return (f"a token typed here is not sent to {self.host.name}: the download there uses "
                    f"{self.host.name}'s own login (run `hf auth login` there)")
        return None

    def words(self) -> list[str]:
        """The ``download`` command's words for this request (the job's ``args`` at ``job.start``, and
        a queued download's); the agent adds ``--detach`` and ``--json``. Never the token."""
        args = [self.repo_id, "--stall-s", f"{self.stall_s:g}"]
        if self.revision:
            args += ["--revision", self.revision]
        return args


def describe_event(event: dict[str, Any]) -> str:
    """One sentence for a download event other than ``progress`` ("" for none)."""
    kind = event.get("type")
    if kind == EventType.PLAN:
        files = event.get("files") or []
        cached = sum(1 for f in files if f.get("cached"))
        remaining = int(event.get("remaining_bytes") or 0)
        # What partial files already hold is not downloaded again (a plan of an older command: all).
        to_download = int(event.get("to_download_bytes", remaining) or 0)
        on_disk = (f" ({hub.human(remaining - to_download)} of it already on disk)"
                   if to_download < remaining else "")
        return (f"{hub.count(len(files), 'file')}, {hub.human(event.get('total_bytes'))}; {cached} already "
                f"cached, {hub.human(to_download)} to download{on_disk}; "
                f"{hub.human(event.get('free_bytes'))} free in {event.get('cache_dir', 'the cache')}")
    if kind == EventType.ATTEMPT:
        attempt, attempts = event.get("attempt"), event.get("attempts")
        if attempt == 1:
            return ""
        how = "" if event.get("xet", True) else " over plain HTTP (Xet off)"
        partial = min(int(event.get("partial_bytes") or 0), int(event.get("bytes_left") or 0))
        return (f"attempt {attempt} of {attempts}{how}: {hub.count(event.get('files_left'), 'file')} "
                f"({hub.human(event.get('bytes_left'))}) left"
                + (f", {hub.human(partial)} of it already on disk" if partial else ""))
    if kind == EventType.STALLED:
        return (f"stalled: no byte arrived for {float(event.get('seconds') or 0):.0f} s, so this attempt "
                "was ended")
    if kind == EventType.RETRY:
        text = (f"attempt {event.get('attempt')} failed ({event.get('reason')}); retrying in "
                f"{float(event.get('delay_s') or 0):g} s; finished files are kept")
        if event.get("xet_disabled"):
            text += "; the next attempts use plain HTTP (HF_HUB_DISABLE_XET=1) instead of Xet"
        return text
    if kind == EventType.RESUMED:
        return (f"continuing {event.get('filename')} from {hub.human(event.get('bytes'))} already on "
                "disk (an earlier attempt's partial file)")
    if kind == EventType.VERIFIED:
        return (f"checked {hub.count(event.get('files'), 'file')} against the Hub's sizes and digests "
                f"in {hub.duration(event.get('seconds'))}")
    if kind == EventType.VERIFY_FAILED:
        bad = event.get("files") or []
        return ("damaged on arrival (removed, fetched again): "
                + "; ".join(str(f.get("message")) for f in bad[:3]))
    if kind == EventType.DONE:
        if event.get("offline"):
            return f"offline, and already complete in the cache: {event.get('path')}"
        if event.get("attempts") == 0:
            return f"every file was already in the cache: {event.get('path')}"
        return f"done in {hub.duration(event.get('seconds'))}: {event.get('path')}"
    if kind == EventType.ERROR:
        return str(event.get("message") or "the download failed")
    return ""


class Download(FollowsJob, QObject):
    """One download: a job of kind ``download`` that the agent of its place starts (``job.start``: the
    command's ``--detach``, a supervisor with a run folder there; a host's through this machine's agent
    over the host's one ssh session) and the window only follows, through ``agent_job.JobFollow`` (the
    follower Serve, Evaluate, Benchmark and Calibrate use: the job's events replayed from the start,
    then live, each once; its record says how it ended). It outlives the window and a dropped
    connection; a typed token goes to that one job's environment in the request, never into an argv, a
    file or a log."""

    #: A progress event: bytes_done, bytes_total, rate (B/s), eta_s, files_done, files_total.
    progress_changed = Signal(dict)
    #: A sentence about the download (its plan, a stall, a retry, the plain-HTTP switch, the end).
    note_added = Signal(str)
    #: The download ended: (ok, the closing sentence, the snapshot folder on its host or "").
    finished = Signal(bool, str, str)

    def __init__(self, request: DownloadRequest, client: Callable[[], AgentClient],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.request = request
        self.notes: list[str] = []
        self.progress: dict[str, Any] = {}
        self.path = ""
        self.message = ""
        self.ok: bool | None = None  # None while it runs
        self.cancelled = False
        self.job = JobFollow(client, self)
        self.job.started.connect(lambda record: self._on_identified(str(record.get("folder") or "")))
        self.job.refused.connect(self._on_refused)
        self.job.event_received.connect(self._on_event)
        self.job.line_received.connect(self._on_line)
        self.job.ended.connect(self._on_ended)
        self.job.link_changed.connect(self._on_link)
        #: The note that holds only while the job runs, and what it says once the job ended.
        self._running_note = ""
        self._ran_note = ""
        self._error = ""

    @property
    def host(self) -> Host:
        return self.request.host

    @property
    def title(self) -> str:
        rev = f"@{self.request.revision}" if self.request.revision else ""
        return f"{self.request.repo_id}{rev} → {self.host.label}"

    def start(self, runs_dir: str = "") -> None:
        """Ask the agent of the download's place to start it (``job.start`` of kind ``download``)."""
        if not self.host.is_local:
            self.job.start("download", self.request.words(), host=self.host.name)
            return
        where: dict[str, Any] = {"runs_dir": runs_dir} if runs_dir else {}
        if self.request.token:
            # In the request alone: the agent puts it in the start command's environment, which the
            # supervisor and the download inherit; no argv, file or log holds it. Never sent to a host
            # (``problem`` refuses a token there: the host's own login is used).
            where["env"] = {"HF_TOKEN": self.request.token}
        self.job.start("download", self.request.words(), **where)

    def follow(self, folder: str, name: str = "") -> None:
        """Follow a download started earlier (left running by an earlier window, or started by hand)."""
        job_id = name or folder.rstrip("/").rsplit("/", 1)[-1]
        self._note(f"followed again: it kept running in {folder}")
        self.job.follow({"kind": "download", "job_id": job_id, "folder": folder},
                        "" if self.host.is_local else self.host.name)

    def is_running(self) -> bool:
        return self.job.running and self.ok is None

    def cancel(self) -> None:
        """Stop the download (finished files stay in the cache; a partial one stays too, and the next
        download of the same files continues it): ``job.stop``, once; the agent signals its supervisor
        (sent as soon as the agent said which job it is, when it is still starting it)."""
        if self.is_running() and self.job.stop_sent == 0:
            self.cancelled = True
            self.job.stop()

    def leave_running(self) -> str:
        """Stop following (the window closes; the job goes on at its agent); its run folder."""
        if not self.is_running():
            return ""
        self.job.detach()
        return self.folder

    def status_text(self) -> str:
        """The progress line a person reads: bytes, rate, ETA and files."""
        event = self.progress
        if not event:
            return "planning…" if self.ok is None else ""
        done, total = int(event.get("bytes_done") or 0), int(event.get("bytes_total") or 0)
        pct = f"{100 * done / total:.0f} % · " if total else ""
        eta = event.get("eta_s")
        rate = float(event.get("rate") or 0)
        eta_text = (f"ETA {hub.duration(eta)}" if eta is not None
                    else ("ETA –" if done < total else "ETA 0s"))
        return (f"{pct}{hub.human(done)} of {hub.human(total)} · {hub.human(rate)}/s · {eta_text} · "
                f"files {event.get('files_done', 0)} of {event.get('files_total', 0)}")

    # -- what the agent says ------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if text:
            text = redact(text)
            self.notes.append(text)
            self.note_added.emit(text)

    def _on_event(self, event: dict[str, Any]) -> None:
        if self.ok is not None:
            return
        kind = event.get("type")
        if kind == EventType.PROGRESS:
            self.progress = event
            self.progress_changed.emit(event)
            return
        if kind == EventType.DONE:
            self.path = str(event.get("path") or "")
        if kind == EventType.PLAN and event.get("repo_id") and event.get("repo_id") != self.request.repo_id:
            # Re-attached from an agent's jobs, which name the run, not the model (nor its revision).
            revision = str(event.get("revision") or "")
            self.request = replace(self.request, repo_id=str(event["repo_id"]),
                                   revision=self.request.revision or ("" if revision == "main" else revision))
        if kind == EventType.ERROR:
            self._error = redact(str(event.get("message") or ""))
            return  # said once, at the end
        self._note(describe_event(event))

    def _on_line(self, line: str) -> None:
        """The job's log is the run folder's; only the follower's own word is said (a stop not sent:
        Cancel can be pressed again)."""
        if line.startswith("[gaudi-gui] the stop was not sent") and self.is_running():
            self.cancelled = False
            self._note(line.removeprefix("[gaudi-gui] "))

    def _on_link(self, state: str, words: str) -> None:
        on = "" if self.host.is_local else f" on {self.host.name}"
        if state == "up":
            self._note(f"connected again: following the download{on}")
            return
        what = "the agent" if self.host.is_local else self.host.name
        why = words.partition("; connecting…")[0]
        self._note(f"the connection to {what} dropped ({why}); reconnecting… (the download goes on{on})")

    def _on_identified(self, folder: str) -> None:
        where = "" if self.host.is_local else f" on {self.host.name}"
        self._ran_note = redact(f"ran as a job of its own{where} (run folder {folder})")
        goes_on = "the window closes" + ("" if self.host.is_local else " or the connection drops")
        self._running_note = redact(f"a job of its own{where} (run folder {folder}): it goes on if {goes_on}")
        self._note(self._running_note)

    def _on_refused(self, words: str) -> None:
        self.ok = False
        self.message = redact(words)
        self._end()

    def _on_ended(self, state: str, summary: str) -> None:
        if self.ok is not None:
            return
        self.ok = state == "finished"
        if self.ok:
            self.path = self.path or summary.removeprefix("Downloaded: ").split(" (on ")[0]
            self.message = f"downloaded to {self.host.label}: {self.path}"
        elif state == "stopped" or self.cancelled:
            self.cancelled = True
            self.message = CANCELLED
        else:
            self.message = self._error or redact(summary.removeprefix("Failed: "))
        self._end()

    def _end(self) -> None:
        """What was true only while it ran ("it goes on if the window closes") is told in the past
        once it ended, then ``finished``."""
        self.job.detach()
        if self._running_note in self.notes:
            self.notes[self.notes.index(self._running_note)] = self._ran_note
        self.finished.emit(bool(self.ok), self.message, self.path)


class ModelPlaces(QObject):
    """Starts downloads (jobs of the agents) and listings; the close dialog's owner of every download
    it follows (a ``JobOwner``).

    A download goes on when the window closes with "Leave running" (its agent keeps it) and is followed
    again at the next start (``reattach``: this machine's agent's jobs; ``reattach_hosts``: each saved
    host's agent's jobs)."""

    #: A download was started or taken up again (the Models tab shows it).
    download_started = Signal(object)
    #: A download finished well: (host name, repo id, snapshot folder on that host).
    model_downloaded = Signal(str, str, str)
    #: What a place's Hub cache holds is known again (or why it is not): the host's name. The model
    #: fields (runner, Serve, Evaluate, Training) read ``cached_models`` / ``cache_problem`` then.
    cache_changed = Signal(str)

    outlives_window = True

    def __init__(self, parent: QObject | None = None, *, agent: Callable[[], AgentClient],
                 runs_dir: str = "") -> None:
        super().__init__(parent)
        self.downloads: list[Download] = []
        self.runs_dir = runs_dir
        #: This machine's agent's client (made on first use): every download is its job, or a host's
        #: agent's job reached through it.
        self._agent = agent
        self._reattached = False
        #: Hosts whose running downloads were asked for (``reattach_hosts``): once per host and app.
        self._reattached_hosts: set[str] = set()
        #: Hosts whose agent's ``jobs.list`` is still on its way.
        self._asking: set[str] = set()
        self._shut = False
        #: Each place's cached models as last listed (host name -> one row per repo, newest use first).
        self._cache: dict[str, list[dict[str, Any]]] = {}
        self._cache_problems: dict[str, str] = {}
        self._cache_calls: dict[str, AgentListing] = {}

    # -- downloads ----------------------------------------------------------------------------------

    def _new(self, request: DownloadRequest) -> Download:
        job = Download(request, self._agent, self)
        job.finished.connect(lambda ok, _msg, path, j=job: self._on_finished(j, ok, path))
        self.downloads.append(job)
        return job

    def download(self, request: DownloadRequest) -> Download:
        problem = request.problem()
        if problem:
            raise ValueError(problem)
        job = self._new(request)
        job.start(self.runs_dir)
        self.download_started.emit(job)
        return job

    def reattach(self) -> None:
        """Follow every download of this machine still running (left running by an earlier window,
        or started through this machine's agent): its agent's jobs (``jobs.list``); once per app."""
        if not self._reattached:
            self._reattached = True
            self._ask_jobs(Host.local())

    def reattach_hosts(self, hosts: list[Host]) -> list[str]:
        """Follow again the downloads still running on each host not asked yet in this app (the window
        asks every saved host at its start; the Models tab asks again for a host added since): its
        agent's jobs, through this machine's agent and the host's one ssh session; the hosts asked."""
        asked = []
        for host in hosts:
            if host.is_local or host.name in self._reattached_hosts:
                continue
            self._reattached_hosts.add(host.name)
            self._ask_jobs(host)
            asked.append(host.name)
        return asked

    def _ask_jobs(self, host: Host) -> None:
        self._asking.add(host.name)
        where = {"runs_dir": self.runs_dir} if host.is_local else {"host": host.name}
        self._agent().request("jobs.list", lambda reply: self._on_jobs(host, reply), **where)

    def is_reattaching(self) -> bool:
        """An agent has not said its jobs yet."""
        return bool(self._asking)

    def _on_jobs(self, host: Host, reply: dict[str, Any]) -> None:
        self._asking.discard(host.name)
        if self._shut or not reply.get("ok"):
            return  # the listing of that place says what is wrong with it
        followed = {(d.host.name, d.folder) for d in self.downloads if d.folder and d.is_running()}
        for item in reply.get("jobs") or []:
            if not isinstance(item, dict) or item.get("kind") != "download" or not item.get("alive"):
                continue
            folder = str(item.get("folder") or "")
            if not folder or item.get("state") not in ("queued", "running") \
                    or (host.name, folder) in followed:
                continue
            name = str(item.get("name") or item.get("job_id") or "")
            # The model id comes with the run's first event (its plan); until then, the run's name.
            guess = name.split("-download-", 1)[-1] if "-download-" in name else name
            job = self._new(DownloadRequest(repo_id=guess, host=host))
            job.follow(folder, str(item.get("job_id") or name))
            self.download_started.emit(job)

    def _on_finished(self, job: Download, ok: bool, path: str) -> None:
        if ok:
            # The model fields that named it say "cached" once the place is listed again.
            if job.host.name in self._cache or job.host.name in self._cache_calls:
                self.check_cache(job.host, again=True)
            self.model_downloaded.emit(job.host.name, job.request.repo_id, path)

    def running(self) -> list[Download]:
        return [d for d in self.downloads if d.is_running()]

    # -- listings -------------------------------------------------------------------------------------

    def list_models(self, host: Host) -> AgentListing:
        """``host``'s agent's ``models.list``: its Hub cache's repos and revisions (``gaudi-gui models
        --json``'s answer)."""
        return AgentListing(host, CACHE, self._agent(), {}, self, op="models.list")

    def check_cache(self, host: Host, *, again: bool = False) -> None:
        """List ``host``'s Hub cache (its agent's ``models.list``; nothing waits for it) unless
        it is known already (``again``: list it anew) or a listing is on its way; ``cache_changed``
        says when it is known. The GUI thread never waits for it."""
        if host.name in self._cache_calls or (not again and (host.name in self._cache
                                                             or host.name in self._cache_problems)):
            return
        listing = self.list_models(host)
        listing.finished.connect(lambda answer, message, h=host.name, lst=listing:
                                 self._on_cache_listed(h, lst, answer, message))
        self._cache_calls[host.name] = listing
        self.cache_changed.emit(host.name)

    def _on_cache_listed(self, name: str, listing: AgentListing, answer: dict[str, Any],
                         message: str) -> None:
        if self._cache_calls.get(name) is listing:
            del self._cache_calls[name]
        listing.deleteLater()
        if message:
            self._cache_problems[name] = message
            self._cache.pop(name, None)
            self.cache_changed.emit(name)
        else:
            self.remember_listing(name, answer)

    def remember_listing(self, host_name: str, answer: dict[str, Any]) -> None:
        """A place's ``models --json`` answer (the Models tab's listing, or ``check_cache``'s)."""
        self._cache_problems.pop(host_name, None)
        self._cache[host_name] = cached_repos(answer)
        self.cache_changed.emit(host_name)

    def cached_models(self, host_name: str) -> list[dict[str, Any]] | None:
        """The models in ``host_name``'s Hub cache, most recently used first (None: not known yet):
        ``{"repo_id", "size", "last_used", "refs"}``."""
        return self._cache.get(host_name)

    def cache_problem(self, host_name: str) -> str:
        """Why ``host_name``'s cache could not be listed ("" if it could, or was not asked)."""
        return self._cache_problems.get(host_name, "")

    def is_checking_cache(self, host_name: str | None = None) -> bool:
        return bool(self._cache_calls) if host_name is None else host_name in self._cache_calls

    def delete_model(self, host: Host, repo_id: str, revision: str) -> AgentListing:
        """``host``'s agent's ``models.delete`` of one cached revision (what ``gaudi-gui models --delete
        REPO_ID@REV --yes --json`` does); the answer holds ``repo_id`` and ``freed_bytes``."""
        return AgentListing(host, CACHE, self._agent(), {"repo_id": repo_id, "revision": revision}, self,
                            op="models.delete")

    # -- JobOwner ---------------------------------------------------------------------------------------

    def active_jobs(self) -> list[str]:
        jobs = []
        for d in self.running():
            event = d.progress
            total = int(event.get("bytes_total") or 0)
            pct = f" ({100 * int(event.get('bytes_done') or 0) / total:.0f} %)" if total else ""
            jobs.append(f"Download {d.title}{pct}")
        return jobs

    def followed_job_ids(self) -> set[str]:
        """This machine's agent's jobs listed here already (the agent's own list leaves them out)."""
        return {d.job_id for d in self.running() if d.host.is_local and d.job_id}

    def stop_jobs(self) -> None:
        for d in self.running():
            d.cancel()

    def detach_jobs(self) -> list[str]:
        """Every download goes on (its agent keeps it; followed again next start): their run folders."""
        return [folder for d in self.running() if (folder := d.leave_running())]

    def shutdown(self) -> None:
        """The window goes: downloads are left to their agents ("Stop and quit" stopped them already);
        listings end."""
        self._shut = True
        for d in self.downloads:
            d.leave_running()
        for listing in list(self._cache_calls.values()):
            listing.cancel()
        self._cache_calls.clear()
        self._asking.clear()


def listing_rows(host: Host, answer: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per cached revision of ``gaudi-gui models --json``'s answer, for the library table."""
    rows = []
    for model in answer.get("models") or []:
        if model.get("repo_type", "model") != "model":
            continue
        for rev in model.get("revisions") or []:
            rows.append({"repo_id": str(model.get("repo_id", "")), "commit": str(rev.get("commit", "")),
                         "refs": list(rev.get("refs") or []), "size": int(rev.get("size_on_disk") or 0),
                         "last_used": float(model.get("last_accessed") or 0), "host": host.name,
                         "where": host.label, "path": str(rev.get("snapshot_path", "")),
                         "incomplete": str(rev.get("incomplete") or "")})
    return rows


#: Where a Hugging Face token is looked for in the system keyring: huggingface_hub 2.x keeps its own
#: login in a token file (``hf auth login``), not in the keyring, so the entry is gaudi-gui's own
#: (saved with ``keyring set gaudi-gui huggingface``).
KEYRING_SERVICE = "gaudi-gui"
KEYRING_USERNAME = "huggingface"


def keyring_missing() -> str:
    """Why the system keyring cannot be used here ("" when the ``keyring`` package imports)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("keyring") is not None
    except (ImportError, ValueError):  # a broken or half-imported package counts as none
        found = False
    if not found:
        return ("the Python package `keyring` is not installed here (pip install keyring), so no token "
                "can be read from the system keyring")
    return ""


def keyring_token() -> tuple[str, str]:
    """(the Hugging Face token saved in the system keyring, "") or ("", why there is none). The
    token is returned to the caller alone: never logged, and the reason never quotes it."""
    missing = keyring_missing()
    if missing:
        return "", missing
    try:
        import keyring

        token = keyring.get_password(KEYRING_SERVICE, KEYRING_USERNAME)
    except Exception as exc:  # any backend's failure (locked, none, D-Bus) is said, never raised
        return "", (f"the system keyring could not be read ({type(exc).__name__}): save the token with "
                    f"`keyring set {KEYRING_SERVICE} {KEYRING_USERNAME}` once a keyring works here")
    if not token:
        return "", (f"no token saved in the system keyring (service {KEYRING_SERVICE}, name "
                    f"{KEYRING_USERNAME}): save one with `keyring set {KEYRING_SERVICE} {KEYRING_USERNAME}`")
    return token.strip(), ""


def cached_repos(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per model repo of ``gaudi-gui models --json``'s answer, most recently used first:
    what a model field offers (its id, its size on disk, its last use, its revisions' refs, and
    "incomplete": why, when no revision of it is complete, else "")."""
    repos: list[dict[str, Any]] = []
    for model in answer.get("models") or []:
        if model.get("repo_type", "model") != "model" or not model.get("revisions"):
            continue
        revisions = model.get("revisions") or []
        size = model.get("size_on_disk")
        repos.append({"repo_id": str(model.get("repo_id", "")),
                      "size": int(size) if isinstance(size, int) else
                      sum(int(r.get("size_on_disk") or 0) for r in revisions),
                      "last_used": float(model.get("last_accessed") or 0),
                      "refs": sorted({str(ref) for r in revisions for ref in r.get("refs") or []}),
                      "incomplete": "" if any(not r.get("incomplete") for r in revisions)
                      else str(revisions[0].get("incomplete"))})
    repos.sort(key=lambda r: (-float(r["last_used"]), str(r["repo_id"])))
    return repos


__all__ = ["KEYRING_SERVICE", "KEYRING_USERNAME", "Download", "DownloadRequest", "ModelPlaces",
           "cached_repos", "describe_event", "keyring_missing", "keyring_token", "listing_rows"]
