"""``gaudi-gui download REPO_ID``: a Hub model into this machine's Hub cache, with a plan, progress, a
stall watchdog and bounded retries.

Each attempt is one child (``python -m gaudi_gui.workers.download``, through ``core.child``) that plans
(the library's dry run: files, sizes, what is cached, free disk; not enough space, a gated/private/
missing repo or revision, or offline mode ends the command, exit 2), fetches and checks what arrives
against the Hub's digests as it arrives. Its JSON-line events are shown here (one updating line on a
terminal, ``--json`` passes them on). The watchdog here watches the repo's bytes on disk (blobs and
``.incomplete`` files) and the bytes the child has read (its sockets included, so a slow link that has
not filled a chunk yet is not a stall): no growth for ``--stall-s`` ends the attempt. A failed or
stalled attempt is retried after a back-off (bounded); after two stalls the next attempts use plain
HTTP (``HF_HUB_DISABLE_XET=1``), and we say so. Finished files are never fetched again, and a partial
one (``<etag>.incomplete``) is continued by the next attempt, or the next command, from its bytes on disk.

The token is never read, passed or printed here: the child's library reads the user's own login.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from gaudi_gui.commands.flags import add_detach_arguments
from gaudi_gui.core import events, hub, protocol
from gaudi_gui.core.backoff import Backoff
from gaudi_gui.core.child import Child
from gaudi_gui.core.events import EventType

DEFAULT_STALL_S = 60.0
DEFAULT_ATTEMPTS = 4
#: Stalls after which the remaining attempts go over plain HTTP instead of Xet.
XET_OFF_AFTER_STALLS = 2
#: Seconds a child has to end after SIGTERM before it is killed.
TERM_GRACE_S = 3.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("download", help="download a Hub model into this machine's cache, with progress, "
                                        "a stall watchdog and retries")
    p.add_argument("repo_id", metavar="REPO_ID", help="the Hub model id (org/name)")
    p.add_argument("--revision", default=None, metavar="REV", help="branch, tag or commit (default main)")
    p.add_argument("--include", action="extend", nargs="+", default=[], metavar="GLOB",
                   help="only files matching one of these patterns (e.g. '*.safetensors' '*.json')")
    p.add_argument("--exclude", action="extend", nargs="+", default=[], metavar="GLOB",
                   help="leave out files matching one of these patterns (e.g. '*.bin' 'original/*')")
    p.add_argument("--json", action="store_true", help="print JSON-line events instead of text")
    p.add_argument("--stall-s", type=float, default=DEFAULT_STALL_S, metavar="S",
                   help="end and retry an attempt after S seconds without a byte "
                        f"(default {DEFAULT_STALL_S:g})")
    p.add_argument("--attempts", type=int, default=DEFAULT_ATTEMPTS, metavar="N",
                   help=f"attempts in all before giving up (default {DEFAULT_ATTEMPTS})")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="the Hub cache to fill (default: HF_HUB_CACHE, as from_pretrained uses it)")
    p.add_argument("--events", action="store_true",
                   help="print the events as protocol lines (core.protocol), for a supervisor or the app")
    add_detach_arguments(p, "download")
    from gaudi_gui.commands import client
    client.add_argument(p)
    p.add_argument("--no-verify", action="store_true",
                   help="do not check the fetched files against the Hub's sizes and ETag digests "
                        "(sha256 for LFS files, git's sha1 for the others)")


class _Out:
    """Text or JSON lines on stdout; problems on stderr (and as an event with --json)."""

    def __init__(self, as_json: bool, as_events: bool = False) -> None:
        self.json = as_json or as_events
        #: Protocol lines (``@gaudi-gui {...}``): what a supervisor keeps in the run's events.jsonl.
        self.protocol = as_events
        self.tty = sys.stdout.isatty() and not as_json
        self._line_open = False
        self._last_plain = 0.0
        self._last_text = ""

    def event(self, event: dict[str, Any]) -> None:
        if self.protocol:
            protocol.write_line(sys.stdout, protocol.encode(event))
        elif self.json:
            sys.stdout.buffer.write(events.encode(event))
            sys.stdout.flush()

    def say(self, text: str) -> None:
        # Under a supervisor (--events) the sentences are plain lines beside the events: its log, which
        # a person following the job (the foreground command through the agent, `runs follow`) reads.
        if self.json and not self.protocol:
            return
        self._close_line()
        print(text, flush=True)

    def problem(self, text: str, kind: str) -> None:
        self._close_line()
        if self.json:
            self.event({"type": EventType.ERROR, "kind": kind, "message": text})
        print(f"gaudi-gui download: {text}", file=sys.stderr, flush=True)

    def progress(self, event: dict[str, Any], final: bool = False) -> None:
        if self.json:
            self.event(event)
            return
        text = hub.progress_text(event)
        if self.tty:
            sys.stdout.write("\r" + text.ljust(78))
            sys.stdout.flush()
            self._line_open = True
        elif (final and text != self._last_text) or time.monotonic() - self._last_plain >= 5.0:
            # A pipe or a log (a host's relay): a line every 5 s, not a flood of carriage returns.
            self._last_plain = time.monotonic()
            self._last_text = text
            print(text, flush=True)

    def _close_line(self) -> None:
        if self._line_open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._line_open = False


def _print_plan(out: _Out, plan: hub.Plan) -> None:
    out.event({"type": EventType.PLAN, **plan.to_dict()})
    cached = [f for f in plan.files if f.cached]
    on_disk = plan.remaining_bytes - plan.to_download_bytes
    out.say(f"{plan.repo_id} @ {plan.revision} (commit {plan.commit[:12]}): "
            f"{hub.count(len(plan.files), 'file')}, {hub.human(plan.total_bytes)}; cached {len(cached)}, "
            f"to download {hub.count(len(plan.to_fetch), 'file')} ({hub.human(plan.to_download_bytes)}"
            + (f"; {hub.human(on_disk)} of it already on disk)" if on_disk else ")"))
    shown = sorted(plan.files, key=lambda f: -(f.size or 0))[:25]
    for f in sorted(shown, key=lambda f: f.filename):
        out.say(f"  {hub.human(f.size):>10}  {'cached  ' if f.cached else 'download'}  {f.filename}")
    if len(plan.files) > len(shown):
        out.say(f"  … and {hub.count(len(plan.files) - len(shown), 'smaller file')}")
    out.say(f"cache {plan.cache_dir}: {hub.human(plan.free_bytes)} free")


def _child_read_bytes(pid: int) -> int:
    """Bytes the child has read through read(2)-like calls, sockets included (Linux /proc/PID/io)."""
    try:
        import psutil
        return int(psutil.Process(pid).io_counters().read_chars)
    except Exception:
        return 0


class _Attempt:
    def __init__(self) -> None:
        self.plan: hub.Plan | None = None
        self.path = ""
        self.done: dict[str, Any] = {}
        self.error: dict[str, Any] | None = None
        self.stalled = False
        self.code = 0
        self.bytes_done = 0


def _run_attempt(args: argparse.Namespace, out: _Out, attempt: int, xet_off: bool,
                 first_plan: hub.Plan | None) -> _Attempt:
    """One child: it plans, fetches (continuing partial files) and checks what arrived; here its
    events are shown and its bytes watched."""
    result = _Attempt()
    cmd = [sys.executable, "-m", "gaudi_gui.workers.download", args.repo_id, "--watch-stdin"]
    for flag, value in (("--revision", args.revision), ("--cache-dir", args.cache_dir)):
        if value:
            cmd += [flag, value]
    for pattern in args.include:
        cmd += ["--include", pattern]
    for pattern in args.exclude:
        cmd += ["--exclude", pattern]
    if args.no_verify:
        cmd.append("--no-verify")
    env = dict(os.environ)
    if xet_off:
        env["HF_HUB_DISABLE_XET"] = "1"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    child = Child(cmd, decode=events.decode, env=env, tail_lines=20)
    cache_dir, before = "", set()
    stall_s = max(0.2, float(args.stall_s))
    poll_s = min(1.0, stall_s / 4)
    last_measure = -1
    last_growth = time.monotonic()
    last_progress: dict[str, Any] | None = None
    try:
        while True:
            event = child.next_message(timeout=poll_s)
            if event is None:
                break
            kind = event.get("type")
            if kind == EventType.PLAN:
                result.plan = plan = hub.Plan.from_dict(event)
                cache_dir, before = plan.cache_dir, hub.incomplete_files(plan.cache_dir, plan.repo_id)
                _said_plan(out, plan, attempt, args.attempts, first=first_plan is None, xet_off=xet_off)
            elif kind == EventType.PROGRESS:
                last_progress = event
                out.progress(event)
            elif kind in (EventType.DONE, EventType.ERROR):
                result.done = event if kind == EventType.DONE else {}
                result.path = str(result.done.get("path") or "")
                result.error = event if kind == EventType.ERROR else None
            elif kind in (EventType.RESUMED, EventType.VERIFIED, EventType.VERIFY_FAILED):
                _said_check(out, event)
            measure = _child_read_bytes(child.pid) + (hub.bytes_on_disk(cache_dir, args.repo_id)
                                                      if cache_dir else 0)
            now = time.monotonic()
            if measure != last_measure:
                last_measure, last_growth = measure, now
            elif now - last_growth >= stall_s and child.poll() is None:
                result.stalled = True
                out.event({"type": EventType.STALLED, "seconds": round(now - last_growth, 1)})
                break
    finally:
        result.code = child.end(TERM_GRACE_S)
        if cache_dir:
            # The library's per-process partial files (Xet's) cannot be continued; ours are kept.
            for path in hub.incomplete_files(cache_dir, args.repo_id) - before:
                if not hub.is_resumable(os.path.basename(path)):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
    if last_progress is not None:
        result.bytes_done = int(last_progress.get("bytes_done") or 0)
        if not result.stalled and result.path:
            out.progress(last_progress, final=True)
    if result.error is None and not result.path and not result.stalled:
        tail = child.tail_text(1)
        result.error = {"type": EventType.ERROR, "kind": "other",
                        "message": f"the download process ended with status {result.code}"
                                   + (f": {tail}" if tail else "")}
    return result


def _said_plan(out: _Out, plan: hub.Plan, attempt: int, attempts: int, *, first: bool, xet_off: bool) -> None:
    if first:
        _print_plan(out, plan)
    elif plan.to_fetch:
        on_disk = plan.remaining_bytes - plan.to_download_bytes  # partial files this attempt continues
        out.say(f"attempt {attempt} of {attempts}: {hub.count(len(plan.to_fetch), 'file')} "
                f"({hub.human(plan.remaining_bytes)}) left to download"
                + (f", {hub.human(on_disk)} of it already on disk" if on_disk else ""))
    if plan.to_fetch:
        out.event({"type": EventType.ATTEMPT, "attempt": attempt, "attempts": attempts, "xet": not xet_off,
                   "files_left": len(plan.to_fetch), "bytes_left": plan.remaining_bytes,
                   "partial_bytes": plan.partial_bytes})


def _said_check(out: _Out, event: dict[str, Any]) -> None:
    out.event(event)
    kind = event["type"]
    if kind == EventType.RESUMED:
        out.say(f"continuing {event.get('filename')} from {hub.human(event.get('bytes'))} already on disk")
    elif kind == EventType.VERIFIED:
        out.say(f"verified {hub.count(event.get('files'), 'file')} (sizes and the Hub's digests, checked "
                f"as they arrived; {hub.duration(event.get('seconds'))} spent after the last byte)")
    else:
        for bad in event.get("files") or []:
            out.say(f"damaged: {bad.get('message')} (removed)")


def detached_words(args: argparse.Namespace) -> list[str]:
    """The command's own words again, for its background copy (without --detach/--json/--runs-dir)."""
    words = [args.repo_id, "--stall-s", f"{args.stall_s:g}", "--attempts", str(args.attempts)]
    if args.revision:
        words += ["--revision", args.revision]
    for pattern in args.include:
        words += ["--include", pattern]
    for pattern in args.exclude:
        words += ["--exclude", pattern]
    if args.cache_dir:
        words += ["--cache-dir", args.cache_dir]
    if args.no_verify:
        words.append("--no-verify")
    return words


def _shown(out: _Out) -> Callable[[dict[str, Any]], None]:
    """How a person sees the events of a download the agent runs: its progress, as this command shows
    it in-process (its sentences are in the job's log)."""
    out.tty = False  # a line every 5 s: the job's sentences come between them, from its log
    def show(event: dict[str, Any]) -> None:
        if event.get("type") == EventType.PROGRESS and isinstance(event.get("bytes_done"), int):
            out.progress(event)
    return show


def _refusal(args: argparse.Namespace) -> str:
    """The first thing wrong with what was typed ("" when nothing is), before a background job or the
    agent is asked."""
    if args.attempts < 1:
        return "--attempts must be at least 1"
    if args.stall_s <= 0:
        return "--stall-s must be more than 0"
    return hub.check_repo_id(args.repo_id) or ""


def run(args: argparse.Namespace) -> int:
    if args.detach:
        bad = _refusal(args)
        if bad:
            print(f"gaudi-gui download: {bad}", file=sys.stderr)
            return 2
        from gaudi_gui.commands.detach import detach_command
        # The background command inherits this environment (the user's login, HF_ENDPOINT, ...):
        # nothing secret is written to its payload or run folder.
        return detach_command("download", "download", detached_words(args),
                              name=f"download-{args.repo_id.rsplit('/', 1)[-1]}", runs_dir=args.runs_dir,
                              as_json=args.json)
    from gaudi_gui.commands import client
    if client.wanted(args):
        bad = _refusal(args)
        if bad:
            print(f"gaudi-gui download: {bad}", file=sys.stderr)
            return 2
        return client.run_job("download", detached_words(args), runs_dir=args.runs_dir,
                              shown=_shown(_Out(False)))
    out = _Out(bool(args.json), bool(getattr(args, "events", False)))
    previous = signal.getsignal(signal.SIGTERM)

    def _terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminated)
    try:
        return _download(args, out)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _download(args: argparse.Namespace, out: _Out) -> int:
    started = time.monotonic()
    if args.attempts < 1:
        out.problem("--attempts must be at least 1", "bad_input")
        return 2
    if args.stall_s <= 0:
        out.problem("--stall-s must be more than 0", "bad_input")
        return 2
    backoff = Backoff(initial_s=1.0, max_s=30.0)
    xet_off = hub.xet_disabled()
    stalls = 0
    last_reason = ""
    first: hub.Plan | None = None
    for attempt in range(1, args.attempts + 1):
        result = _run_attempt(args, out, attempt, xet_off, first)
        first = first or result.plan
        if result.path:
            if result.done.get("offline"):
                out.event(result.done)
                out.say(f"offline (HF_HUB_OFFLINE is set), nothing to download: {args.repo_id} is complete "
                        f"in the cache at {result.path}")
                return 0
            if result.plan is not None and not result.plan.to_fetch and attempt == 1:
                out.event({"type": EventType.DONE, "path": result.path, "attempts": 0, "bytes": 0})
                every = ("the file is" if len(result.plan.files) == 1 else
                         f"all {len(result.plan.files)} files are")
                out.say(f"{every} already in the cache: nothing to download")
                out.say(f"model: {result.path}")
                return 0
            return _finished(out, args.repo_id, first, result.path, attempts=attempt, started=started)
        if result.stalled:
            stalls += 1
            last_reason = (f"stalled: no byte arrived for {args.stall_s:g} s "
                           f"({hub.human(result.bytes_done)} of the files were on disk)")
        else:
            error = result.error or {}
            kind = str(error.get("kind") or "other")
            last_reason = str(error.get("message") or "the download failed")
            if kind not in ("network", "damaged", "other"):
                out.problem(last_reason, kind)
                return 2 if kind != "interrupted" else 130
        xet_note = ""
        if stalls >= XET_OFF_AFTER_STALLS and not xet_off:
            xet_off = True
            xet_note = (f"after {stalls} stalls the next attempts use plain HTTP (HF_HUB_DISABLE_XET=1) "
                        "instead of Xet")
        if attempt < args.attempts:
            _wait_retry(out, attempt, args.attempts, backoff, last_reason, xet_note=xet_note)
    out.problem(f"{args.repo_id}: giving up after {hub.count(args.attempts, 'attempt')}; "
                f"{'the last one' if args.attempts > 1 else 'it failed'}: {last_reason}. "
                "Finished files stay in the cache and partial ones on disk: running the same command "
                "again continues with the rest.", "failed")
    return 1


def _wait_retry(out: _Out, attempt: int, attempts: int, backoff: Backoff, reason: str, *,
                xet_note: str) -> None:
    delay = backoff.next()
    out.event({"type": EventType.RETRY, "attempt": attempt, "reason": reason, "delay_s": delay,
               "next_attempt": attempt + 1, "xet_disabled": bool(xet_note)})
    out.say(f"attempt {attempt} of {attempts} failed: {reason}")
    if xet_note:
        out.say(xet_note)
    out.say(f"retrying in {delay:g} s (attempt {attempt + 1} of {attempts}); finished files are kept, "
            "unfinished ones continue from the bytes on disk")
    time.sleep(delay)


def _finished(out: _Out, repo_id: str, plan: hub.Plan | None, path: str, *, attempts: int,
              started: float) -> int:
    seconds = time.monotonic() - started
    out.event({"type": EventType.DONE, "path": path, "attempts": attempts, "seconds": round(seconds, 2),
               "bytes": plan.remaining_bytes if plan else 0})
    out.say(f"done in {hub.duration(seconds)} ({attempts} attempt{'s' if attempts != 1 else ''})")
    out.say(f"model: {path}")
    out.say(f"from_pretrained({json.dumps(repo_id)}) now finds it in this cache, offline too "
            "(HF_HUB_OFFLINE=1)")
    return 0
