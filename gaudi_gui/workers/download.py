"""``python -m gaudi_gui.workers.download REPO_ID ...``: one download attempt, as JSON-line events.

The parent (``gaudi-gui download``, later the app's download job) plans, watches the bytes on disk and
retries; this child only runs ``snapshot_download`` and reports. Events on stdout, one write each:

- ``{"type": "progress", bytes_done, bytes_total, rate, eta_s, files_done, files_total, elapsed_s}``
  about once a second (and at the end), from huggingface_hub's own ``tqdm_class`` hook. In 2.4
  ``snapshot_download`` builds three bars from that class: "Downloading bytes" (network bytes),
  "Reconstructing…" (bytes written; each file's bar adds its total to it) and "Fetching N files" (one
  step per finished file, cached ones included). The bytes come from the second, the files from the third.
- ``{"type": "done", "path": SNAPSHOT}`` or ``{"type": "error", "kind", "message"}``.

Exit 0 done, 2 a problem retrying cannot fix (gated, not found, offline, disk), 1 a transient one.
The child ends itself when its stdin closes (its parent died, or the ssh link to it did), and the token
is never handled here: the library reads the user's own login.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from gaudi_gui.core import events
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

    def bytes(self, n: int) -> None:
        with self.lock:
            self.progress.add_bytes(n)

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


def _watch_stdin() -> None:
    """End this process when its stdin closes: the parent is gone and nobody reads our events."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os._exit(143)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaudi_gui.workers.download")
    parser.add_argument("repo_id")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--include", action="append", default=[])
    parser.add_argument("--exclude", action="append", default=[])
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--bytes-total", type=int, default=0)
    parser.add_argument("--files-total", type=int, default=0)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--chunk-mib", type=int, default=1,
                        help="read size of the plain-HTTP path (the library's 10 MiB means one progress "
                             "step and one resumable unit per 10 MiB)")
    parser.add_argument("--watch-stdin", action="store_true")
    args = parser.parse_args(argv)
    if args.watch_stdin:
        threading.Thread(target=_watch_stdin, daemon=True).start()

    global REPORTER
    from huggingface_hub import constants, snapshot_download
    if args.chunk_mib > 0:
        # http_get reads constants.DOWNLOAD_CHUNK_SIZE at each call.
        constants.DOWNLOAD_CHUNK_SIZE = args.chunk_mib * 1024 * 1024
    REPORTER = Reporter(args.bytes_total, args.files_total, args.interval_s)
    emit({"type": "started", "pid": os.getpid(), "repo_id": args.repo_id,
          "xet": not constants.HF_HUB_DISABLE_XET, "time": time.time()})
    REPORTER.start()
    try:
        path = snapshot_download(args.repo_id, revision=args.revision, cache_dir=args.cache_dir,
                                 allow_patterns=args.include or None, ignore_patterns=args.exclude or None,
                                 tqdm_class=Bar)
    except KeyboardInterrupt:
        REPORTER.stop()
        emit({"type": "error", "kind": "interrupted", "message": "interrupted"})
        return 130
    except Exception as exc:
        REPORTER.stop()
        problem = exc if isinstance(exc, HubProblem) else describe_error(exc, args.repo_id, args.revision)
        emit({"type": "error", "kind": problem.kind, "message": problem.message})
        return problem.exit_code
    REPORTER.stop()
    emit({"type": "done", "path": path})
    return 0


if __name__ == "__main__":
    sys.exit(main())
