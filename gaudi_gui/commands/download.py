"""``gaudi-gui download REPO_ID``: a Hub model into this machine's Hub cache, with a plan, progress, a
stall watchdog and bounded retries.

1. The plan (``core.hub.plan``, the library's dry run): files, sizes, what is cached, free disk. Not
   enough space, a gated/private/missing repo or revision, or offline mode ends here (exit 2).
2. Each attempt is a child (``python -m gaudi_gui.workers.download``) in its own session; its JSON-line
   events are shown (one updating line on a terminal, ``--json`` passes them on). The watchdog here
   watches the repo's bytes on disk (blobs and ``.incomplete`` files) and the bytes the child has read
   (its sockets included, so a slow link that has not filled a chunk yet is not a stall): no growth for
   ``--stall-s`` ends the attempt. A failed or stalled attempt is retried after a back-off (bounded);
   after two stalls the next attempts use plain HTTP (``HF_HUB_DISABLE_XET=1``), and we say so.
3. Finished files stay in the cache and are never fetched again. A new attempt is a new process, and
   huggingface_hub 2.4 gives each process its own ``.incomplete`` file, so an unfinished file starts
   again from byte 0 (we remove the dead attempt's partial files); inside one attempt the library
   itself resumes a broken read with a Range request.

The token is never read, passed or printed here: the child's library reads the user's own login.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import IO, Any

from gaudi_gui.commands.flags import add_detach_arguments
from gaudi_gui.core import events, hub, protocol
from gaudi_gui.core.backoff import Backoff
from gaudi_gui.core.secrets import redact

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
            fields = {k: v for k, v in event.items() if k != "type"}
            protocol.write_line(sys.stdout, protocol.event(str(event["type"]), **fields))
        elif self.json:
            sys.stdout.buffer.write(events.encode(event))
            sys.stdout.flush()

    def say(self, text: str) -> None:
        if self.json:
            return
        self._close_line()
        print(text, flush=True)

    def problem(self, text: str, kind: str) -> None:
        self._close_line()
        if self.json:
            self.event({"type": "error", "kind": kind, "message": text})
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
    out.event({"type": "plan", **plan.to_dict()})
    cached = [f for f in plan.files if f.cached]
    out.say(f"{plan.repo_id} @ {plan.revision} (commit {plan.commit[:12]}): {len(plan.files)} files, "
            f"{hub.human(plan.total_bytes)}; cached {len(cached)}, to download {len(plan.to_fetch)} "
            f"({hub.human(plan.remaining_bytes)})")
    shown = sorted(plan.files, key=lambda f: -(f.size or 0))[:25]
    for f in sorted(shown, key=lambda f: f.filename):
        out.say(f"  {hub.human(f.size):>10}  {'cached  ' if f.cached else 'download'}  {f.filename}")
    if len(plan.files) > len(shown):
        out.say(f"  … and {len(plan.files) - len(shown)} smaller files")
    out.say(f"cache {plan.cache_dir}: {hub.human(plan.free_bytes)} free")


def _read_events(stream: IO[bytes], sink: queue.Queue[dict[str, Any] | None]) -> None:
    for line in stream:
        event = events.decode(line)
        if event is not None:
            sink.put(event)
    sink.put(None)


def _read_tail(stream: IO[bytes], tail: deque[str]) -> None:
    for line in stream:
        text = redact(line.decode("utf-8", errors="replace").rstrip())
        if text:
            tail.append(text)


def _child_read_bytes(pid: int) -> int:
    """Bytes the child has read through read(2)-like calls, sockets included (Linux /proc/PID/io)."""
    try:
        import psutil
        return int(psutil.Process(pid).io_counters().read_chars)
    except Exception:
        return 0


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End the child (its own session: the whole group), SIGKILL after a grace."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class _Attempt:
    def __init__(self) -> None:
        self.path = ""
        self.error: dict[str, Any] | None = None
        self.stalled = False
        self.code = 0
        self.bytes_done = 0


def _run_attempt(args: argparse.Namespace, plan: hub.Plan, out: _Out, xet_off: bool) -> _Attempt:
    result = _Attempt()
    cmd = [sys.executable, "-m", "gaudi_gui.workers.download", plan.repo_id, "--cache-dir", plan.cache_dir,
           "--bytes-total", str(plan.remaining_bytes), "--files-total", str(len(plan.files)),
           "--watch-stdin"]
    if args.revision:
        cmd += ["--revision", args.revision]
    for pattern in args.include:
        cmd += ["--include", pattern]
    for pattern in args.exclude:
        cmd += ["--exclude", pattern]
    env = dict(os.environ)
    if xet_off:
        env["HF_HUB_DISABLE_XET"] = "1"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    before = hub.incomplete_files(plan.cache_dir, plan.repo_id)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    sink: queue.Queue[dict[str, Any] | None] = queue.Queue()
    tail: deque[str] = deque(maxlen=20)
    readers = [threading.Thread(target=_read_events, args=(proc.stdout, sink), daemon=True),
               threading.Thread(target=_read_tail, args=(proc.stderr, tail), daemon=True)]
    for reader in readers:
        reader.start()
    stall_s = max(0.2, float(args.stall_s))
    poll_s = min(1.0, stall_s / 4)
    last_measure = -1
    last_growth = time.monotonic()
    last_progress: dict[str, Any] | None = None
    ended = False
    try:
        while not ended:
            try:
                event = sink.get(timeout=poll_s)
            except queue.Empty:
                event = {}
            if event is None:
                ended = True
            elif event.get("type") == "progress":
                last_progress = event
                out.progress(event)
            elif event.get("type") == "done":
                result.path = str(event.get("path") or "")
            elif event.get("type") == "error":
                result.error = event
            measure = hub.bytes_on_disk(plan.cache_dir, plan.repo_id) + _child_read_bytes(proc.pid)
            now = time.monotonic()
            if measure != last_measure:
                last_measure, last_growth = measure, now
            elif not ended and now - last_growth >= stall_s and proc.poll() is None:
                result.stalled = True
                out.event({"type": "stalled", "seconds": round(now - last_growth, 1)})
                _end(proc)
                break
        result.code = proc.wait()
    finally:
        _end(proc)
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        for reader in readers:
            reader.join(timeout=2)
        # The dead attempt's partial files cannot be continued by a new process (each has its own).
        for path in hub.incomplete_files(plan.cache_dir, plan.repo_id) - before:
            with contextlib.suppress(OSError):
                os.unlink(path)
    if last_progress is not None:
        result.bytes_done = int(last_progress.get("bytes_done") or 0)
        if not result.stalled and result.path:
            out.progress(last_progress, final=True)
    if result.error is None and result.code not in (0,) and not result.stalled:
        result.error = {"type": "error", "kind": "other",
                        "message": f"the download process ended with status {result.code}"
                                   + (f": {tail[-1]}" if tail else "")}
    return result


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


def run(args: argparse.Namespace) -> int:
    if args.detach:
        bad = hub.check_repo_id(args.repo_id)
        if bad:
            print(f"gaudi-gui download: {bad}", file=sys.stderr)
            return 2
        from gaudi_gui.commands.detach import detach_command
        # The background command inherits this environment (the user's login, HF_ENDPOINT, ...):
        # nothing secret is written to its payload or run folder.
        return detach_command("download", "download", detached_words(args),
                              name=f"download-{args.repo_id.rsplit('/', 1)[-1]}", runs_dir=args.runs_dir,
                              as_json=args.json)
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
    if hub.offline():
        bad = hub.check_repo_id(args.repo_id)
        if bad:
            out.problem(bad, "bad_input")
            return 2
        path = hub.cached_snapshot(args.repo_id, args.revision, args.include, args.exclude, args.cache_dir)
        if path:
            out.event({"type": "done", "path": path, "offline": True})
            out.say(f"offline (HF_HUB_OFFLINE is set), nothing to download: {args.repo_id} is complete in "
                    f"the cache at {path}")
            return 0
        out.problem(hub.offline_message(args.repo_id), "offline")
        return 2
    try:
        plan = hub.plan(args.repo_id, args.revision, args.include, args.exclude, args.cache_dir)
    except hub.HubProblem as problem:
        out.problem(problem.message, problem.kind)
        return problem.exit_code
    _print_plan(out, plan)
    if not plan.files:
        out.problem(f"no file of {plan.repo_id} matches the --include/--exclude patterns", "bad_input")
        return 2
    refusal = hub.space_refusal(plan)
    if refusal:
        out.problem(refusal, "disk")
        return 2
    if not plan.to_fetch:
        out.event({"type": "done", "path": plan.snapshot_path, "attempts": 0, "bytes": 0})
        out.say(f"all {len(plan.files)} files are already in the cache: nothing to download")
        out.say(f"model: {plan.snapshot_path}")
        return 0
    backoff = Backoff(initial_s=1.0, max_s=30.0)
    xet_off = hub.xet_disabled()
    stalls = 0
    last_reason = ""
    for attempt in range(1, args.attempts + 1):
        if attempt > 1:
            try:
                plan = hub.plan(args.repo_id, args.revision, args.include, args.exclude, args.cache_dir)
            except hub.HubProblem as problem:
                if problem.exit_code == hub.EXIT_FIX:
                    out.problem(problem.message, problem.kind)
                    return problem.exit_code
                last_reason = problem.message
                if attempt < args.attempts:
                    _wait_retry(out, attempt, args.attempts, backoff, last_reason, xet_note="")
                continue
            if not plan.to_fetch:
                break
            out.say(f"attempt {attempt} of {args.attempts}: {len(plan.to_fetch)} files "
                    f"({hub.human(plan.remaining_bytes)}) left to download")
        out.event({"type": "attempt", "attempt": attempt, "attempts": args.attempts, "xet": not xet_off,
                   "files_left": len(plan.to_fetch), "bytes_left": plan.remaining_bytes})
        result = _run_attempt(args, plan, out, xet_off)
        if result.path and result.code == 0:
            damaged = [] if args.no_verify else _verify(out, plan, result.path)
            if not damaged:
                return _finished(out, plan, result.path, attempt, started)
            last_reason = ("what arrived does not match what the Hub says: "
                           + "; ".join(c.message for c in damaged[:3])
                           + (f" (and {len(damaged) - 3} more)" if len(damaged) > 3 else "")
                           + "; the damaged files were removed")
            if attempt < args.attempts:
                _wait_retry(out, attempt, args.attempts, backoff, last_reason, xet_note="")
            continue
        if result.stalled:
            stalls += 1
            last_reason = (f"stalled: no byte arrived for {args.stall_s:g} s "
                           f"({hub.human(result.bytes_done)} of this attempt were received)")
        else:
            error = result.error or {}
            kind = str(error.get("kind") or "other")
            last_reason = str(error.get("message") or "the download failed")
            if kind not in ("network", "other"):
                out.problem(last_reason, kind)
                return 2 if kind != "interrupted" else 130
        xet_note = ""
        if stalls >= XET_OFF_AFTER_STALLS and not xet_off:
            xet_off = True
            xet_note = (f"after {stalls} stalls the next attempts use plain HTTP (HF_HUB_DISABLE_XET=1) "
                        "instead of Xet")
        if attempt < args.attempts:
            _wait_retry(out, attempt, args.attempts, backoff, last_reason, xet_note=xet_note)
    else:
        out.problem(f"{args.repo_id}: giving up after {args.attempts} attempts; the last one: {last_reason}. "
                    "Finished files stay in the cache: running the same command again continues with the "
                    "rest.", "failed")
        return 1
    # The re-plan found nothing left: another attempt (or process) finished it.
    return _finished(out, plan, plan.snapshot_path, args.attempts, started)


def _verify(out: _Out, plan: hub.Plan, path: str) -> list[hub.FileCheck]:
    """Check the files this attempt fetched (sizes, ETag digests); the bad ones are removed and said."""
    started = time.monotonic()
    checks = hub.verify_files(path, plan.to_fetch)
    bad = [c for c in checks if c.result != "ok"]
    if bad:
        hub.remove_bad(path, bad)
        out.event({"type": "verify_failed", "files": [{"filename": c.filename, "result": c.result,
                                                       "message": c.message} for c in bad]})
        for check in bad:
            out.say(f"damaged: {check.message} (removed)")
    else:
        out.event({"type": "verified", "files": len(checks), "bytes": plan.remaining_bytes,
                   "seconds": round(time.monotonic() - started, 2)})
        out.say(f"verified {len(checks)} files (sizes and the Hub's digests) in "
                f"{hub.duration(time.monotonic() - started)}")
    return bad


def _wait_retry(out: _Out, attempt: int, attempts: int, backoff: Backoff, reason: str, *,
                xet_note: str) -> None:
    delay = backoff.next()
    out.event({"type": "retry", "attempt": attempt, "reason": reason, "delay_s": delay,
               "next_attempt": attempt + 1, "xet_disabled": bool(xet_note)})
    out.say(f"attempt {attempt} of {attempts} failed: {reason}")
    if xet_note:
        out.say(xet_note)
    out.say(f"retrying in {delay:g} s (attempt {attempt + 1} of {attempts}); finished files are kept, "
            "unfinished ones start again from byte 0 in the new attempt")
    time.sleep(delay)


def _finished(out: _Out, plan: hub.Plan, path: str, attempts: int, started: float) -> int:
    seconds = time.monotonic() - started
    out.event({"type": "done", "path": path, "attempts": attempts, "seconds": round(seconds, 2),
               "bytes": plan.remaining_bytes})
    out.say(f"done in {hub.duration(seconds)} ({attempts} attempt{'s' if attempts != 1 else ''})")
    out.say(f"model: {path}")
    out.say(f"from_pretrained({json.dumps(plan.repo_id)}) now finds it in this cache, offline too "
            "(HF_HUB_OFFLINE=1)")
    return 0
