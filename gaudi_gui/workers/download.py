"""``python -m gaudi_gui.workers.download REPO_ID ...``: one download attempt, as JSON-line events.

The parent (``gaudi-gui download``) watches the bytes on disk, ends a stalled attempt and retries; this
child does the rest in one process (one Python start, one huggingface_hub import per attempt):

1. the plan (``core.hub.plan``, the library's dry run) and its refusals: a bad id, no file matching,
   a gated/private/missing repo or revision, not enough disk (exit 2); offline mode answers from the
   cache alone;
2. ``snapshot_download``, with two changes to how one file is fetched over plain HTTP (the library's
   ``_download_to_tmp_and_move``, replaced in this process only, when its signature is the one read):
   - the partial file is the library's own ``<etag>.incomplete``, opened for appending: what an earlier
     attempt left (stalled, stopped, killed) is continued with ``Range: bytes=N-`` instead of the
     library's fresh per-process file (huggingface_hub 2.4, PR #4228), and is kept when this attempt
     fails. The library's lock on the blob is held around it, as around its own; where a file system
     ignores that lock and two processes append to one file, the digest check below sees it;
   - the bytes are hashed while they arrive (on a thread, fed the chunks the library writes; what an
     earlier attempt left is read once first), against the ETag's digest (sha256 for an LFS file,
     git's blob sha1 for a small one): no full pass over the files after the download. A file that
     does not match is removed before it is put in place, and named (``verify_failed``). A Xet
     download writes its own file: it is hashed as soon as it is complete, while the next one arrives.
3. events on stdout, one write each: ``started``, ``plan``, ``resumed`` (a file continued, and from
   where), ``progress`` about once a second (from huggingface_hub's own ``tqdm_class`` hook: 2.4 builds a
   "Reconstructing…" bar, whose updates are bytes written, and a "Fetching N files" bar from it),
   ``verified`` or ``verify_failed``, then ``done`` or ``error``.

Exit 0 done, 2 a problem retrying cannot fix (gated, not found, offline, disk, bad input), 1 a transient
one (the network, a damaged file). The child ends itself when its stdin closes (its parent died, or the
ssh link to it did), and the token is never handled here: the library reads the user's own login.
"""

from __future__ import annotations

import argparse
import inspect
import os
import queue
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gaudi_gui.core import events, hub
from gaudi_gui.core.events import EventType
from gaudi_gui.core.hub import HubProblem, Progress, SilentBar, describe_error

_write_lock = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    data = events.encode(event)
    with _write_lock:
        os.write(1, data)


class Reporter:
    """Collects the library's bar updates; a ticker thread prints a progress event each interval."""

    def __init__(self, bytes_total: int, files_total: int, interval_s: float) -> None:
        self.progress = Progress(bytes_total, files_total)
        self.interval_s = interval_s
        self.lock = threading.Lock()
        #: Bytes the library is about to count through the bar (a resumed file's ``initial``) that
        #: arrived in an earlier attempt: done, not part of this attempt's rate.
        self._resumed_pending = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.report()

    def report(self) -> None:
        with self.lock:
            event = self.progress.event()
        emit(event)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report()

    def resumed(self, n: int) -> None:
        with self.lock:
            self._resumed_pending += n

    def bytes(self, n: int) -> None:
        with self.lock:
            old = min(max(n, 0), self._resumed_pending)
            self._resumed_pending -= old
            self.progress.add_resumed(old)
            self.progress.add_bytes(n - old)

    def file_done(self, n: int) -> None:
        with self.lock:
            self.progress.files_done += n


REPORTER: Reporter | None = None


class Bar(SilentBar):
    """What ``snapshot_download`` needs of a tqdm class (it calls ``cls(**kwargs)`` for a class that is not
    its own tqdm subclass): counts go to the reporter, nothing is drawn."""

    def __init__(self, *args: object, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        desc = str(kwargs.get("desc") or "")
        self.role = ("files" if desc.startswith("Fetching") else
                     "transfer" if desc.startswith("Downloading bytes") else "bytes")
        self.n = int(kwargs.get("initial") or 0)

    def update(self, n: float | None = 1) -> None:
        step = int(n or 0)
        self.n += step
        if REPORTER is None:
            return
        if self.role == "bytes":
            REPORTER.bytes(step)
        elif self.role == "files":
            REPORTER.file_done(step)


# -- checking while the bytes arrive, and continuing partial files -----------------------------------

_CHUNK = 4 * 1024 * 1024


class InflightCheck:
    """One file's digest, computed on a thread from the chunks as they are written (hashlib lets go of
    the GIL, so it overlaps the download); the bytes already on disk are read once first."""

    def __init__(self, filename: str, path: Path, etag: str, size: int | None, *, resume: int,
                 enabled: bool) -> None:
        self.filename, self.path, self.etag, self.size = filename, path, etag.lower(), size
        self.written = resume
        #: False after a seek the stream cannot follow: the finished file is hashed instead.
        self.followable = True
        self._hasher = hub.etag_hasher(etag, size) if enabled else None
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=64)
        self._thread: threading.Thread | None = None
        if self._hasher is not None:
            self._thread = threading.Thread(target=self._run, args=(resume,), daemon=True,
                                            name="gaudi-gui-hash")
            self._thread.start()

    def _run(self, resume: int) -> None:
        try:
            hasher = self._hasher
            assert hasher is not None
            left = resume
            with open(self.path, "rb") as fh:
                while left > 0 and (chunk := fh.read(min(_CHUNK, left))):
                    hasher.update(chunk)
                    left -= len(chunk)
            while (data := self._chunks.get()) is not None:
                if data == b"":  # the stream went back to byte 0: a fresh digest
                    hasher = self._hasher = hub.etag_hasher(self.etag, self.size)
                    assert hasher is not None
                else:
                    hasher.update(data)
        except Exception:
            self.followable = False  # the finished file is hashed instead; keep taking chunks
            while self._chunks.get() is not None:
                pass

    def feed(self, data: bytes) -> None:
        self.written += len(data)
        if self._thread is not None and data:
            self._chunks.put(bytes(data))

    def restart(self) -> None:
        self.written = 0
        if self._thread is not None:
            self._chunks.put(b"")

    def close(self) -> None:
        if self._thread is not None:
            self._chunks.put(None)
            self._thread.join()
            self._thread = None

    def result(self) -> hub.FileCheck:
        """Close, then ok / size / hash (``hash`` also when the stream could not be followed and the
        finished file does not match)."""
        self.close()
        size = self.written if self.followable else self.path.stat().st_size
        if self.size is not None and size != self.size:
            return hub.FileCheck(self.filename, "size", f"{self.filename} has {size:,} bytes, "
                                                        f"the Hub lists {self.size:,}", str(self.path))
        if self._hasher is None:
            return hub.FileCheck(self.filename, "ok", "", str(self.path))
        got = (str(self._hasher.hexdigest()) if self.followable else hub.digest(self.path, self.etag, size))
        if got != self.etag:
            return hub.FileCheck(self.filename, "hash", hub.mismatch(self.filename, self.etag, got),
                                 str(self.path))
        return hub.FileCheck(self.filename, "ok", "", str(self.path))


class _Tee:
    """The file handed to the library's ``http_get``: writes go to the file and to the check."""

    def __init__(self, fh: Any, check: InflightCheck) -> None:
        self._fh, self._check = fh, check

    def write(self, data: bytes) -> int:
        n = int(self._fh.write(data))
        self._check.feed(data)
        return n

    def seek(self, pos: int, whence: int = 0) -> int:
        # http_get goes back to byte 0 when a server ignores a Range (answers 200): start again.
        if whence == 0 and pos == 0:
            self._check.restart()
        elif not (whence == 0 and pos == self._fh.tell()):
            self._check.followable = False
        return int(self._fh.seek(pos, whence))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


class Damaged(Exception):
    """A file whose bytes do not match the Hub's ETag (already removed)."""


class Fetching:
    """What this attempt fetched and how each file checked out (filled by ``fetch_file``)."""

    def __init__(self, verify: bool) -> None:
        self.verify = verify
        self.lock = threading.Lock()
        self.checks: dict[str, hub.FileCheck] = {}
        self.later: dict[str, Future[hub.FileCheck]] = {}
        self.wait_s = 0.0
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gaudi-gui-verify")
        self.original: Any = None

    def install(self) -> bool:
        """Replace the library's one-file fetch in this process; False (the library's own behaviour,
        checked after the download) when its signature is not the one this was written against."""
        from huggingface_hub import file_download as fd
        expected = ["incomplete_path", "destination_path", "url_to_download", "headers", "expected_size",
                    "filename", "force_download", "etag", "xet_file_data", "tqdm_class"]
        original = getattr(fd, "_download_to_tmp_and_move", None)
        if original is None or list(inspect.signature(original).parameters) != expected or not all(
                hasattr(fd, name) for name in ("http_get", "_chmod_and_move", "is_xet_available")):
            return False
        self.original = original
        fd._download_to_tmp_and_move = self.fetch_file  # type: ignore[assignment]  # called by name
        return True

    def fetch_file(self, *, incomplete_path: Path, destination_path: Path, url_to_download: str,
                   headers: dict[str, str], expected_size: int | None, filename: str, force_download: bool,
                   etag: str | None, xet_file_data: Any, tqdm_class: Any = None) -> None:
        """The library's ``_download_to_tmp_and_move`` (it passes every argument by name), continuing
        ``incomplete_path`` and checking the bytes on their way."""
        from huggingface_hub import file_download as fd
        if destination_path.exists() and not force_download:
            return
        if force_download or etag is None or (xet_file_data is not None and fd.is_xet_available()):
            self.original(incomplete_path=incomplete_path, destination_path=destination_path,
                          url_to_download=url_to_download, headers=headers, expected_size=expected_size,
                          filename=filename, force_download=force_download, etag=etag,
                          xet_file_data=xet_file_data, tqdm_class=tqdm_class)
            if self.verify:  # Xet wrote the file its own way: hash it while the next one arrives
                self.later[filename] = self.pool.submit(hub.check_blob, filename, destination_path,
                                                        expected_size)
            return
        with open(incomplete_path, "ab") as fh:
            resume = fh.tell()
            if expected_size is not None and resume > expected_size:
                fh.seek(0)
                fh.truncate()
                resume = 0
            if resume:
                emit({"type": EventType.RESUMED, "filename": filename, "bytes": resume,
                      "size": expected_size})
                if REPORTER is not None:
                    REPORTER.resumed(resume)
            check = InflightCheck(filename, incomplete_path, etag, expected_size, resume=resume,
                                  enabled=self.verify)
            try:
                fd.http_get(url_to_download, _Tee(fh, check),  # type: ignore[arg-type]  # a file enough
                            resume_size=resume, headers=headers,
                            expected_size=expected_size, tqdm_class=tqdm_class)
            finally:
                # Kept on failure: the next attempt continues it (the library would delete it).
                fh.flush()
                check.close()
        started = time.monotonic()
        result = check.result()
        with self.lock:
            self.wait_s += time.monotonic() - started
            self.checks[filename] = result
        if result.result != "ok":
            incomplete_path.unlink(missing_ok=True)
            raise Damaged(result.message)
        fd._chmod_and_move(incomplete_path, destination_path)

    def finish(self, snapshot: str, plan: hub.Plan) -> list[hub.FileCheck]:
        """Every fetched file's check (the Xet ones waited for; a file this process did not see
        arrive, checked now), in the plan's order."""
        started = time.monotonic()
        for filename, future in self.later.items():
            self.checks[filename] = future.result()
        unseen = [f for f in plan.to_fetch if f.filename not in self.checks]
        if self.verify and unseen and snapshot:
            self.checks.update((c.filename, c) for c in hub.verify_files(snapshot, unseen))
        self.pool.shutdown()
        self.wait_s += time.monotonic() - started
        return [self.checks[f.filename] for f in plan.to_fetch if f.filename in self.checks]


def _watch_stdin() -> None:
    """End this process when its stdin closes: the parent is gone and nobody reads our events."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os._exit(143)


def _fail(problem: HubProblem) -> int:
    emit({"type": EventType.ERROR, "kind": problem.kind, "message": problem.message})
    return problem.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaudi_gui.workers.download")
    parser.add_argument("repo_id")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--include", action="append", default=[])
    parser.add_argument("--exclude", action="append", default=[])
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--chunk-mib", type=int, default=1,
                        help="read size of the plain-HTTP path (the library's 10 MiB means one progress "
                             "step and one resumable unit per 10 MiB)")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--watch-stdin", action="store_true")
    args = parser.parse_args(argv)
    if args.watch_stdin:
        threading.Thread(target=_watch_stdin, daemon=True).start()
    emit({"type": EventType.STARTED, "pid": os.getpid(), "repo_id": args.repo_id,
          "xet": not hub.xet_disabled(), "time": time.time()})
    include, exclude = args.include or None, args.exclude or None
    try:
        if hub.offline():
            bad = hub.check_repo_id(args.repo_id)
            if bad:
                return _fail(HubProblem("bad_input", bad))
            path = hub.cached_snapshot(args.repo_id, args.revision, include, exclude, args.cache_dir)
            if not path:
                return _fail(HubProblem("offline", hub.offline_message(args.repo_id)))
            emit({"type": EventType.DONE, "path": path, "offline": True})
            return 0
        plan = hub.plan(args.repo_id, args.revision, include, exclude, args.cache_dir)
    except HubProblem as problem:
        return _fail(problem)
    emit({"type": EventType.PLAN, **plan.to_dict()})
    if not plan.files:
        return _fail(HubProblem("bad_input", f"no file of {plan.repo_id} matches the --include/--exclude "
                                             "patterns"))
    refusal = hub.space_refusal(plan)
    if refusal:
        return _fail(HubProblem("disk", refusal))
    if not plan.to_fetch:
        hub.forget_plan(plan)  # every planned file is in the cache: nothing unfinished to remember
        emit({"type": EventType.DONE, "path": plan.snapshot_path, "fetched": 0})
        return 0
    return _fetch(args, plan)


def _fetch(args: argparse.Namespace, plan: hub.Plan) -> int:
    global REPORTER
    from huggingface_hub import constants, snapshot_download
    if args.chunk_mib > 0:
        # http_get reads constants.DOWNLOAD_CHUNK_SIZE at each call.
        constants.DOWNLOAD_CHUNK_SIZE = args.chunk_mib * 1024 * 1024
    fetching = Fetching(verify=not args.no_verify)
    fetching.install()
    REPORTER = Reporter(plan.remaining_bytes, len(plan.files), args.interval_s)
    REPORTER.start()
    # What this download sets out to fetch, kept until it is done: `models` names what never arrived
    # of a revision whose download failed, was stopped or died.
    hub.record_plan(plan)
    path = ""
    try:
        path = snapshot_download(plan.repo_id, revision=args.revision, cache_dir=plan.cache_dir,
                                 allow_patterns=args.include or None, ignore_patterns=args.exclude or None,
                                 tqdm_class=Bar)
    except KeyboardInterrupt:
        REPORTER.stop()
        emit({"type": EventType.ERROR, "kind": "interrupted", "message": "interrupted"})
        return 130
    except Exception as exc:
        REPORTER.stop()
        if not isinstance(exc, Damaged) and not any(c.result != "ok" for c in fetching.checks.values()):
            return _fail(describe_error(exc, plan.repo_id, args.revision))
    else:
        REPORTER.stop()
    checks = fetching.finish(path, plan)
    bad = [c for c in checks if c.result != "ok"]
    if bad:
        hub.remove_bad(path or plan.snapshot_path, bad)
        emit({"type": EventType.VERIFY_FAILED, "files": [{"filename": c.filename, "result": c.result,
                                                  "message": c.message} for c in bad]})
        reason = ("what arrived does not match what the Hub says: " + "; ".join(c.message for c in bad[:3])
                  + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "")
                  + "; the damaged files were removed")
        return _fail(HubProblem("damaged", reason))
    hub.forget_plan(plan)
    if fetching.verify:
        emit({"type": EventType.VERIFIED, "files": len(checks), "bytes": plan.remaining_bytes,
              "seconds": round(fetching.wait_s, 2)})
    emit({"type": EventType.DONE, "path": path})
    return 0


if __name__ == "__main__":
    code = main()
    # Every event went out with its own write and every file is closed: skip the interpreter's
    # teardown of huggingface_hub and its clients (tenths of a second on a busy machine, and the
    # command waits for this process to end).
    sys.stderr.flush()
    os._exit(code)
