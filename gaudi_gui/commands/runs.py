"""``gaudi-gui runs``: the run history of this machine, for a person and for a workstation over SSH.

- ``runs list [--json]``: every run, newest first, reconciled (a run whose supervisor died is
  brought to the state its events prove), with a short meter column (card-hours, kWh, or "energy not
  measured"; "–" for a run without a meter summary) and "meter" (the summary, or null) in the JSON.
- ``runs show RUN [--json]``: one run's status, summary and latest complete checkpoint, and its
  meter (``core.meter``: card-hours, energy and its source, power, utilization, memory; on Gaudi the
  compile meter), "meter" in the JSON (null for a run without one: older, or still running).
- ``runs follow RUN [--events-from N] [--log-from N]``: JSON lines as the run goes on:
  ``{"t": "event", "end": OFFSET, "event": {...}}``, ``{"t": "log", "end": OFFSET, "line": "..."}``,
  ``{"t": "status", "status": {...}}`` when it changes, and ``{"t": "end", "status": {...}, "meter":
  {...} | null}`` once the run has ended and its processes are gone (with its meter summary). The
  offsets let a follower that lost its connection go on exactly where it was. It ends itself when
  its stdin closes (over SSH nothing else tells it): when stdin is a pipe or a socket, and only after
  the history up to then has been printed; a follow with no stdin (``< /dev/null``: cron, ``nohup``,
  CI) prints the history and follows on, as ``tail -f``.
- ``runs attach RUN [--grace S]``: follow a Slurm run's job again (``commands/slurm_run.attach``),
  after the terminal or the app that submitted it went away; Ctrl-C stops it with a checkpoint.
- ``runs export RUN --tensorboard DIR``: the run's metrics and meter samples as TensorBoard event
  files under ``DIR/<run name>/`` (``core.export``); ``--trackio [--trackio-dir DIR] [--project NAME]``:
  the same into trackio's local storage (a run named after the run in project NAME, default
  "gaudi-gui"; exporting again replaces it), written by a child that imports trackio; where trackio is
  not installed it says so (exit 2).
- ``runs open RUN --tensorboard|--trackio [--no-browser]``: the run in TensorBoard's or trackio's own
  dashboard, served on 127.0.0.1 until the command ends (``commands/runs_open``, ``core.dashboard``).
- ``runs job-meter RUN`` (for a multi-host job's command and the Training tab): keeps the whole job's
  meter (``core.meter_account.combine`` of every host's part, a JSON object on stdin) in host 0's run, so that
  ``runs show`` / ``runs list`` there say the whole job; ``runs show --json`` then gives it as "meter"
  and the host's own part as "meter_part".
- ``runs --host DEST push RUN [--json]``: a run of this machine (an FP8 calibration: its manifest, configs
  and measurements) sent into a host's runs store; ``runs receive NAME`` is the host's side (a tar on
  stdin).
- ``runs --host DEST fetch RUN [--json]``: a run on a host brought into this machine's runs store, its
  records and its profile trace (``core.run_copy``; Training → Runs lists it and Profile… opens the
  trace here); ``runs pack RUN`` is the host's side of it (a tar on stdout).
- ``runs stop RUN [--now]``: a stop with a checkpoint (SIGTERM to the run's supervisor, which stops
  the ranks as the Training tab does); ``--now`` kills at once. A run whose supervisor is gone is
  stopped through its recorded rank pids directly.

RUN is a run folder or its name under the runs folder. Qt-free, torch-free.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import stat
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gaudi_gui.commands.terminal import seconds
from gaudi_gui.core import hpu_metrics, meter_files, meter_words
from gaudi_gui.core import prices as prices_mod
from gaudi_gui.core.events import EventFollower, LogFollower
from gaudi_gui.core.jobconfig import JobConfigError
from gaudi_gui.core.remote import Host
from gaudi_gui.core.runstore import FINAL_STATES, Run, RunStatus, RunStore
from gaudi_gui.core.secrets import redact
from gaudi_gui.core.stopper import KILL_NOW_SIGNAL

#: While lines keep coming, ``runs follow`` reads the run's files this often (a flood is read in
#: batches, not line by line). Once they stop it waits on the folder (core.filewatch: inotify) and wakes
#: when a file there is written: no look every 50 ms on the cores the run trains on (an idle follow
#: measured ~0.5% of a core polling). The app follows its runs on this machine through it too; the
#: status (a reconcile and a process check) is looked at once every ``STATUS_EVERY_S``, which is also
#: the heartbeat's period.
FOLLOW_POLL_S = 0.05
STATUS_EVERY_S = 1.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list, show, follow or stop training runs")
    p.add_argument("--runs-dir", default="", help="the runs folder (default: data folder)")
    action = p.add_subparsers(dest="runs_action", metavar="ACTION")
    action.required = True
    lst = action.add_parser("list", help="every run, newest first")
    lst.add_argument("--json", action="store_true")
    show = action.add_parser("show", help="one run")
    show.add_argument("run")
    show.add_argument("--json", action="store_true")
    show.add_argument("--price-kwh", dest="price_kwh", type=float, default=None, metavar="P",
                      help="price of a kWh for the run's cost (default: GAUDI_GUI_PRICE_KWH, else the app's "
                           "Prices setting; none set: no cost)")
    show.add_argument("--price-card-hour", dest="price_card_hour", type=float, default=None, metavar="P",
                      help="price of a card-hour (default: GAUDI_GUI_PRICE_CARD_HOUR, else the app setting)")
    show.add_argument("--currency", default=None, help="the prices' currency (default: GAUDI_GUI_CURRENCY, "
                      "else the app's setting)")
    follow = action.add_parser("follow", help="stream a run's events and log as JSON lines")
    follow.add_argument("run")
    follow.add_argument("--events-from", type=int, default=0)
    follow.add_argument("--log-from", type=int, default=0)
    attach = action.add_parser("attach", help="follow a Slurm run's job again (after the terminal or app "
                                "that submitted it went away); Ctrl-C stops it with a checkpoint")
    attach.add_argument("run")
    attach.add_argument("--grace", type=seconds, default=120.0, metavar="S",
                        help="seconds the ranks get to save after a stop before the job is cancelled")
    attach.add_argument("--events", action="store_true",
                        help="also print the job's progress as structured lines (for a program)")
    export = action.add_parser("export", help="write a run's metrics and meter for a tracker (TensorBoard)")
    export.add_argument("run")
    export.add_argument("--tensorboard", metavar="DIR", default="",
                        help="write TensorBoard event files under DIR/<run name>/ (tensorboard --logdir DIR)")
    export.add_argument("--trackio", action="store_true",
                        help="write to trackio's local storage (only where trackio is installed: not a "
                             "gaudi-gui dependency; pip install trackio)")
    export.add_argument("--trackio-dir", dest="trackio_dir", metavar="DIR", default="",
                        help="trackio's folder (default: TRACKIO_DIR, else ~/.cache/huggingface/trackio)")
    export.add_argument("--project", default="", metavar="NAME",
                        help="the trackio project (default: gaudi-gui)")
    from gaudi_gui.commands import runs_open
    runs_open.add_parser(action)
    job_meter = action.add_parser("job-meter", help="keep a multi-host job's meter (JSON on stdin) in its "
                                  "host 0's run")
    job_meter.add_argument("run")
    stop = action.add_parser("stop", help="stop a run (checkpoint first; --now kills)")
    stop.add_argument("run")
    stop.add_argument("--now", action="store_true", help="kill the run's processes now")
    pack = action.add_parser("pack", help="write a run's records and profile to stdout as a tar (what "
                                          "`runs --host DEST fetch RUN` reads over ssh)")
    pack.add_argument("run")
    fetch = action.add_parser("fetch", help="bring a run on a host (runs --host DEST fetch RUN) into this "
                                            "machine's runs store: its records and its profile trace")
    fetch.add_argument("run", help="the run's folder on the host, or its name in the host's runs store")
    fetch.add_argument("--json", action="store_true")
    push = action.add_parser("push", help="send a run of this machine (an FP8 calibration) into a host's "
                                          "runs store: runs --host DEST push RUN")
    push.add_argument("run", help="the run's folder here, or its name in this machine's runs store")
    push.add_argument("--json", action="store_true")
    receive = action.add_parser("receive", help="unpack a run sent by `runs --host DEST push RUN` (a tar on "
                                                "stdin) into this machine's runs store")
    receive.add_argument("name", help="the run's name (its folder's name where it was sent from)")
    receive.add_argument("--from", dest="came_from", default="", metavar="MACHINE",
                         help="the machine it was sent from")
    receive.add_argument("--folder", default="", help="its folder there")


def find_run(text: str, runs_dir: str = "") -> Run | None:
    path = Path(text).expanduser()
    run = Run(path) if path.is_absolute() or os.sep in text else Run(RunStore(runs_dir or None).root / text)
    return run if run.exists() else None


def describe(run: Run) -> dict[str, Any]:
    """One run as ``runs list/show`` print it; "problems": what is wrong with its files (a damaged
    run is listed with its damage, and never stops the listing of the others)."""
    problems = run.problems()
    try:
        status = run.reconcile()
        checkpoint = run.latest_checkpoint()
        alive = run.processes_alive() or run.supervisor() is not None
    except (OSError, ValueError, RecursionError) as exc:
        # The folder changed under us or holds something no reader expects: this run's problem.
        problems.append(f"cannot read the run: {exc}")
        status, checkpoint, alive = RunStatus(state="failed", summary="Damaged run"), None, False
    if problems and status.summary in ("", "Damaged run"):
        status.summary = f"Damaged run: {problems[0]}"
    out = {"name": run.name, "folder": str(run.folder), "kind": status.kind, "status": asdict(status),
           "checkpoint": str(checkpoint) if checkpoint else "", "alive": alive, "problems": problems}
    if status.kind == "serve":
        from gaudi_gui.core import jobkind
        out["endpoint"] = jobkind.endpoint(run)  # url, port, engine pid, model ({} before it answered)
    with contextlib.suppress(JobConfigError):
        job = run.user_job()
        out["model"] = job.model
        out["job_name"] = job.name
    return out


def _line(item: dict[str, Any]) -> str:
    status = item["status"]
    text = (f"{item['name']}  {status.get('kind', 'training'):<8}  {status['state']:<8}  "
            f"step {status['step']}/{status['max_steps']}  "
            f"{meter_words.short(item.get('meter')):<28}  {status['summary']}")
    problems = [p for p in item.get("problems", []) if p not in status["summary"]]
    return text + (f"  ⚠ {'; '.join(problems)}" if problems else "")


def run(args: argparse.Namespace) -> int:
    action = args.runs_action
    if action == "list":
        runs = [{**describe(r), "meter": meter_files.read_job_summary(r.folder)}
                for r in RunStore(args.runs_dir or None).runs()]
        if args.json:
            print(json.dumps(runs), flush=True)
        else:
            for item in runs:
                print(_line(item))
        return 0
    if action == "fetch":
        print("gaudi-gui runs fetch: name the host the run is on: gaudi-gui runs --host DEST fetch RUN",
              file=sys.stderr)
        return 2
    if action == "push":
        print("gaudi-gui runs push: name the host to send it to: gaudi-gui runs --host DEST push RUN",
              file=sys.stderr)
        return 2
    if action == "receive":
        return _receive(args)
    found = find_run(args.run, args.runs_dir)
    if found is None:
        print(f"gaudi-gui runs: no run {args.run!r} (a run folder, or a name from `gaudi-gui runs list`)",
              file=sys.stderr)
        return 2
    if action == "show":
        item = describe(found)
        # Host 0's run of a multi-host job: the whole job's meter, and this host's own part beside it.
        item["meter"] = meter_files.read_job_summary(found.folder)
        own = meter_files.read_summary(found.folder)
        if own is not None and own != item["meter"]:
            item["meter_part"] = own
        prices = prices_mod.current(per_kwh=args.price_kwh, per_card_hour=args.price_card_hour,
                                    currency=args.currency)
        item["cost"] = prices_mod.cost(item["meter"], prices)  # null: no price set, or no meter
        cost_line = prices_mod.cost_text(item["meter"], prices)
        from gaudi_gui.core import profile as profile_mod
        profiled = profile_mod.read(found.folder)
        if profiled is not None:
            item["profile"] = profiled
        profile_lines = "".join(f"\n  {redact(line)}" for line in profile_mod.describe(profiled)) \
            if profiled is not None else ""
        live = _meter_so_far(found) if item["meter"] is None else None
        if live is not None:
            item["meter_so_far"] = live
        problems = [p for p in item["problems"] if p not in item["status"]["summary"]]
        print(json.dumps(item) if args.json else
              f"{item['name']} ({item['kind']}): {item['status']['state']} — {item['status']['summary']}"
              + (f" (⚠ {'; '.join(problems)})" if problems else "") + _meter_lines(item["meter"])
              + (f"\n  this host's part: {redact(meter_words.describe(item['meter_part']))}"
                 if item.get("meter_part") else "")
              + (f"\n  {cost_line}" if cost_line else "") + profile_lines
              + (f"\n  meter so far: {live['text']}" if live else ""),
              flush=True)
        return 0
    if action == "stop":
        return _stop(found, now=args.now)
    if action == "pack":
        if sys.stdout.isatty():
            print("gaudi-gui runs pack: it writes a tar to stdout: redirect it to a file or a pipe",
                  file=sys.stderr)
            return 2
        from gaudi_gui.core import run_copy
        run_copy.pack(found.folder, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return 0
    if action == "job-meter":
        return _keep_job_meter(found)
    if action == "export":
        return _export(found, args.tensorboard, trackio=args.trackio, trackio_dir=args.trackio_dir,
                       project=args.project)
    if action == "open":
        from gaudi_gui.commands import runs_open
        return runs_open.run(found, args, lambda text: find_run(text, args.runs_dir))
    if action == "attach":
        from gaudi_gui.commands import slurm_run
        return slurm_run.attach(found, grace=args.grace, events=args.events)
    return _follow(found, args.events_from, args.log_from)


def _receive(args: argparse.Namespace) -> int:
    """``runs receive NAME``: the host's side of ``push`` (a tar on stdin into the runs store; one JSON
    line: the folder)."""
    if sys.stdin.isatty():
        print("gaudi-gui runs receive: it reads a packed run on stdin (what `runs --host DEST push RUN` "
              "sends)", file=sys.stderr)
        return 2
    from gaudi_gui.core import run_copy
    try:
        folder = run_copy.receive(sys.stdin.buffer, RunStore(args.runs_dir or None).root, args.name,
                                  came_from=args.came_from or "elsewhere", folder=args.folder)
    except run_copy.FetchError as exc:
        print(f"gaudi-gui runs receive: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"folder": str(folder), "name": folder.name, "renamed": folder.name != args.name}),
          flush=True)
    return 0


def push_to(host: Host, args: argparse.Namespace) -> int:
    """``runs --host DEST push RUN``: this machine's run into the host's runs store (core.run_copy);
    exit 2 for no such run here, 1 when it could not be sent (one line: why)."""
    found = find_run(args.run, args.runs_dir)
    if found is None:
        print(f"gaudi-gui runs push: no run {args.run!r} here (a run folder, or a name from `gaudi-gui runs "
              "list`)", file=sys.stderr)
        return 2
    from gaudi_gui.core import run_copy
    try:
        answer = run_copy.push(host, found.folder)
    except run_copy.FetchError as exc:
        print(f"gaudi-gui runs push: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({**answer, "host": host.name}) if getattr(args, "json", False)
          else run_copy.describe_pushed(host, answer), flush=True)
    return 0


def fetch_from(host: Host, args: argparse.Namespace) -> int:
    """``runs --host DEST fetch RUN``: the host's run, with its profile trace, into this machine's runs
    store (core.run_copy); exit 1 when it could not be brought (one line: why)."""
    from gaudi_gui.core import run_copy
    try:
        folder = run_copy.fetch(host, args.run, RunStore(args.runs_dir or None).root)
    except run_copy.FetchError as exc:
        print(f"gaudi-gui runs fetch: {exc}", file=sys.stderr)
        return 1
    from gaudi_gui.core import profile as profile_mod
    traces = profile_mod.trace_files(folder)
    print(json.dumps({"folder": str(folder), "host": host.name, "remote_folder": args.run,
                      "trace": str(traces[-1]) if traces else ""})
          if getattr(args, "json", False) else run_copy.describe_fetched(folder), flush=True)
    return 0


def _keep_job_meter(run_: Run) -> int:
    """``runs job-meter RUN``: the whole job's meter from stdin into host 0's run (exit 2: not one)."""
    try:
        data = json.loads(sys.stdin.read(1 << 22))
        path = meter_files.keep_job_summary(run_.folder, data)
    except (ValueError, RecursionError) as exc:
        print(f"gaudi-gui runs job-meter: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gaudi-gui runs job-meter: cannot write it in {run_.folder}: {exc}", file=sys.stderr)
        return 1
    print(f"kept the whole job's meter in {path}", flush=True)
    return 0


def _meter_so_far(run_: Run) -> dict[str, Any] | None:
    """A run without a meter summary yet (still running): its meter.jsonl so far (power now, energy
    and card-hours so far), or None when it has none."""
    reader = meter_files.LiveReader(run_.folder, started_t=run_.status().started_at or None)
    while reader.read():
        pass
    return reader.reading(time.time())


def _meter_lines(summary: dict[str, Any] | None) -> str:
    """The meter's lines under ``runs show``'s first line ("" when the run has no meter summary)."""
    if not summary:
        return ""
    text = f"\n  meter: {redact(meter_words.describe(summary))}"
    compiled = summary.get("compile")
    if isinstance(compiled, dict) and "compilations" in compiled:
        # A job of several parts (hosts, Slurm nodes): the part that compiled most sets the pace.
        where = f" ({compiled['part']}, the part that compiled most)" if compiled.get("part") else ""
        text += f"\n  compile meter{where}: {redact(hpu_metrics.describe(compiled))}"
    from gaudi_gui.core.compile_rise import findings, rise_text
    for finding in findings(summary):
        text += f"\n  {redact(rise_text(finding))}"
    return text


def _export(run_: Run, tensorboard: str, *, trackio: bool, trackio_dir: str = "", project: str = "") -> int:
    """``runs export``: TensorBoard event files and/or trackio's local storage (exit 2: a usage problem
    or trackio missing; 1: the export failed)."""
    from gaudi_gui.core import export
    if not tensorboard and not trackio:
        print("gaudi-gui runs export: say where: --tensorboard DIR and/or --trackio", file=sys.stderr)
        return 2
    if not trackio and (trackio_dir or project):
        print("gaudi-gui runs export: --trackio-dir and --project are for --trackio", file=sys.stderr)
        return 2
    if trackio:
        why = export.trackio_state() or export.trackio_project_problem(project or export.TRACKIO_PROJECT)
        if why:
            print(f"gaudi-gui runs export: {why}", file=sys.stderr)
            return 2
    if tensorboard:
        try:
            print(export.describe(export.export_tensorboard(run_, tensorboard)), flush=True)
        except export.ExportError as exc:
            print(f"gaudi-gui runs export: {exc}", file=sys.stderr)
            return 1
    if trackio:
        folder = Path(trackio_dir).expanduser() if trackio_dir else export.default_trackio_dir()
        try:
            result = export.export_trackio(run_, folder, project or export.TRACKIO_PROJECT)
        except export.ExportError as exc:
            print(f"gaudi-gui runs export: {exc}", file=sys.stderr)
            return 1
        print(export.describe(result), flush=True)
    return 0


def _stop(run_: Run, *, now: bool) -> int:
    supervisor = run_.supervisor()
    if supervisor is not None:
        supervisor.signal(KILL_NOW_SIGNAL if now else signal.SIGTERM)
        from gaudi_gui.core.jobkind import stop_words
        # Said for the job's own kind: a server or an evaluation saves no checkpoint.
        print("kill requested" if now else f"stop requested: {stop_words(run_.kind)}", flush=True)
        return 0
    from gaudi_gui.core.stopper import Stopper
    stopper = Stopper(run_, run_.status().launcher)
    if now:
        stopper.kill_now("request")
        print("killed", flush=True)
    elif any(r.is_alive() for r in run_.rank_refs()):
        print(stopper.request(), flush=True)
    else:
        print("the run is not running", flush=True)
    return 0


def _emit(obj: dict[str, Any], *more: dict[str, Any]) -> None:
    """JSON lines in one write and one flush (a poll's lines together: at thousands of log lines a
    second, a flush per line costs the follower more CPU than everything else it does)."""
    sys.stdout.write("".join(json.dumps(o) + "\n" for o in (obj, *more)))
    sys.stdout.flush()


def stdin_hangs_up() -> bool:
    """Whether stdin's end can mean "the reader went away": a pipe or a socket (the app's follower,
    ssh's remote command). /dev/null, a file or a terminal are at their end (or end) without anyone
    leaving: cron, ``nohup``, CI. (``ssh -n HOST gaudi-gui runs follow RUN`` gives the remote command
    a pipe closed at once: it prints the history up to then and ends, saying so on stderr.)"""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _follow(run_: Run, events_from: int, log_from: int) -> int:
    """Print the run's history, then its new events and lines until it ends. A closed stdin ends the
    follow (the protocol of the app and of a follow over ssh, where nothing else tells it that its
    reader is gone), but only when stdin is a pipe or a socket, and only once the whole history up to
    now has been printed: a caller with no stdin (``< /dev/null``) never gets an empty answer."""
    closed = threading.Event()

    def watch_stdin() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        closed.set()

    if stdin_hangs_up():
        threading.Thread(target=watch_stdin, name="stdin", daemon=True).start()
    from gaudi_gui.core.filewatch import FolderWatch
    watch = FolderWatch(run_.folder, cap_s=STATUS_EVERY_S / 2, fallback_s=FOLLOW_POLL_S)
    follower = EventFollower(run_.events_path, offset=max(0, events_from))
    log = LogFollower(run_.log_path, offset=max(0, log_from))
    last_status: dict[str, Any] | None = None
    next_status = 0.0
    caught_up = False  # the history up to now printed: from then on a closed stdin ends the follow

    def pump() -> bool:
        """Print the events and log lines written since the last call; whether there were any."""
        events = follower.read()
        # Offsets are per event: a follower cut mid-batch resumes after the last one it got.
        end = follower.offset - len(follower._partial)
        if events:
            _emit(*({"t": "event", "event": event, **({"end": end} if i == len(events) - 1 else {})}
                    for i, event in enumerate(events)))
        read_from = log.offset
        lines = [{"t": "log", "line": redact(text)} for text in log.read(1 << 20)]
        if log.offset != read_from:
            _emit(*lines, {"t": "log_offset", "end": log.end})
        return bool(events) or log.offset != read_from

    try:
        while not (caught_up and closed.is_set()):
            quiet = not pump()
            now = time.monotonic()
            # The first quiet poll (the history is out) reads the status at once: a finished run's
            # follow ended up to STATUS_EVERY_S after its last line, every time it was asked.
            if now >= next_status or (quiet and not caught_up):
                next_status = now + STATUS_EVERY_S
                status = asdict(run_.reconcile())
                alive = run_.processes_alive() or run_.supervisor() is not None
                if status != last_status:
                    last_status = status
                    _emit({"t": "status", "status": status})
                if status["state"] in FINAL_STATES and not alive:
                    # Every line and event was written before the final status, but maybe after
                    # this turn's read (a busy machine can pause this process between the two):
                    # read to the end once more, now that nothing writes, and only then say "end".
                    while pump():
                        pass
                    # The supervisor has gone: its meter summary is written (None: no meter).
                    _emit({"t": "end", "status": status, "meter": meter_files.read_summary(run_.folder)})
                    return 0
                if quiet:
                    _emit({"t": "alive"})  # a heartbeat: the follower sees a dead link within seconds
            if quiet:
                caught_up = True
                # Nothing new: sleep until a file of the run is written (or the next status look).
                watch.wait(max(0.0, next_status - time.monotonic()))
            else:
                time.sleep(FOLLOW_POLL_S)
    except BrokenPipeError:
        return 0
    finally:
        watch.close()
    with contextlib.suppress(OSError):
        print("gaudi-gui runs follow: stdin closed: stopped following (the run goes on)", file=sys.stderr,
              flush=True)
    return 0
