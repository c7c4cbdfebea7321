"""Hugging Face Hub downloads and the Hub cache, for the ``download`` and ``models`` commands (and the
app's Download action and model library later).

What is here, and what the library does for us (huggingface_hub 2.4, read from its source):

- ``plan``: ``snapshot_download(..., dry_run=True)`` lists the files of a revision (after
  include/exclude), their sizes and which are cached, without fetching anything (it asks the Hub for
  the revision, the tree, and a HEAD per file). A dry run that cannot reach the repo raises
  ``DryRunError`` *from* the real cause: ``describe_error`` looks through to it.
- ``free_bytes`` / ``space_refusal``: the free disk of the cache's file system and the refusal, with
  the numbers, when what is left to fetch does not fit (less a margin, so a download never fills the
  disk to the last byte).
- Errors in words (``HubProblem``): gated or private repos (accept the licence on the Hub, then
  ``hf auth login`` on that machine), a missing repo or revision, offline mode, an unreachable Hub.
  Messages go through ``secrets.redact``; the token is never read here: the library reads the user's
  own login on that machine (``HF_TOKEN`` or its token file) in whichever process talks to the Hub.
- Progress: ``Progress`` turns byte counts into the ``progress`` event (done/total, rate, ETA, files)
  that the worker prints and every view reads; ``progress_text`` is its one line.
- The watchdog's measure: ``bytes_on_disk`` (blobs and ``.incomplete`` files of one repo).
- Partial files: ``<etag>.incomplete`` (the library's own name for a blob being fetched) is what the
  download worker continues with a Range request on the next attempt (``partial_files``); the
  library's per-process ``<etag>.<uuid>.incomplete`` cannot be continued (``is_resumable``).
- Checking what arrived: ``etag_hasher`` (the digest an ETag is: sha256 for an LFS file, git's blob
  sha1 for a small one), fed while the bytes arrive by the worker; ``verify_files`` for a full pass.
- The cache: ``list_cache`` (``scan_cache_dir``) and ``deletion`` (``delete_revisions``).

Qt-free and torch-free; huggingface_hub is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core.events import EventType
from gaudi_gui.core.secrets import redact

#: Never plan to leave less than this free on the cache's disk.
DEFAULT_MARGIN_BYTES = 512 * 1024 * 1024
#: Exit statuses of the download command and its worker: a problem the user must fix (retrying will
#: not help) and a transient failure (the network, a stall).
EXIT_FIX = 2
EXIT_TRANSIENT = 1
_TRUE = ("1", "ON", "YES", "TRUE")

LOGIN_HINT = ("accept the licence on the model's Hub page with the account this machine logs in with, "
              "then run `hf auth login` on this machine (or set HF_TOKEN in its environment)")


@dataclass
class HubProblem(Exception):
    """What went wrong, in words, and whether retrying can help."""

    kind: str  # gated | not_found | revision | offline | network | disk | bad_input | damaged | other
    message: str

    def __str__(self) -> str:
        return self.message

    @property
    def exit_code(self) -> int:
        return EXIT_TRANSIENT if self.kind in ("network", "damaged", "other") else EXIT_FIX


@dataclass
class PlanFile:
    filename: str
    size: int | None
    cached: bool


@dataclass
class Plan:
    repo_id: str
    revision: str
    commit: str
    cache_dir: str
    files: list[PlanFile] = field(default_factory=list)
    free_bytes: int | None = None
    #: Bytes of partial files an earlier attempt left, which this one continues instead of fetching.
    partial_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def remaining_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files if not f.cached)

    @property
    def to_download_bytes(self) -> int:
        """What is left to come over the network: the files not cached, less what partial files an
        earlier attempt left holds (the next attempt continues them from there)."""
        return self.remaining_bytes - min(self.partial_bytes, self.remaining_bytes)

    @property
    def to_fetch(self) -> list[PlanFile]:
        return [f for f in self.files if not f.cached]

    @property
    def snapshot_path(self) -> str:
        return str(Path(self.cache_dir) / repo_folder(self.repo_id) / "snapshots" / self.commit)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(total_bytes=self.total_bytes, remaining_bytes=self.remaining_bytes,
                   to_download_bytes=self.to_download_bytes, snapshot_path=self.snapshot_path)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The plan again from its ``plan`` event (what the download worker sent)."""
        return cls(repo_id=str(data.get("repo_id") or ""), revision=str(data.get("revision") or "main"),
                   commit=str(data.get("commit") or ""), cache_dir=str(data.get("cache_dir") or ""),
                   files=[PlanFile(str(f.get("filename")), f.get("size"), bool(f.get("cached")))
                          for f in data.get("files") or []],
                   free_bytes=data.get("free_bytes"), partial_bytes=int(data.get("partial_bytes") or 0))


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def xet_disabled() -> bool:
    return os.environ.get("HF_HUB_DISABLE_XET", "").strip().upper() in _TRUE


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def default_cache_dir() -> str:
    from huggingface_hub import constants
    return str(constants.HF_HUB_CACHE)


def repo_folder(repo_id: str) -> str:
    """The cache's folder name of a model repo (``models--org--name``)."""
    return "models--" + repo_id.replace("/", "--")


def check_repo_id(repo_id: str) -> str | None:
    """Why ``repo_id`` cannot be a Hub model id, or None."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    if not repo_id or repo_id.startswith(("/", ".")) or os.path.isdir(repo_id):
        return f"'{repo_id}' is not a Hub model id (org/name); a local folder needs no download"
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        return f"'{repo_id}' is not a Hub model id: {str(exc).splitlines()[0]}"
    return None


class SilentBar:
    """A progress bar that draws nothing: the dry run's (the library would print its own to stderr),
    and the base of the download worker's counting bar (what ``snapshot_download`` calls on a
    ``tqdm_class``, in one place)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.n = 0
        self.total = kwargs.get("total")
        self.format_dict: dict[str, Any] = {"rate": None}

    def update(self, n: float | None = 1) -> None:
        self.n += int(n or 0)

    def __enter__(self) -> SilentBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass

    def refresh(self) -> None:
        pass

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        pass

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass


def describe_error(exc: BaseException, repo_id: str, revision: str | None) -> HubProblem:
    """A library exception as a ``HubProblem`` the user can act on (the cause of a DryRunError too)."""
    import httpx2
    from huggingface_hub import errors
    from huggingface_hub.utils import OfflineModeIsEnabled

    rev = revision or "main"
    cause: BaseException = exc
    seen = 0
    while isinstance(cause, errors.DryRunError) and cause.__cause__ is not None and seen < 5:
        cause, seen = cause.__cause__, seen + 1
    if isinstance(cause, HubProblem):
        return cause
    if isinstance(cause, errors.GatedRepoError):
        return HubProblem("gated", f"{repo_id} is gated and this machine's Hub login has no access to it: "
                                   f"{LOGIN_HINT}")
    if isinstance(cause, errors.RevisionNotFoundError):
        return HubProblem("revision", f"{repo_id} has no revision '{rev}' on {endpoint()} "
                                      "(a branch, tag or commit hash)")
    if isinstance(cause, errors.RepositoryNotFoundError):
        return HubProblem("not_found", f"{repo_id} was not found on {endpoint()}: check the name; if it is "
                                       f"private or gated, {LOGIN_HINT}")
    if isinstance(cause, errors.HfHubHTTPError):
        status = cause.response.status_code if cause.response is not None else 0
        name = _file_of(cause)
        what = f"{name} of {repo_id}" if name else repo_id
        # Permanent answers fail at once, naming the file: asking again gets the same answer. Only a
        # server's trouble (5xx), a timeout (408) or a rate limit (429) is worth another attempt.
        if status in (401, 403):
            return HubProblem("gated", f"the Hub refused {what} ({status}): {LOGIN_HINT}")
        if status in (404, 410):
            return HubProblem("not_found", f"{what} was not found ({status}) on {endpoint()} at revision "
                                           f"'{rev}', though the repo lists it: download the other files "
                                           "with --exclude, or ask the repo's owner")
        if 400 <= status < 500 and status not in (408, 429):
            return HubProblem("bad_input", f"the Hub refused the request for {what} ({status}): "
                                           f"{redact(str(cause).splitlines()[0])}")
        return HubProblem("network", f"the Hub answered {status} for {what}: "
                                     f"{redact(str(cause).splitlines()[0])}")
    if isinstance(cause, OSError) and cause.errno in _DESTINATION_ERRNOS:
        return HubProblem("disk", _destination_problem(cause))
    if isinstance(cause, OfflineModeIsEnabled) or offline():
        return HubProblem("offline", offline_message(repo_id))
    if isinstance(cause, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError,
                          httpx2.RemoteProtocolError, ConnectionError, TimeoutError)):
        detail = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        return HubProblem("network", f"cannot reach the Hub at {endpoint()}: {redact(detail)}")
    if isinstance(cause, OSError) and "not enough free disk space" in str(cause).lower():
        return HubProblem("disk", redact(str(cause).splitlines()[0]))
    text = str(cause).splitlines()[0] if str(cause) else ""
    return HubProblem("other", f"{type(cause).__name__}: {redact(text)}")


#: What a destination answers that writing again will not change: read-only, not ours, full.
_DESTINATION_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def _destination_problem(exc: OSError) -> str:
    """A write the cache's file system refused, in words, with the path."""
    path = str(exc.filename or "the Hub cache")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk (or the quota) is full"
        fix = "free some space (gaudi-gui models --sort size) or point HF_HUB_CACHE at a larger disk"
    else:
        why = ("it is on a read-only file system" if exc.errno == errno.EROFS
               else "this user may not write there")
        fix = "point HF_HUB_CACHE (or --cache-dir) at a folder this user can write"
    return redact(f"cannot write {path}: {why} ({os.strerror(exc.errno or 0)}); {fix}")


def _file_of(exc: Any) -> str:
    """The file an HTTP error was about (its ``/resolve/REV/FILE`` URL), "" for another request."""
    from urllib.parse import unquote, urlparse
    try:
        path = unquote(urlparse(str(exc.response.url)).path)
    except Exception:  # no response or no URL: the error names no file
        return ""
    return path.split("/resolve/", 1)[1].partition("/")[2] if "/resolve/" in path else ""


def offline_message(repo_id: str) -> str:
    return (f"offline: HF_HUB_OFFLINE is set on this machine, so nothing can be downloaded and {repo_id} "
            "is not complete in its cache; unset HF_HUB_OFFLINE (or set it to 0) to download")


def cached_snapshot(repo_id: str, revision: str | None, include: Sequence[str] | None,
                    exclude: Sequence[str] | None, cache_dir: str | None) -> str | None:
    """The snapshot folder when the cache alone holds the whole (filtered) revision, else None. No
    network: what the offline path can still answer."""
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True,
                                 allow_patterns=list(include) if include else None,
                                 ignore_patterns=list(exclude) if exclude else None,
                                 tqdm_class=SilentBar)
    except Exception:
        return None


def plan(repo_id: str, revision: str | None = None, include: Sequence[str] | None = None,
         exclude: Sequence[str] | None = None, cache_dir: str | None = None) -> Plan:
    """What a download of ``repo_id`` would fetch, from the Hub's dry run; raises ``HubProblem``.

    In offline mode it says so at once (no request is made, nothing can hang)."""
    bad = check_repo_id(repo_id)
    if bad:
        raise HubProblem("bad_input", bad)
    cache = cache_dir or default_cache_dir()
    if offline():
        raise HubProblem("offline", offline_message(repo_id))
    from huggingface_hub import snapshot_download
    try:
        infos = snapshot_download(repo_id, revision=revision, cache_dir=cache, dry_run=True,
                                  allow_patterns=list(include) if include else None,
                                  ignore_patterns=list(exclude) if exclude else None,
                                  tqdm_class=SilentBar)
    except Exception as exc:
        raise describe_error(exc, repo_id, revision) from None
    files = sorted((PlanFile(i.filename, i.file_size, bool(i.is_cached)) for i in infos),
                   key=lambda f: f.filename)
    commit = infos[0].commit_hash if infos else ""
    result = Plan(repo_id=repo_id, revision=revision or "main", commit=commit,
                  cache_dir=str(Path(cache).expanduser().resolve()), files=files)
    result.free_bytes = free_bytes(result.cache_dir)
    result.partial_bytes = sum(size for _path, size in partial_files(result.cache_dir, repo_id))
    return result


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Free bytes for an unprivileged user on the file system that holds ``path`` (or would: the
    nearest existing ancestor when the cache folder is not made yet)."""
    probe = Path(path).expanduser().absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def space_refusal(plan_: Plan, margin: int = DEFAULT_MARGIN_BYTES) -> str | None:
    """Why the plan does not fit on the cache's disk (with the numbers), or None when it does."""
    # Partial files already hold their bytes on that disk: only the rest needs room.
    needed = plan_.to_download_bytes
    if plan_.free_bytes is None or needed == 0:
        return None
    if needed + margin <= plan_.free_bytes:
        return None
    return (f"not enough disk space for {plan_.repo_id}: {human(needed)} to download "
            f"({needed} bytes) but {human(plan_.free_bytes)} free ({plan_.free_bytes} bytes) "
            f"at {plan_.cache_dir}, and {human(margin)} is kept free; free some space (gaudi-gui models "
            "--sort size) or point HF_HUB_CACHE at a larger disk")


def human(n: float | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} PB"  # pragma: no cover


def count(n: object, noun: str) -> str:
    """``n`` and the noun, plural unless it is 1 ("1 file", "3 files", "? files" for no number)."""
    number = n if isinstance(n, int) and not isinstance(n, bool) else None
    return f"{'?' if number is None else number} {noun}{'' if number == 1 else 's'}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


# -- progress -----------------------------------------------------------------------------------------


class Progress:
    """Bytes and files of one attempt, as ``progress`` events: rate over the last ~5 s, ETA from it
    once this attempt has fetched ``MIN_ETA_BYTES`` over ``MIN_ETA_S`` (a first 23-byte file said
    "ETA 10881h59m" for 300 MB: a rate from so little is no rate)."""

    WINDOW_S = 5.0
    MIN_ETA_BYTES = 512 * 1024
    MIN_ETA_S = 2.0

    def __init__(self, bytes_total: int = 0, files_total: int = 0) -> None:
        self.bytes_total = bytes_total
        self.bytes_done = 0
        self.files_total = files_total
        self.files_done = 0
        self.started = time.monotonic()
        #: Bytes this attempt fetched itself (an earlier attempt's, resumed, are not).
        self.fetched = 0
        self._samples: deque[tuple[float, int]] = deque([(self.started, 0)])

    def add_resumed(self, n: int) -> None:
        """Bytes an earlier attempt left on disk: done, but not part of the rate."""
        self.bytes_done += n
        self._samples = deque((t, b + n) for t, b in self._samples)

    def add_bytes(self, n: int) -> None:
        self.bytes_done = max(0, self.bytes_done + n)
        self.fetched = max(0, self.fetched + n)
        now = time.monotonic()
        self._samples.append((now, self.bytes_done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.WINDOW_S:
            self._samples.popleft()

    def rate(self) -> float:
        now = time.monotonic()
        first_t, first_b = self._samples[0]
        span = now - first_t
        return (self.bytes_done - first_b) / span if span > 0.05 else 0.0

    def event(self) -> dict[str, Any]:
        rate = self.rate()
        left = max(0, self.bytes_total - self.bytes_done)
        sure = (self.fetched >= min(self.MIN_ETA_BYTES, left + self.fetched)
                and time.monotonic() - self.started >= self.MIN_ETA_S)
        return {"type": EventType.PROGRESS, "bytes_done": self.bytes_done, "bytes_total": self.bytes_total,
                "rate": round(rate, 1), "eta_s": round(left / rate, 1) if rate > 0 and sure else None,
                "files_done": self.files_done, "files_total": self.files_total,
                "elapsed_s": round(time.monotonic() - self.started, 2)}


def progress_text(event: dict[str, Any]) -> str:
    done, total = event.get("bytes_done", 0), event.get("bytes_total", 0)
    pct = f"{100 * done / total:5.1f}%" if total else "  -  "
    eta = event.get("eta_s")
    return (f"{pct} {human(done)} / {human(total)}  {human(event.get('rate') or 0)}/s  "
            f"ETA {duration(eta) if eta is not None else '?'}  "
            f"files {event.get('files_done', 0)}/{event.get('files_total', 0)}")


def bytes_on_disk(cache_dir: str, repo_id: str) -> int:
    """Bytes of the repo's blobs and partial downloads in the cache: what the watchdog watches grow."""
    blobs = Path(cache_dir) / repo_folder(repo_id) / "blobs"
    total = 0
    try:
        entries = list(os.scandir(blobs))
    except OSError:
        return 0
    for entry in entries:
        try:
            total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


def incomplete_files(cache_dir: str, repo_id: str) -> set[str]:
    blobs = Path(cache_dir) / repo_folder(repo_id) / "blobs"
    try:
        return {e.path for e in os.scandir(blobs) if e.name.endswith(".incomplete")}
    except OSError:
        return set()


def is_resumable(name: str) -> bool:
    """``<etag>.incomplete`` (continued by the next attempt), not the library's per-process
    ``<etag>.<uuid>.incomplete`` (nobody can continue it)."""
    return name.endswith(".incomplete") and "." not in name[:-len(".incomplete")]


def partial_files(cache_dir: str, repo_id: str) -> list[tuple[str, int]]:
    """The repo's resumable partial files and their sizes."""
    out = []
    for path in incomplete_files(cache_dir, repo_id):
        if is_resumable(os.path.basename(path)):
            with contextlib.suppress(OSError):
                out.append((path, os.stat(path).st_size))
    return out


# -- verifying what arrived ----------------------------------------------------------------------------

_HEX = frozenset("0123456789abcdef")


@dataclass
class FileCheck:
    filename: str
    #: "ok", "size" (not the size the Hub listed), "hash" (not the ETag's digest), "missing"
    result: str
    message: str = ""
    #: The blob that was checked (what to remove when it is bad).
    blob: str = ""


def etag_hasher(etag: str, size: int | None) -> Any | None:
    """A hashlib object that computes what the ETag is a digest of (sha256 for an LFS file, git's blob
    sha1, which needs the size up front, for the others), or None when the ETag is no digest."""
    import hashlib
    etag = etag.lower()
    if len(etag) not in (40, 64) or not set(etag) <= _HEX:
        return None
    if len(etag) == 64:
        return hashlib.sha256()
    if size is None:
        return None
    digest = hashlib.sha1()
    digest.update(f"blob {size}\0".encode())
    return digest


def mismatch(filename: str, etag: str, got: str) -> str:
    kind = "sha256" if len(etag) == 64 else "git sha1"
    return f"{filename}: {kind} {got[:16]}… but the Hub's ETag says {etag[:16]}…"


def digest(path: Path, etag: str, size: int) -> str:
    """The file's digest in the ETag's form."""
    digest = etag_hasher(etag, size)
    assert digest is not None
    with open(path, "rb") as fh:
        while chunk := fh.read(4 * 1024 * 1024):
            digest.update(chunk)
    return str(digest.hexdigest())


def verify_files(snapshot_path: str, files: Sequence[PlanFile]) -> list[FileCheck]:
    """Check each of ``files`` in a downloaded snapshot against what the Hub said: its size (the plan's)
    and, where its ETag is a digest (the blob's name in the cache: sha256 for LFS files, git's sha1 for
    the others), its content. What ``hf cache verify`` checks, for the files just fetched. Files are
    hashed on a few threads (hashlib lets go of the GIL): a sharded model's shards in parallel."""
    from concurrent.futures import ThreadPoolExecutor
    workers = max(1, min(4, os.cpu_count() or 1, len(files)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gaudi-gui-verify") as pool:
        return list(pool.map(lambda f: _check_file(snapshot_path, f), files))


def _check_file(snapshot_path: str, f: PlanFile) -> FileCheck:
    try:
        blob = (Path(snapshot_path) / f.filename).resolve(strict=True)
    except OSError:
        return FileCheck(f.filename, "missing", f"{f.filename} is not in the snapshot")
    return check_blob(f.filename, blob, f.size)


def check_blob(filename: str, blob: Path, listed_size: int | None) -> FileCheck:
    """One blob (named by its ETag) against the size the Hub listed and the ETag's digest."""
    try:
        size = blob.stat().st_size
    except OSError:
        return FileCheck(filename, "missing", f"{filename} is not in the cache")
    if listed_size is not None and size != listed_size:
        return FileCheck(filename, "size", f"{filename} has {size:,} bytes, the Hub lists {listed_size:,}",
                         str(blob))
    etag = blob.name.lower()
    if etag_hasher(etag, size) is not None:
        got = digest(blob, etag, size)
        if got != etag:
            return FileCheck(filename, "hash", mismatch(filename, etag, got), str(blob))
    return FileCheck(filename, "ok", "", str(blob))


def remove_bad(snapshot_path: str, checks: Sequence[FileCheck]) -> None:
    """Remove the bad files' blobs and links, so nothing loads them and the next plan fetches them."""
    for check in checks:
        if check.result == "ok":
            continue
        for path in (check.blob, str(Path(snapshot_path) / check.filename)):
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)


# -- the cache ----------------------------------------------------------------------------------------


@dataclass
class CachedRevision:
    commit: str
    refs: list[str]
    size_on_disk: int
    files: int
    snapshot_path: str
    last_modified: float
    #: Why this revision cannot be loaded as it is ("" when nothing says so): files a download of it
    #: planned or began that never arrived, shards its index names that are missing, no weights.
    incomplete: str = ""


@dataclass
class CachedModel:
    repo_id: str
    repo_type: str
    size_on_disk: int
    files: int
    last_accessed: float
    last_modified: float
    revisions: list[CachedRevision]


@dataclass
class CacheListing:
    cache_dir: str
    size_on_disk: int
    models: list[CachedModel]
    incomplete_bytes: int
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        # What a download there may still take (the Models tab shows it per place).
        out["free_bytes"] = free_bytes(self.cache_dir)
        return out


def list_cache(cache_dir: str | None = None, sort: str = "size") -> CacheListing:
    """The Hub cache's repos (``scan_cache_dir``), biggest first (``size``) or most recently used first
    (``used``)."""
    from huggingface_hub import scan_cache_dir
    cache = cache_dir or default_cache_dir()
    if not Path(cache).is_dir():
        return CacheListing(cache, 0, [], 0, [])
    info = scan_cache_dir(cache)
    models = [CachedModel(
        repo_id=r.repo_id, repo_type=r.repo_type, size_on_disk=r.size_on_disk, files=r.nb_files,
        last_accessed=r.last_accessed, last_modified=r.last_modified,
        revisions=sorted((CachedRevision(v.commit_hash, sorted(v.refs), v.size_on_disk, v.nb_files,
                                         str(v.snapshot_path), v.last_modified,
                                         incomplete=snapshot_problem(str(cache), r.repo_id, v.commit_hash,
                                                                     Path(v.snapshot_path))
                                         if r.repo_type == "model" else "")
                          for v in r.revisions),
                         key=lambda v: -v.last_modified))
        for r in info.repos]
    if sort == "used":
        models.sort(key=lambda m: (-m.last_accessed, m.repo_id))
    else:
        models.sort(key=lambda m: (-m.size_on_disk, m.repo_id))
    incomplete = sum(f.size_on_disk for f in getattr(info, "incomplete_files", ()))
    return CacheListing(str(cache), info.size_on_disk, models, incomplete,
                        [redact(str(w)) for w in info.warnings])


#: Files that hold a model's weights (what a snapshot with a config.json and none of these lacks).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt", ".onnx")


def plan_record_path(cache_dir: str, repo_id: str, commit: str) -> Path:
    """Where the download worker records what it set out to fetch of one revision in one cache (in
    gaudi-gui's data folder: the Hub cache stays the library's)."""
    from gaudi_gui.core import paths
    where = str(Path(cache_dir).expanduser().resolve())
    key = hashlib.sha1(f"{where}\0{repo_id}\0{commit}".encode()).hexdigest()
    return paths.data_dir() / "downloads" / f"{key}.json"


def record_plan(plan_: Plan) -> None:
    """Record the files this download sets out to fetch (after --include/--exclude), before the first
    byte: a download that dies, fails or is stopped leaves its record, and the listing names the
    files that never arrived. Best effort: a record that cannot be written costs only that evidence."""
    from gaudi_gui.core import atomic
    with contextlib.suppress(OSError):
        path = plan_record_path(plan_.cache_dir, plan_.repo_id, plan_.commit)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, json.dumps({"cache_dir": plan_.cache_dir, "repo_id": plan_.repo_id,
                                            "commit": plan_.commit,
                                            "files": [f.filename for f in plan_.files]}), fsync=False)


def forget_plan(plan_: Plan) -> None:
    """The download finished: its record says nothing more."""
    with contextlib.suppress(OSError):
        plan_record_path(plan_.cache_dir, plan_.repo_id, plan_.commit).unlink(missing_ok=True)


def _planned(cache_dir: str, repo_id: str, commit: str) -> list[str]:
    try:
        data = json.loads(plan_record_path(cache_dir, repo_id, commit).read_text(encoding="utf-8"))
        files = data.get("files") if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError):
        return []
    return [str(f) for f in files] if isinstance(files, list) else []


def _unfinished_in_tree(repo_path: Path, commit: str, present: set[str]) -> list[str]:
    """Files of the revision (the library's own tree cache, ``trees/<commit>.json``) that are absent
    from its snapshot while their blob lies in the cache as an ``.incomplete`` partial file."""
    try:
        partials = [e.name.split(".", 1)[0] for e in os.scandir(repo_path / "blobs")
                    if e.name.endswith(".incomplete")]
        tree = json.loads((repo_path / "trees" / f"{commit}.json").read_text(encoding="utf-8"))
        entries = tree.get("files") if isinstance(tree, dict) else None
    except (OSError, ValueError, RecursionError):
        return []
    out = []
    for name, entry in (entries.items() if isinstance(entries, dict) and partials else ()):
        if name in present or not isinstance(entry, dict):
            continue
        # A partial blob is named by the file's ETag: the LFS sha256, else the git blob id.
        ids = [str(entry[k]).lower() for k in ("lfs_sha256", "blob_id") if entry.get(k)]
        if any(p.startswith(i) or i.startswith(p) for p in partials for i in ids):
            out.append(str(name))
    return out


def _missing_shards(snapshot: Path, present: set[str]) -> tuple[str, list[str]]:
    """(the index file, the shards it names that are not in the snapshot), for the first index that
    misses any (``model.safetensors.index.json``, ``pytorch_model.bin.index.json`` ...)."""
    for index in sorted(n for n in present if n.endswith(".index.json")):
        try:
            data = json.loads((snapshot / index).read_text(encoding="utf-8"))
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
        except (OSError, ValueError, RecursionError):
            continue
        folder = index.rpartition("/")[0]
        shards = sorted({str(v) for v in (weight_map or {}).values()} if isinstance(weight_map, dict)
                        else set())
        missing = [v for v in shards if (f"{folder}/{v}" if folder else v) not in present]
        if missing:
            return index, missing
    return "", []


def snapshot_problem(cache_dir: str, repo_id: str, commit: str, snapshot: Path) -> str:
    """Why the cached revision cannot be loaded as it is, in one sentence ("" when no evidence says
    so), from what is on disk: the files our own download of it planned that are not in its snapshot
    (it failed, was stopped or died), files whose partial blob lies in the cache unfinished, the
    shards an index file names that are missing, or a config.json with no weight file beside it."""
    try:
        present = {str(p.relative_to(snapshot).as_posix()) for p in snapshot.rglob("*")
                   if p.is_file()}  # a link to a blob that is not there is no file
    except OSError:
        return ""
    planned = [f for f in _planned(cache_dir, repo_id, commit) if f not in present]
    unfinished = [f for f in _unfinished_in_tree(snapshot.parents[1], commit, present) if f not in planned]
    missing = planned + unfinished

    def names(items: list[str]) -> str:
        more = len(items) - 3
        return ", ".join(items[:3]) + (f" and {more} more" if more > 0 else "")

    if missing:
        return f"{names(missing)} never arrived (its download did not finish): download it again to finish it"
    index, shards = _missing_shards(snapshot, present)
    if shards:
        count = f"{len(shards)} shard{'s' if len(shards) != 1 else ''}"
        return f"{names(shards)} missing ({index} names {count} not in the snapshot): download it again"
    if "config.json" in present and not any(n.endswith(WEIGHT_SUFFIXES) for n in present):
        return "config.json but no weight file: the weights were not downloaded"
    return ""


@dataclass
class Deletion:
    repo_id: str
    revisions: list[str]
    freed_bytes: int
    execute: Any  # the library's DeleteCacheStrategy.execute


def deletion(spec: str, cache_dir: str | None = None) -> Deletion:
    """What deleting ``REPO_ID`` (every revision) or ``REPO_ID@REV`` (a commit, its prefix, or a ref)
    frees; ``execute()`` deletes. Raises ``HubProblem('bad_input')`` when nothing matches."""
    from huggingface_hub import scan_cache_dir
    repo_id, _, rev = spec.partition("@")
    cache = cache_dir or default_cache_dir()
    if not Path(cache).is_dir():
        raise HubProblem("bad_input", f"the Hub cache {cache} does not exist: nothing to delete")
    info = scan_cache_dir(cache)
    repos = [r for r in info.repos if r.repo_id == repo_id]
    repos.sort(key=lambda r: r.repo_type != "model")
    if not repos:
        raise HubProblem("bad_input", f"{repo_id} is not in the Hub cache {cache} (see gaudi-gui models)")
    repo = repos[0]
    if rev:
        chosen = [v for v in repo.revisions if v.commit_hash.startswith(rev) or rev in v.refs]
        if not chosen:
            known = ", ".join(sorted(
                v.commit_hash[:12] + (f" ({', '.join(sorted(v.refs))})" if v.refs else "")
                for v in repo.revisions))
            raise HubProblem("bad_input", f"{repo_id} has no cached revision '{rev}' (cached: {known})")
        if len(chosen) > 1:
            raise HubProblem("bad_input", f"'{rev}' matches {len(chosen)} revisions of {repo_id}: give more "
                                          "of the commit hash")
    else:
        chosen = list(repo.revisions)
    hashes = [v.commit_hash for v in chosen]
    strategy = info.delete_revisions(*hashes)
    return Deletion(repo_id, hashes, strategy.expected_freed_size, strategy.execute)


__all__ = ["DEFAULT_MARGIN_BYTES", "EXIT_FIX", "EXIT_TRANSIENT", "CacheListing", "CachedModel",
           "Deletion", "FileCheck", "HubProblem", "Plan", "PlanFile", "Progress", "SilentBar",
           "bytes_on_disk", "check_blob", "check_repo_id", "count", "deletion", "describe_error", "digest",
           "etag_hasher", "forget_plan", "free_bytes", "human", "incomplete_files", "is_resumable",
           "list_cache", "mismatch", "partial_files", "plan", "plan_record_path", "progress_text",
           "record_plan", "remove_bad", "snapshot_problem", "space_refusal", "verify_files"]
