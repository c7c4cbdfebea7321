"""Running a subcommand on a host: what ``--host DEST`` does for every ``gaudi-gui`` subcommand.

``devices``, ``generate``, ``env``, ``runs`` … run on the host as they would here, under ``gaudi-gui
guard`` (so they end when this command or the connection goes) with their output streamed back; the
host's gaudi-gui is checked first (``hello``), and an ssh failure is one line saying what to do.

``train --host`` is different, because a run must outlive the connection: the job file (read here;
the paths in it are the host's) goes to the host's ``train --detach``, which starts the run in a
session of its own there; this command then follows the run's events and log (``runs follow``),
reconnecting with back-off when the connection drops, and Ctrl-C stops the run with a checkpoint
(``runs stop``; a second Ctrl-C: ``runs stop --now``). If this command is killed, the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gaudi_gui.commands.terminal import StopSignals as _Signals
from gaudi_gui.commands.terminal import printable as _printable
from gaudi_gui.commands.terminal import say as _say
from gaudi_gui.core import remote, visibility
from gaudi_gui.core.backoff import Backoff
from gaudi_gui.core.child import Child
from gaudi_gui.core.events import EventType
from gaudi_gui.core.progress import note
from gaudi_gui.core.remote import SSH_FAILED, Host, RemoteError

#: Exit status when the host could not be used (ssh failed, no or another gaudi-gui there).
EXIT_HOST = 3


def strip_host_options(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--host X`` / ``--remote-command X`` (both spellings), up to a ``--``."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--":
            out += list(argv[i:])
            break
        if arg in ("--host", "--remote-command"):
            skip = True
            continue
        if arg.startswith(("--host=", "--remote-command=")):
            continue
        out.append(arg)
    return out


def forward(host: Host, argv: Sequence[str]) -> int:
    """Run ``gaudi-gui ARGV`` on ``host`` under the guard, streaming its output; its exit status."""
    try:
        remote.handshake(host)
    except RemoteError as exc:
        _say(f"gaudi-gui: {exc}")
        return EXIT_HOST

    def echo(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    # stdout is ours; stdin stays open (a pipe we never write): the guard ends the remote command
    # when it closes (Ctrl+C here, or this process gone).
    child = Child(host.wrap(host.guard_argv(argv, run="gaudi_gui")), stdout=False, echo=echo)
    try:
        code = child.proc.wait()
    except KeyboardInterrupt:
        child.close_stdin()
        code = child.proc.wait()
    child.join()
    if code == SSH_FAILED:
        _say(f"gaudi-gui: {remote.explain_ssh_failure(host.name, chr(10).join(child.tail))[1]}")
        return EXIT_HOST
    return code


# -- train on a host ----------------------------------------------------------------------------------


def host_options(args: argparse.Namespace) -> list[str]:
    """The ``train`` options a host's ``train --detach`` takes as they were given here (the device,
    the grace, the host's runs folder, the resumed run, the start gate): none is dropped on the way."""
    argv = ["--device", args.device, "--grace", repr(args.grace)]
    if getattr(args, "runs_dir", ""):
        argv += ["--runs-dir", args.runs_dir]
    if getattr(args, "resumed_from", ""):
        argv += ["--resumed-from", args.resumed_from]
    if getattr(args, "no_preflight", False):
        argv.append("--no-preflight")
    return argv


def train(host: Host, args: argparse.Namespace) -> int:
    from gaudi_gui.core.jobconfig import JobConfigError, load_job
    try:
        job = load_job(args.config)
    except JobConfigError as exc:
        _say(f"gaudi-gui train: {exc}")
        return 2
    # --overwrite-output travels in the job: the host's own `train` decides (the folder is there).
    job.overwrite_output = job.overwrite_output or bool(getattr(args, "overwrite_output", False))
    from gaudi_gui.commands.profile_flag import apply_profile_steps
    apply_profile_steps(job, args)
    try:
        cards = visibility.parse_cards(args.cards) if (args.cards or "").strip() else []
    except ValueError as exc:
        _say(f"gaudi-gui train: {exc}")
        return 2
    try:
        remote.handshake(host)
        argv = ["train", "--config", "-", "--detach", "--json", *host_options(args),
                *visibility.cards_argv(cards)]
        code, out, err = remote.call(host, host.gaudi_gui_argv(*argv), input_text=json.dumps(job.to_dict()),
                                     timeout=180)
    except RemoteError as exc:
        _say(f"gaudi-gui train: {exc}")
        return EXIT_HOST
    if code != 0:
        _say(err.strip() or f"gaudi-gui train: the host refused the run (exit {code})")
        return code
    try:
        info = json.loads(out.strip().splitlines()[-1])
        folder = str(info["folder"])
    except (ValueError, KeyError, IndexError, TypeError):
        _say(f"gaudi-gui train: the host answered something unexpected: {out.strip()[:200]!r}")
        return EXIT_HOST
    if getattr(args, "detach", False):
        # As `train --detach` here: the run goes on by itself on the host; say where and return.
        if getattr(args, "json", False):
            print(json.dumps({**info, "host": host.name}), flush=True)
        else:
            print(f"run folder on {host.name}: {folder} (detached, device {info.get('device')}); follow: "
                  f"gaudi-gui runs follow {folder} --host {host.name}; stop: gaudi-gui runs stop {folder} "
                  f"--host {host.name}", flush=True)
        return 0
    print(f"run folder on {host.name}: {folder} (device {info.get('device')}; the run goes on if this "
          f"command or the connection ends)", flush=True)
    code = follow(host, folder, reconnect_s=args.reconnect_s)
    if job.profile_steps and code == 0:
        bring_profile(host, folder)
    return code


def bring_profile(host: Host, folder: str) -> None:
    """A profiled run that ended on ``host``: its trace (and records) brought into this machine's runs
    store, so Training → Runs, Profile… opens it here (core.run_copy); said either way."""
    from gaudi_gui.core import run_copy
    from gaudi_gui.core.runstore import RunStore
    try:
        local = run_copy.fetch(host, folder, RunStore().root)
    except run_copy.FetchError as exc:
        _say(f"the profile stays on {host.name} in {folder}/profile ({exc}); bring it later: gaudi-gui runs "
             f"--host {host.name} fetch {folder}")
        return
    _say(f"profile: {run_copy.describe_fetched(local)}")


# -- following a run on a host ------------------------------------------------------------------------

@dataclass
class HostRun:
    host: Host
    rank: int
    folder: str = ""
    final: dict[str, Any] | None = None
    lost: str = ""  #: why following this host gave up ("" while following)


def _follow_line(line: str) -> dict[str, Any] | None:
    """One line of ``runs follow`` (its JSON-lines wire format), or None when it is not one."""
    value = json.loads(line)
    return value if isinstance(value, dict) else None


class Follower(threading.Thread):
    """``runs follow`` on one host, reconnecting with back-off; puts (run, message) on ``out``. The ssh
    child runs in a session of its own (``core.child``): a Ctrl+C in the terminal reaches only us."""

    def __init__(self, run: HostRun, out: queue.Queue[tuple[HostRun, dict[str, Any]]], reconnect_s: float,
                 stopping: threading.Event) -> None:
        super().__init__(name=f"follow-{run.host.name}", daemon=True)
        self.run_, self.out, self.reconnect_s, self.stopping = run, out, reconnect_s, stopping
        self.child: Child | None = None

    def run(self) -> None:
        try:
            self._follow()
        except Exception as exc:  # said as the host's loss, never a silent dead thread
            self.run_.lost = f"following {self.run_.host.name} failed: {exc}"
            self.out.put((self.run_, {"t": "lost", "why": self.run_.lost}))

    def _follow(self) -> None:
        events_from = log_from = 0
        backoff = Backoff()
        last_contact = time.monotonic()
        host, folder = self.run_.host, self.run_.folder
        while True:
            cmd = host.wrap(host.gaudi_gui_argv("runs", "follow", folder, "--events-from", str(events_from),
                                                "--log-from", str(log_from)))
            self.child = child = Child(cmd, decode=_follow_line, tail_lines=20)
            while (msg := child.next_message(None)) is not None:
                last_contact = time.monotonic()
                backoff.reset()
                kind = msg.get("t")
                if kind == "log_offset":
                    log_from = int(msg.get("end", log_from))
                elif kind == "event" and "end" in msg:
                    events_from = int(msg["end"])
                if kind == "end":
                    self.run_.final = msg.get("status") or {}
                self.out.put((self.run_, msg))
            child.close_stdin()
            code = child.proc.wait()
            child.join()
            if self.run_.final is not None:
                return
            err = list(child.tail)
            why = (remote.explain_ssh_failure(host.name, "\n".join(err))[1] if code == SSH_FAILED
                   else f"the follower on {host.name} exited with {code}: {' '.join(err)[-200:]}")
            if time.monotonic() - last_contact > self.reconnect_s:
                self.run_.lost = f"{why}; gave up after {self.reconnect_s:g} s"
                self.out.put((self.run_, {"t": "lost", "why": self.run_.lost}))
                return
            delay = backoff.next()
            self.out.put((self.run_, {"t": "reconnecting", "why": why, "in": delay}))
            if self.stopping.wait(delay) and self.run_.final is not None:
                return

    def close(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.close_stdin()


def stop_runs(runs: Sequence[HostRun], now: bool) -> None:
    """``runs stop [--now]`` on every host of ``runs`` still going, all at once."""
    def stop(run: HostRun) -> None:
        if not run.folder or run.final is not None:
            return
        argv = run.host.gaudi_gui_argv("runs", "stop", run.folder, *(["--now"] if now else []))
        try:
            remote.call(run.host, argv, timeout=60)
        except RemoteError as exc:
            _say(f"could not reach {run.host.name} to stop the run there: {exc}")
    with ThreadPoolExecutor(max_workers=max(1, len(runs))) as pool:
        list(pool.map(stop, runs))


def follow(host: Host, folder: str, *, reconnect_s: float = 600.0) -> int:
    """Follow a run on ``host`` to its end (exit 0 finished/stopped, 1 failed/killed, 3 gave up).
    Ctrl-C asks the host for a stop with a checkpoint (a second: kill now), also while reconnecting."""
    return follow_all([HostRun(host, 0, folder)], reconnect_s=reconnect_s)


def relay(runs: list[HostRun], take: Callable[[HostRun, dict[str, Any]], None], *, reconnect_s: float,
          on_signal: Callable[[int, str], None], turn: Callable[[], None] | None = None) -> None:
    """The one relay of a placed job's output, for every kind (training, Serve, Evaluate) and every
    host: each run's ``runs follow`` JSON lines there (a :class:`Follower`, reconnecting with
    back-off; one wire format), handed to ``take`` in order until every run has ended or was lost.
    SIGINT / SIGTERM / SIGHUP are counted while it relays: ``on_signal(count, name)`` once for each
    (the caller stops its runs; the follow goes on until their end). ``turn`` runs every quarter
    second."""
    signals = _Signals()
    previous = {s: signal.signal(s, signals.handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    out: queue.Queue[tuple[HostRun, dict[str, Any]]] = queue.Queue()
    stopping = threading.Event()
    followers = [Follower(r, out, reconnect_s, stopping) for r in runs]
    for f in followers:
        f.start()
    handled = 0
    ended: set[int] = set()  # the ranks whose follower said "end" or "lost" (after all their lines)
    try:
        while len(ended) < len(runs):
            if signals.count > handled:
                handled = signals.count
                on_signal(handled, signals.last)
            if turn is not None:
                turn()
            try:
                run, msg = out.get(timeout=0.25)
            except queue.Empty:
                continue
            take(run, msg)
            if msg.get("t") in ("end", "lost"):
                ended.add(run.rank)
    finally:
        stopping.set()
        for f in followers:
            f.close()
        for sig, old in previous.items():
            signal.signal(sig, old)


def follow_all(runs: list[HostRun], *, reconnect_s: float = 600.0) -> int:
    """Follow the run of every host in ``runs`` (one host, or the machine ranks of a multi-node run)
    to its end; the exit status of the whole run. Ctrl-C stops every host's ranks with a checkpoint
    (a second: kill now), also while reconnecting. Of several hosts, log lines carry a ``host|``
    prefix, progress comes from machine rank 0, and a host whose ranks fail, are killed or is lost
    ends the others at once (they would wait for it in a collective). Following one host that is
    lost gives up and leaves the run going (exit 3)."""
    several = len(runs) > 1
    failed: list[tuple[HostRun, str]] = []  # each failed host and why, in the order they were heard of
    width = max(len(r.host.name) for r in runs)

    def on_signal(count: int, name: str) -> None:
        now = count > 1
        _say(f"\n{name}: " + ("killing the run now (no checkpoint from this stop)" if now else
             "stopping — the ranks save a checkpoint first (Ctrl-C again: kill now)"))
        threading.Thread(target=stop_runs, args=(runs, now), daemon=True).start()

    def take(run: HostRun, msg: dict[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "log":
            prefix = f"{run.host.name:<{width}}| " if several else ""
            with contextlib.suppress(BrokenPipeError):
                print(prefix + _printable(str(msg.get("line", ""))), flush=True)
        elif kind == "event":
            _note(msg.get("event") or {}, run, several)
        elif kind == "reconnecting":
            _say(f"{run.host.name}: {msg.get('why')}; reconnecting in {msg.get('in'):g} s "
                 "(the run goes on on the host)")
        state = str((run.final or {}).get("state", "")) if kind == "end" else ""
        heard = any(r is run for r, _why in failed)
        if several and not heard and (run.lost or state in ("failed", "killed")):
            why = run.lost or str((run.final or {}).get("summary") or state)
            failed.append((run, why))
            if len(failed) > 1:
                _say(f"{run.host.name} (machine rank {run.rank}): {why}")
                return
            _say(f"{run.host.name} (machine rank {run.rank}): {why} — killing the other hosts' ranks, "
                 f"which would otherwise wait for it in a collective")
            threading.Thread(target=stop_runs, args=([r for r in runs if r is not run], True),
                             daemon=True).start()

    relay(runs, take, reconnect_s=reconnect_s, on_signal=on_signal)
    if not several:
        run = runs[0]
        if run.final is None:
            _say(f"gaudi-gui train: {run.lost}. The run goes on on the host: gaudi-gui runs --host "
                 f"{run.host.name} follow {run.folder}")
            return EXIT_HOST
    for run in runs:
        final = run.final or {}
        _say(f"{final.get('summary') or final.get('state') or run.lost}\nrun folder on {run.host.name}: "
             f"{run.folder}")
    if several:
        from gaudi_gui.core.multi_host import keep_job_meter
        whole = job_meter(runs)
        for line in job_meter_lines(runs, whole):
            _say(line)
        _say(keep_job_meter(runs[0].host, runs[0].folder, whole))  # runs show / list there: the whole job
    if failed:
        from gaudi_gui.core.multi_host import first_cause
        cause = failed[first_cause([why for _r, why in failed])][0]
        after = [r.host.name for r, _why in failed if r is not cause]
        _say(f"the run failed on {cause.host.name}" + (f" ({', '.join(after)} ended of it)" if after else ""))
        return 1
    states = {str((r.final or {}).get("state")) for r in runs}
    return 0 if states <= {"finished", "stopped"} else 1


def part_meter(run: HostRun) -> dict[str, Any] | None:
    """One host's part of the job: its run's meter summary (``runs show FOLDER --json`` there)."""
    if not run.folder:
        return None
    try:
        code, out, _err = remote.call(run.host, run.host.gaudi_gui_argv("runs", "show", run.folder, "--json"),
                                      timeout=60)
        shown = json.loads(out.strip().splitlines()[-1]) if code == 0 else None
    except (RemoteError, ValueError, IndexError):
        return None
    if not isinstance(shown, dict):
        return None
    from gaudi_gui.core import meter_files
    # Host 0's run once the whole job's meter is kept there: its own part is "meter_part".
    meter = shown.get("meter_part") or shown.get("meter")
    return meter if isinstance(meter, dict) and not meter_files.is_job_summary(meter) else None


def job_meter(runs: Sequence[HostRun]) -> dict[str, Any]:
    """The whole job's meter: every host's part asked at once, summed (``core.meter_account.combine``): the
    Gaudi compile meter of the host that compiled most, each host's compile warning named."""
    from gaudi_gui.core import meter_account
    with ThreadPoolExecutor(max_workers=max(1, len(runs))) as pool:
        summaries = list(pool.map(part_meter, runs))
    return meter_account.combine([(r.host.name, s) for r, s in zip(runs, summaries, strict=True)])


def job_meter_lines(runs: Sequence[HostRun], whole: dict[str, Any] | None = None) -> list[str]:
    """What the terminal is told of the whole job's meter: its line, then each host's compile warning."""
    from gaudi_gui.core import meter_words
    from gaudi_gui.core.compile_rise import findings, rise_text
    whole = job_meter(runs) if whole is None else whole
    return [f"meter: {meter_words.combined_line(whole)}", *(rise_text(f) for f in findings(whole))]


def _note(event: dict[str, Any], run: HostRun, several: bool) -> None:
    """What a terminal is told of a run's event: checkpoints and progress from machine rank 0 (of
    several hosts, a step line each), errors from every host."""
    kind = event.get("type")
    if kind == EventType.ERROR:
        _say((f"{run.host.name}: " if several else "") + note(event))
    elif run.rank == 0 and (kind in (EventType.CHECKPOINT_SAVING, EventType.CHECKPOINT_SAVED)
                            or (kind == EventType.METRICS and several)) and note(event):
        _say(note(event))
