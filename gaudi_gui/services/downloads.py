"""Hub downloads and model listings, on this machine or a host, for the Models tab (issue 28).

A download is ``gaudi-gui download REPO_ID --json`` run where the model must be: on this machine as
a child in its own session, on a host over ssh under ``gaudi-gui guard`` (it ends the command when
the connection drops; OpenSSH does not signal a remote command). Its JSON-line events (the plan,
``progress``, ``attempt``, ``stalled``, ``retry``, ``done``, ``error``) become Qt signals: the
progress as it is, everything else as one sentence. The stall watchdog, back-off and plain-HTTP
fall-back are the command's (``gaudi_gui.commands.download``): the app shows what it says.

A listing is ``gaudi-gui models --json`` on a place (``remote_files.Listing``): the place's own Hub
cache as ``scan_cache_dir`` sees it.

The token: on this machine the child inherits the user's login (``HF_TOKEN`` or the token file of
``hf auth login``); a token typed in the Download dialog is given to that one child in its environment
(readable only by the user, never in its argv, a file or a log). On a host the host's own login is
used: nothing secret crosses the connection (the guard's ``--env`` would put it in a process listing).

Every argv word is quoted for the host's shell (``Host.wrap``): a model id or revision from the user is
never shell code.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field, replace
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import events, hub, remote
from gaudi_gui.core.events import EventType
from gaudi_gui.core.remote import Host
from gaudi_gui.core.secrets import redact
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner, describe_exit
from gaudi_gui.services.remote_files import Listing
from gaudi_gui.services.run_parts import FOLLOWING, RemoteCall, SupervisedPart

#: How long a stopped download's command has to end its attempt before it is killed (its own grace
#: for its child is 3 s).
STOP_GRACE_MS = 8000
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

    def argv(self) -> list[str]:
        """The gaudi-gui command line (without the program) that runs this download here, tied to
        the window (a typed token: it lives only in that process's environment)."""
        args = ["download", self.repo_id, "--json", "--stall-s", f"{self.stall_s:g}"]
        if self.revision:
            args += ["--revision", self.revision]
        return args

    @property
    def detached(self) -> bool:
        """A job of its own (``download --detach``: it outlives the window and a dropped connection),
        unless a token was typed for it, which must not leave this one process's environment."""
        return not self.token

    def detached_argv(self) -> list[str]:
        """``download … --detach --json``: the job's supervisor announces its run folder."""
        args = ["download", self.repo_id, "--stall-s", f"{self.stall_s:g}", "--detach", "--json"]
        if self.revision:
            args += ["--revision", self.revision]
        return args

    @classmethod
    def from_spec(cls, host: Host, argv: list[str]) -> DownloadRequest:
        """The request a detached download's run folder records (spec.json's argv), for re-attaching."""
        words = argv[argv.index("download") + 1:] if "download" in argv else []
        repo_id = words[0] if words else "?"
        revision = words[words.index("--revision") + 1] if "--revision" in words[:-1] else ""
        stall = 60.0
        if "--stall-s" in words[:-1]:
            with contextlib.suppress(ValueError):
                stall = float(words[words.index("--stall-s") + 1])
        return cls(repo_id=repo_id, revision=revision, host=host, stall_s=stall)


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


class Download(QObject):
    """One download job and what it said. Detached (the default): ``download --detach`` at its place,
    a supervisor with a ``kind="download"`` run folder there, followed by ``runs follow``
    (``SupervisedPart``: a dropped connection is followed again, the job goes on). With a typed token:
    a child of this window (the token lives only in its environment)."""

    #: A progress event: bytes_done, bytes_total, rate (B/s), eta_s, files_done, files_total.
    progress_changed = Signal(dict)
    #: A sentence about the download (its plan, a stall, a retry, the plain-HTTP switch, the end).
    note_added = Signal(str)
    #: The download ended: (ok, the closing sentence, the snapshot folder on its host or "").
    finished = Signal(bool, str, str)

    def __init__(self, request: DownloadRequest, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.request = request
        self.notes: list[str] = []
        self.progress: dict[str, Any] = {}
        self.path = ""
        self.message = ""
        self.ok: bool | None = None  # None while it runs
        self.cancelled = False
        #: The job's run folder at its place ("" for a download tied to the window, or until known).
        self.folder = ""
        #: The note that holds only while the job runs, and what it says once the job ended.
        self._running_note = ""
        self._ran_note = ""
        self._error = ""
        self._stderr: list[str] = []
        self._part: SupervisedPart | None = None
        self._runner = ProcessRunner(self, parse_protocol=False)
        self._runner.line_received.connect(self._on_line)
        self._runner.finished.connect(self._on_finished)

    @property
    def host(self) -> Host:
        return self.request.host

    @property
    def detached(self) -> bool:
        return self._part is not None

    @property
    def title(self) -> str:
        rev = f"@{self.request.revision}" if self.request.revision else ""
        return f"{self.request.repo_id}{rev} → {self.host.label}"

    def start(self) -> None:
        if self.request.detached:
            self._new_part().start_command(self.request.detached_argv())
            return
        host = self.host
        argv = host.gaudi_gui_argv(*self.request.argv())
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["HF_TOKEN"] = self.request.token
        # Its own session, so a stop reaches the command and its attempt's child together.
        self._runner.start(argv[0], argv[1:], env=env, new_session=True)

    def follow(self, folder: str, name: str = "") -> None:
        """Follow a detached download started earlier (re-attached at the next start)."""
        self.folder = folder
        self._note(f"followed again: it kept running in {folder}")
        self._new_part().follow(folder, name=name)

    def _new_part(self) -> SupervisedPart:
        part = SupervisedPart(self.host, grace_s=STOP_GRACE_MS / 1000, parent=self)
        part.event_received.connect(self._on_event)
        part.identified.connect(self._on_identified)
        part.note_changed.connect(self._note)
        part.connection_changed.connect(self._on_connection)
        part.ended.connect(self._on_part_ended)
        self._part = part
        return part

    def is_running(self) -> bool:
        if self._part is not None:
            return self._part.is_running()
        return self._runner.is_running()

    def cancel(self) -> None:
        """Stop the download (finished files stay in the cache; a partial one stays too, and the next
        download of the same files continues it)."""
        if not self.is_running():
            return
        self.cancelled = True
        if self._part is not None:
            self._part.stop()  # runs stop: its supervisor ends the command (SIGTERM to its group)
        else:
            self._runner.terminate_tree(grace_ms=STOP_GRACE_MS)

    def leave_running(self) -> str:
        """Stop following a detached download (the window closes; it goes on); its run folder."""
        if self._part is not None and self._part.is_running():
            self._part.detach()
            return self.folder
        self.cancel()
        return ""

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

    # -- output -----------------------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if text:
            text = redact(text)
            self.notes.append(text)
            self.note_added.emit(text)

    def _on_line(self, stream: str, line: str) -> None:
        if stream != "stdout":
            if line.strip():
                self._stderr.append(redact(line.strip()))
            return
        event = events.decode(line)
        if event is not None:
            self._on_event(event)

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == EventType.PROGRESS:
            self.progress = event
            self.progress_changed.emit(event)
            return
        if kind == EventType.DONE:
            self.path = str(event.get("path") or "")
        if kind == EventType.PLAN and event.get("repo_id") and event.get("repo_id") != self.request.repo_id:
            # Re-attached on a host from its run list, which names the run, not the model.
            self.request = replace(self.request, repo_id=str(event["repo_id"]),
                                   revision=self.request.revision or "")
        if kind == EventType.ERROR:
            self._error = redact(str(event.get("message") or ""))
            return  # said once, at the end
        self._note(describe_event(event))

    def _on_identified(self, folder: str) -> None:
        self.folder = folder
        where = "" if self.host.is_local else f" on {self.host.name}"
        self._ran_note = redact(f"ran as a job of its own{where} (run folder {folder})")
        goes_on = "the window closes" + ("" if self.host.is_local else " or the connection drops")
        self._running_note = redact(f"a job of its own{where} (run folder {folder}): it goes on if {goes_on}")
        self._note(self._running_note)

    def _on_connection(self, state: str, _message: str) -> None:
        if state == FOLLOWING and any("reconnecting" in n for n in self.notes[-3:]):
            where = "" if self.host.is_local else f" on {self.host.name}"
            self._note(f"connected again: following the download{where}")

    def _on_part_ended(self, _code: int, state: str, summary: str, _lines: list[str]) -> None:
        self.ok = state == "finished"
        if self.ok:
            self.path = self.path or summary.removeprefix("Downloaded: ").split(" (on ")[0]
            self.message = f"downloaded to {self.host.label}: {self.path}"
        elif state == "stopped" or self.cancelled:
            self.cancelled = True
            self.message = CANCELLED
        else:
            self.message = self._error or summary.removeprefix("Failed: ")
        self._end()

    def _on_finished(self, code: int, status: str) -> None:
        if self.cancelled:
            self.ok = False
            self.message = CANCELLED
        elif code == 0 and self.path:
            self.ok = True
            self.message = f"downloaded to {self.host.label}: {self.path}"
        else:
            self.ok = False
            self.message = self._failure(code, status)
        self._end()

    def _end(self) -> None:
        """What was true only while it ran ("it goes on if the window closes") is told in the past
        once it ended, then ``finished``."""
        if self._running_note in self.notes:
            self.notes[self.notes.index(self._running_note)] = self._ran_note
        self.finished.emit(bool(self.ok), self.message, self.path)

    def _failure(self, code: int, status: str) -> str:
        host = self.host
        if self._error:
            return self._error
        if status == EXIT_FAILED_TO_START:
            return next(iter(self._runner.tail(1)), "the download could not start")
        err = "\n".join(self._stderr)
        if not host.is_local and code == remote.SSH_FAILED:
            return remote.explain_ssh_failure(host.name, err)[1]
        last = self._stderr[-1] if self._stderr else ""
        if "invalid choice" in err or "No module named" in err or code in (126, 127):
            return (f"{host.name} has no gaudi-gui with the `download` command behind "
                    f"`{host.remote_command}` ({last or describe_exit(code, status)}); fix: "
                    f"{remote.fix_command(host)}")
        if last.startswith("gaudi-gui download: "):
            return last[len("gaudi-gui download: "):]
        return last or f"the download {describe_exit(code, status)}"


class ModelPlaces(QObject):
    """Starts downloads and listings; the close dialog's owner of every download (a ``JobOwner``).

    A detached download goes on when the window closes with "Leave running" and is followed again at
    the next start (``reattach``: this machine's runs store); one with a typed token ends with the
    window."""

    #: A download was started or taken up again (the Models tab shows it).
    download_started = Signal(object)
    #: A download finished well: (host name, repo id, snapshot folder on that host).
    model_downloaded = Signal(str, str, str)
    #: What a place's Hub cache holds is known again (or why it is not): the host's name. The model
    #: fields (runner, Serve, Evaluate, Training) read ``cached_models`` / ``cache_problem`` then.
    cache_changed = Signal(str)

    outlives_window = True

    def __init__(self, parent: QObject | None = None, *, runs_dir: str = "") -> None:
        super().__init__(parent)
        self.downloads: list[Download] = []
        self.runs_dir = runs_dir
        self._reattached = False
        #: Hosts whose running downloads were asked for (``reattach_hosts``): once per host and app.
        self._reattached_hosts: set[str] = set()
        self._host_calls: list[RemoteCall] = []
        #: Each place's cached models as last listed (host name -> one row per repo, newest use first).
        self._cache: dict[str, list[dict[str, Any]]] = {}
        self._cache_problems: dict[str, str] = {}
        self._cache_calls: dict[str, Listing] = {}

    # -- downloads ----------------------------------------------------------------------------------

    def download(self, request: DownloadRequest) -> Download:
        problem = request.problem()
        if problem:
            raise ValueError(problem)
        job = Download(request, self)
        job.finished.connect(lambda ok, _msg, path, j=job: self._on_finished(j, ok, path))
        self.downloads.append(job)
        job.start()
        self.download_started.emit(job)
        return job

    def reattach(self) -> int:
        """Follow every detached download of this machine still running (left running by an earlier
        window, or started by ``gaudi-gui download --detach``); once per app. How many."""
        if self._reattached:
            return 0
        self._reattached = True
        from gaudi_gui.core import jobkind
        from gaudi_gui.core.runstore import RunStore

        followed = {d.folder for d in self.downloads if d.folder}
        count = 0
        for run in RunStore(self.runs_dir or None).runs()[:50]:  # newest first, as KindJob reattaches
            with contextlib.suppress(OSError):
                status = run.status()
                if status.kind != "download" or status.state not in ("queued", "running") \
                        or run.supervisor() is None or str(run.folder) in followed:
                    continue
                argv = [str(a) for a in jobkind.spec(run).get("argv") or []]
                job = Download(DownloadRequest.from_spec(Host.local(), argv), self)
                job.finished.connect(lambda ok, _msg, path, j=job: self._on_finished(j, ok, path))
                self.downloads.append(job)
                job.follow(str(run.folder), run.name)
                self.download_started.emit(job)
                count += 1
        return count

    def reattach_hosts(self, hosts: list[Host]) -> list[RemoteCall]:
        """``reattach_host`` for each host not asked yet in this app (the window asks every saved
        host at its start; the Models tab asks again for a host added since)."""
        calls = []
        for host in hosts:
            if host.is_local or host.name in self._reattached_hosts:
                continue
            self._reattached_hosts.add(host.name)
            calls.append(self.reattach_host(host))
        return calls

    def reattach_host(self, host: Host) -> RemoteCall:
        """Follow again the downloads still running on ``host`` (its ``runs list --json``): left
        running by an earlier window, or started there by hand."""
        self._reattached_hosts.add(host.name)
        call = RemoteCall(host, host.gaudi_gui_argv("runs", "list", "--json"), parent=self)
        call.finished.connect(lambda code, out, _err, h=host, c=call: self._on_host_runs(h, c, code, out))
        self._host_calls.append(call)
        call.start()
        return call

    def is_reattaching(self) -> bool:
        """A host's ``runs list`` is still on its way."""
        return any(c.is_running() for c in self._host_calls)

    def _on_host_runs(self, host: Host, call: RemoteCall, code: int, out: str) -> None:
        if call in self._host_calls:
            self._host_calls.remove(call)
        call.deleteLater()
        if code != 0:
            return  # the listing of that place says what is wrong with it
        try:
            runs = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
        except (ValueError, IndexError):
            return
        followed = {(d.host.name, d.folder) for d in self.downloads if d.folder}
        for item in runs if isinstance(runs, list) else []:
            if not isinstance(item, dict) or item.get("kind") != "download" or not item.get("alive"):
                continue
            folder = str(item.get("folder") or "")
            state = str((item.get("status") or {}).get("state") or "")
            if not folder or state not in ("queued", "running") or (host.name, folder) in followed:
                continue
            name = str(item.get("name") or "")
            # The model id comes with the run's first event (its plan); until then, the run's name.
            guess = name.split("-download-", 1)[-1] if "-download-" in name else name
            job = Download(DownloadRequest(repo_id=guess, host=host), self)
            job.finished.connect(lambda ok, _msg, path, j=job: self._on_finished(j, ok, path))
            self.downloads.append(job)
            job.follow(folder, name)
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

    def list_models(self, host: Host) -> Listing:
        """``gaudi-gui models --json`` on ``host``: its Hub cache's repos and revisions."""
        return Listing(host, "models", ["models", "--json"], self)

    def check_cache(self, host: Host, *, again: bool = False) -> None:
        """List ``host``'s Hub cache in the background (a child here, one ssh call for a host) unless
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

    def _on_cache_listed(self, name: str, listing: Listing, answer: dict[str, Any], message: str) -> None:
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

    def delete_model(self, host: Host, spec: str) -> Listing:
        """``gaudi-gui models --delete REPO_ID@COMMIT --yes --json`` on ``host``; the answer holds
        ``freed_bytes``."""
        return Listing(host, "models", ["models", "--delete", spec, "--yes", "--json"], self)

    # -- JobOwner ---------------------------------------------------------------------------------------

    def active_jobs(self) -> list[str]:
        jobs = []
        for d in self.running():
            event = d.progress
            total = int(event.get("bytes_total") or 0)
            pct = f" ({100 * int(event.get('bytes_done') or 0) / total:.0f} %)" if total else ""
            jobs.append(f"Download {d.title}{pct}")
        return jobs

    def stop_jobs(self) -> None:
        for d in self.running():
            d.cancel()

    def detach_jobs(self) -> list[str]:
        """Detached downloads go on (followed again next start); one with a typed token is stopped."""
        return [folder for d in self.running() if (folder := d.leave_running())]

    def shutdown(self) -> None:
        """The window goes: downloads tied to it are stopped; detached ones are left to their
        supervisors ("Stop and quit" stopped them already); listings and host calls end."""
        for d in self.downloads:
            d.leave_running()
        for listing in list(self._cache_calls.values()):
            listing.cancel()
        self._cache_calls.clear()
        for call in list(self._host_calls):
            call.kill()
        self._host_calls.clear()


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
