"""``gaudi-gui train --config FILE --slurm [--nodes N --partition P --time T --account A …]``.

The job becomes an sbatch script (``core/slurm.py``: one task per node, each running accelerate's
multi-node launch), saved in the run folder as slurm.sh and submitted with ``sbatch`` on this machine or
on a login host over SSH (``--login HOST``: sbatch, squeue, scontrol, sacct and scancel run there as
argv lists, never as user text in a shell). The run folder must be on the file system the login host
and the nodes share, at the same path (``--runs-dir``): the console (log.txt) and the events come from
there. ``--print-script`` shows the script and submits nothing.

Then the run follows the job: pending / running / ended from squeue (scontrol for the exit status,
sacct once the controller has forgotten the job), the log and the events from the folder. Ctrl-C (or
SIGTERM / SIGHUP) stops with a checkpoint: ``scancel --batch --signal=USR1`` lets the batch shell ask
each node's ranks to save at the end of their step; a job still pending, or whose ranks have not
started, is simply cancelled. A second Ctrl-C, or the grace period running out, cancels the job (no
checkpoint). Exit status: 0 finished or stopped, 1 failed / killed / not submitted, 2 bad input.

The command that follows the job is the run's supervisor (``supervisor.json``, what ``runs stop`` and
the agent's ``job.stop`` signal): SIGTERM is the stop with a checkpoint, ``core.stopper.KILL_NOW_SIGNAL``
cancels at once. ``--detach`` (``--json``) starts this command again in a session of its own (as every
kind's ``--detach`` does, ``commands/detach.py``): it submits, announces the run folder, pid and job id
once sbatch took the job (a refusal is one line on stderr and a non-zero exit), then follows the job to
its end and writes the outcome. ``runs attach`` of a run whose supervisor still lives only follows it
(stops go to that supervisor); of one whose supervisor is gone, it becomes the supervisor.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from typing import Any

from gaudi_gui.commands.terminal import StopSignals as _Signals
from gaudi_gui.commands.terminal import printable as _printable
from gaudi_gui.commands.terminal import say as _say
from gaudi_gui.core import prepare as prepare_mod
from gaudi_gui.core import protocol, remote
from gaudi_gui.core import slurm as slurm_mod
from gaudi_gui.core.events import EventFollower, EventType, LogFollower
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError, load_job
from gaudi_gui.core.outcome import outcome_from_events
from gaudi_gui.core.proctree import ProcessRef
from gaudi_gui.core.progress import RunProgress, note
from gaudi_gui.core.remote import Host, HostError, RemoteError
from gaudi_gui.core.runstore import FINAL_STATES, Run, RunStatus, RunStore
from gaudi_gui.core.secrets import redact
from gaudi_gui.core.stopper import KILL_NOW_SIGNAL

#: Seconds between two squeue polls.
POLL_S = 1.0
#: Seconds between two writes of the run's step into its status while the job trains.
STEP_WRITE_S = 2.0
#: The signals the command that follows a job counts as stop requests (KILL_NOW_SIGNAL: cancel now).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, KILL_NOW_SIGNAL)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The --slurm options of ``gaudi-gui train``."""
    g = p.add_argument_group("Slurm (with --slurm)")
    g.add_argument("--slurm", action="store_true",
                   help="submit the job to Slurm with sbatch (one task per node running accelerate launch) "
                        "and follow it; the run folder must be on the file system the nodes share")
    g.add_argument("--nodes", type=int, default=1, metavar="N",
                   help="nodes (machines) for the job (default 1)")
    g.add_argument("--partition", default="", metavar="P", help="Slurm partition")
    g.add_argument("--time", default="", metavar="T", help="time limit (minutes, HH:MM:SS or D-HH:MM:SS); a "
                   "checkpoint stop is asked for --grace seconds before it")
    g.add_argument("--account", default="", metavar="A", help="Slurm account to charge")
    g.add_argument("--cards-per-node", dest="cards_per_node", type=int, default=0, metavar="N",
                   help="cards (processes) per node (default: the job's number of processes)")
    g.add_argument("--gres", default="", metavar="SPEC",
                   help="generic resources per node as the cluster names them (default for cuda: gpu:N)")
    g.add_argument("--login", default="", metavar="HOST",
                   help="submit and watch on this login host over SSH (default: this machine)")
    g.add_argument("--node-python", dest="node_python", default="", metavar="PATH",
                   help="the Python with gaudi-gui on the nodes (default: this one)")
    g.add_argument("--print-script", dest="print_script", action="store_true",
                   help="print the sbatch script and exit without submitting")
    g.add_argument("--events", action="store_true",
                   help="also print the job's progress as structured lines (@gaudi-gui {json}: submitted, "
                        "run folder, Slurm state) for a program that follows it")


#: Whether structured lines go to stdout beside the words (``--events``; the app sets it).
_EVENTS = {"on": False}


def _event(kind: str, **fields: Any) -> None:
    """One structured line for a program following the job (with ``--events``), never for a person."""
    if _EVENTS["on"]:
        protocol.write_line(sys.stdout, protocol.event(kind, **fields))


def runner_for(host: Host) -> slurm_mod.Runner:
    """Runs a Slurm command on ``host``: (exit code, stdout, stderr); a missing program or an
    unreachable host is an exit code 127 / 255 with the reason on stderr, never an exception."""
    def run(argv: list[str]) -> tuple[int, str, str]:
        if host.is_local:
            try:
                done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=60,
                                      stdin=subprocess.DEVNULL, check=False)
            except FileNotFoundError:
                return 127, "", f"{argv[0]} is not installed on this machine (is this a Slurm login node?)"
            except subprocess.TimeoutExpired:
                return 124, "", f"{argv[0]} did not answer within 60 s"
            return done.returncode, done.stdout, done.stderr
        try:
            return remote.call(host, argv, timeout=60)
        except RemoteError as exc:
            return 255, "", str(exc)
    return run


def options_from(args: argparse.Namespace, device: str) -> slurm_mod.SlurmOptions:
    return slurm_mod.SlurmOptions(
        nodes=args.nodes, partition=args.partition.strip(), time=args.time.strip(),
        account=args.account.strip(),
        cards_per_node=args.cards_per_node, gres=args.gres.strip(), device=device,
        python=args.node_python.strip(), stop_before_limit_s=int(args.grace),
        preflight=not getattr(args, "no_preflight", False))


def train(args: argparse.Namespace) -> int:
    _EVENTS["on"] = bool(getattr(args, "events", False))
    announce_path = str(getattr(args, "announce", "") or "")
    try:
        job = load_job(args.config)
    except JobConfigError as exc:
        _say(f"gaudi-gui train: {exc}")
        return 2
    from gaudi_gui.commands.profile_flag import apply_profile_steps
    apply_profile_steps(job, args)
    device = args.device
    if device == "auto" and args.login.strip():
        # This machine's cards say nothing of the nodes'.
        _say("gaudi-gui train: with --login, name the nodes' device (--device hpu / cuda / cpu)")
        return 2
    if device == "auto":
        device = prepare_mod.probe_device()
    options = options_from(args, device)
    problems = options.validate()
    part = slurm_mod.slurm_job(job, options)
    problems += part.validate()
    if problems:
        for name, problem in problems:
            _say(f"gaudi-gui train: {name}: {problem}")
        return 2
    store = RunStore(args.runs_dir or None)
    if args.print_script:
        # Nothing is created: the folder is where the run would go ("<run>" in its name).
        print(slurm_mod.sbatch_script(part, store.root / "<run>", options), end="", flush=True)
        return 0
    try:
        host = remote.find_host(args.login) if args.login.strip() else Host.local()
    except HostError as exc:
        _say(f"gaudi-gui train: --login: {exc}")
        return 2
    if getattr(args, "detach", False):
        return _detach(job, args, device)
    try:
        # The nodes' launch sets its own compile meter (each node's part): none in the run folder.
        prepared = prepare_mod.prepare_run(part, device=device, store=store,
                                           origin=getattr(args, "origin", "cli"),
                                           resumed_from=getattr(args, "resumed_from", ""),
                                           python=options.python or None, compile_meter_here=False)
    except prepare_mod.PrepareError as exc:
        _say(f"gaudi-gui train: {exc}")
        return 2
    except OSError as exc:
        _say(f"gaudi-gui train: cannot create the run folder: {exc.strerror or exc}")
        return 1
    run = prepared.run
    # From here a stop signal is counted, not a KeyboardInterrupt: one that comes while sbatch runs
    # (a window that would leave a job nobody follows) is acted on as soon as the job is followed.
    signals = _Signals()
    previous = {s: signal.signal(s, signals.handler) for s in STOP_SIGNALS}
    try:
        # This command is the run's supervisor from its first moment: the only writer of its status,
        # what `runs stop` and the agent's job.stop signal.
        with contextlib.suppress(OSError):
            run.write_supervisor(folder=str(run.folder), name=run.name, device=device)
        script = slurm_mod.sbatch_script(prepared.job, run.folder, options)
        # env.json: what the nodes use (the script's exports; each node records what it adds itself).
        slurm_mod.record_env(prepared.job, run.folder, options)
        script_path = run.folder / slurm_mod.SCRIPT_NAME
        fd = os.open(script_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o700)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(script)
        # command.txt / command.json: the sbatch line, the script's step and each node's task.
        slurm_mod.record_command(prepared.job, run.folder, options, script_path, login=host.name)
        run_cmd = runner_for(host)
        code, out, err = run_cmd(slurm_mod.sbatch_argv(script_path))
        try:
            job_id = slurm_mod.parse_sbatch(out) if code == 0 else ""
        except ValueError as exc:
            err, job_id = str(exc), ""
        if not job_id:
            why = (err.strip() or out.strip() or f"exit {code}")[-500:]
            # runner_for: 255 is ssh's own failure (the reason is in err), not sbatch's answer.
            what = (f"the login host {host.name} could not be reached" if code == 255 and not host.is_local
                    else "sbatch refused the job")
            run.update_status(state="failed", ended_at=time.time(), summary=f"Failed: {what}: {why}")
            if announce_path:
                # --detach waits for this child: its refusal is one line (sbatch's own may be several).
                _say(f"gaudi-gui train: {what}: {_one_line(why)} (script: {script_path})")
            else:
                _say(f"gaudi-gui train: {what}: {why}\nscript: {script_path}")
            return 1
        slurm_mod.write_info(run, {"job_id": job_id, "login": host.name, "script": str(script_path),
                          "options": dataclasses.asdict(options)})
        run.update_status(summary=f"Slurm job {job_id} submitted")
        where = "" if host.is_local else f" on {host.name}"
        if announce_path:
            # The waiting --detach learns the run (and its job); from here this process's own notes go
            # to the folder's supervisor.log, the job's console is Slurm's log.txt.
            from gaudi_gui.commands.detach import announce
            announce(run, announce_path, device=device, job_id=job_id, login=host.name)
            _say(f"submitted batch job {job_id}{where}; script: {script_path}")
        else:
            print(f"submitted batch job {job_id}{where}", flush=True)
            _event("slurm_submitted", job_id=job_id, login=host.name)
            print(f"run folder: {run.folder} (device {device}, {options.nodes} node(s)); script: "
                  f"{script_path}", flush=True)
            _event("slurm_run_folder", folder=str(run.folder), device=device, nodes=options.nodes)
        return follow(run, job_id, run_cmd, grace=args.grace, signals=signals, echo=not announce_path)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


# -- --detach: the same command as a supervisor in a session of its own ---------------------------------


def _detach(job: JobConfig, args: argparse.Namespace, device: str) -> int:
    """Start this command again in a session of its own (``commands/detach.py``): it submits the job
    and announces the run once sbatch took it, then follows the job to its end. Prints the announce
    ({folder, pid, name, job_id, login, device} as JSON with ``--json``) and returns."""
    from gaudi_gui.commands import detach
    info = detach.detach("train", args.runs_dir,
                         lambda path, announce_path: detached_argv(args, device, path, announce_path),
                         job.to_dict())
    if isinstance(info, int):
        return info
    if args.json:
        detach.print_started(info, "run", as_json=True)
    else:
        where = "" if info.get("login") in ("", remote.LOCAL, None) else f" on {info['login']}"
        print(f"submitted batch job {info.get('job_id')}{where}; run folder: {info['folder']} (detached, "
              f"supervisor pid {info['pid']}); follow: gaudi-gui runs follow {info['name']}; stop: gaudi-gui "
              f"runs stop {info['name']}", flush=True)
    return 0


def detached_argv(args: argparse.Namespace, device: str, config_path: str, announce_path: str) -> list[str]:
    """The background supervisor's command: ``train --slurm`` again on the saved job, with every
    option that shapes the job (``--opt=value``: a value that begins with '-' stays a value)."""
    argv = [sys.executable, "-m", "gaudi_gui", "train", "--config", config_path, "--slurm",
            f"--device={device}", f"--grace={float(args.grace)!r}", f"--nodes={int(args.nodes)}",
            "--announce", announce_path]
    for flag, value in (("--partition", args.partition), ("--time", args.time), ("--account", args.account),
                        ("--gres", args.gres), ("--login", args.login), ("--node-python", args.node_python),
                        ("--runs-dir", args.runs_dir),
                        ("--resumed-from", getattr(args, "resumed_from", "") or "")):
        if str(value).strip():
            argv.append(f"{flag}={value}")
    if args.cards_per_node:
        argv.append(f"--cards-per-node={int(args.cards_per_node)}")
    if getattr(args, "no_preflight", False):
        argv.append("--no-preflight")
    if getattr(args, "origin", "cli") != "cli":
        argv.append(f"--origin={args.origin}")
    return argv


def attach(run: Run, *, grace: float, events: bool = False) -> int:
    """Follow a submitted job again (``gaudi-gui runs attach RUN``): after the terminal or the app
    that submitted it went away, the job goes on in Slurm; this follows it from the start of its log
    and events to its end, and Ctrl-C stops it as ``train --slurm`` would. A job that ended while
    nobody followed it gets its outcome written at once. While the run's supervisor still lives (a
    detached ``train --slurm``, the agent's job) this only follows: a stop goes to that supervisor,
    which stays the one writer of the status; should it die before the end, this takes over."""
    try:
        info = slurm_mod.read_info(run)
        login = str(info.get("login") or remote.LOCAL)
        host = Host.local() if login == remote.LOCAL else remote.find_host(login)
    except (ValueError, HostError) as exc:
        _say(f"gaudi-gui runs attach: {exc}")
        return 2
    job_id = str(info["job_id"]).strip()
    status = run.status()
    if status.state not in ("queued", "running", "stopping"):
        _say(f"{run.name}: Slurm job {job_id} already ended: {status.state} — {status.summary}")
        return 0 if status.state in ("finished", "stopped") else 1
    where = "" if host.is_local else f" on {host.name}"
    _EVENTS["on"] = events
    print(f"submitted batch job {job_id}{where} (followed again)", flush=True)
    _event("slurm_submitted", job_id=job_id, login=host.name)
    options = slurm_mod.options_of(info)
    print(f"run folder: {run.folder} (device {options.device}, {options.nodes} node(s))", flush=True)
    _event("slurm_run_folder", folder=str(run.folder), device=options.device, nodes=options.nodes)
    owner = run.supervisor()
    if owner is not None and owner.pid == os.getpid():
        owner = None
    if owner is not None:
        _say(f"the job's supervisor (pid {owner.pid}) follows it too: a stop here goes to it")
    return follow(run, job_id, runner_for(host), grace=grace, owner=owner)


def _printed_lines(log: LogFollower) -> list[str]:
    """The job's new console lines worth printing (a MiB at a time; blank ones left out)."""
    return [line for line in log.read(1 << 20) if line.strip()]


def _note(event: dict[str, Any]) -> None:
    if event.get("type") in (EventType.CHECKPOINT_SAVED, EventType.ERROR):
        _say(note(event))


def follow(run: Run, job_id: str, run_cmd: slurm_mod.Runner, *, grace: float,
           signals: _Signals | None = None, echo: bool = True, owner: ProcessRef | None = None) -> int:
    """Follow the job to its end; the command's exit status. ``signals``: the stop signals counted
    so far (one that came while sbatch ran is acted on at the first turn). ``echo``: print the job's
    console lines (a detached supervisor has nobody to print them to). ``owner``: the run's live
    supervisor, when it is another process: then this only follows, hands each stop request on to it
    (the first as SIGTERM, a second or ``KILL_NOW_SIGNAL`` as kill now), and reads how the run ended
    from its status; if the owner dies before the end, this becomes the supervisor."""
    query = slurm_mod.Query(run_cmd)
    own = signals is None
    signals = signals or _Signals()
    previous = {s: signal.signal(s, signals.handler) for s in STOP_SIGNALS} if own else {}
    if owner is None and own:
        with contextlib.suppress(OSError):
            run.write_supervisor(folder=str(run.folder), name=run.name)
    log = LogFollower(run.log_path)
    follower = EventFollower(run.events_path)
    events: list[dict[str, Any]] = []
    progress = RunProgress(step=run.status().step, max_steps=run.status().max_steps)
    step_written_at = -STEP_WRITE_S
    handled = 0
    forwarded = 0
    stop_at = 0.0
    stop_mode = ""  # "checkpoint" (the ranks save) or "cancel" (nothing to save yet)
    killed = False
    kill_reason = ""
    info: slurm_mod.JobInfo | None = None
    phase = ""
    next_poll = 0.0
    unknown_since = 0.0
    last_note = 0.0
    try:
        while True:
            if echo:
                for line in _printed_lines(log):
                    with contextlib.suppress(BrokenPipeError):
                        print(_printable(redact(line)), flush=True)
            for event in follower.read():
                events.append(event)
                _note(event)
                if progress.apply(event) is not None and owner is None \
                        and time.monotonic() - step_written_at >= STEP_WRITE_S:
                    step_written_at = time.monotonic()
                    with contextlib.suppress(OSError):  # a full disk must not end the following
                        run.update_status(step=progress.step, max_steps=progress.max_steps)
            now = time.monotonic()
            if owner is not None and not owner.is_alive():
                if run.status().state in FINAL_STATES:
                    break  # the supervisor wrote how the run ended
                _say(f"the job's supervisor (pid {owner.pid}) is gone: following job {job_id} here")
                owner = None
                with contextlib.suppress(OSError):
                    run.write_supervisor(folder=str(run.folder), name=run.name)
                phase, handled = "", signals.count  # its state is written again; its stops were its own
            if now >= next_poll:
                next_poll = now + POLL_S
                found = query(job_id)
                if found is None:
                    unknown_since = unknown_since or now
                    if now - unknown_since > 60 and owner is None:
                        _say(f"Slurm does not know job {job_id} any more: {'; '.join(query.errors)}")
                        break
                else:
                    unknown_since = 0.0
                    info = found
                    if info.phase != phase:
                        phase = info.phase
                        _report(run, info, write=owner is None)
                    if phase == "ended" and owner is None:
                        break
            if owner is not None:
                while signals.count > forwarded:
                    forwarded += 1
                    now_kill = forwarded > 1 or signals.last == KILL_NOW_SIGNAL.name
                    owner.signal(KILL_NOW_SIGNAL if now_kill else signal.SIGTERM)
                    _say(f"{signals.last}: " + ("kill requested of the job's supervisor" if now_kill
                                                else "stop requested of the job's supervisor (the ranks "
                                                     "save a checkpoint); again: cancel now"))
                handled = signals.count
            elif signals.count > handled:
                handled = signals.count
                if signals.last == KILL_NOW_SIGNAL.name and not killed:
                    # `runs stop --now`, the agent's job.stop now: cancel, no checkpoint from this stop.
                    _say(f"kill requested: cancelling job {job_id} now (scancel; no checkpoint is asked for)")
                    stop_mode = stop_mode or "cancel"
                    killed, kill_reason = True, "request"
                    _cancel(job_id, run_cmd)
                elif not stop_mode:
                    # Signals that arrive together (a terminal's and a wrapper's) are one stop.
                    stop_at = now
                    stop_mode = _stop(run, job_id, run_cmd, phase, name=signals.last, grace=grace)
                elif not killed:
                    _say(f"{signals.last} again: cancelling job {job_id} now (no checkpoint from this stop)")
                    killed, kill_reason = True, "request"
                    _cancel(job_id, run_cmd)
            if stop_at and not killed and stop_mode == "checkpoint" and owner is None:
                if now - stop_at > grace:
                    _say(f"the job did not end within {grace:g} s of the stop: cancelling it")
                    killed, kill_reason = True, "grace"
                    _cancel(job_id, run_cmd)
                elif now - last_note >= 5:
                    last_note = now
                    _say(f"waiting for the ranks to save and end… {now - stop_at:.0f} s")
            time.sleep(0.2)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if echo:
        for line in _printed_lines(log):
            with contextlib.suppress(BrokenPipeError):
                print(_printable(redact(line)), flush=True)
    events += follower.read()
    if owner is not None:
        # Followed only: the supervisor wrote the outcome.
        status = run.status()
        return _said_end(run, status.state, status.summary)
    return _finish(run, job_id, info, events, stop_requested=bool(stop_mode),
                   before_training=stop_mode == "cancel", killed=killed, kill_reason=kill_reason)


def _report(run: Run, info: slurm_mod.JobInfo, *, write: bool = True) -> None:
    _event("slurm_state", job_id=info.job_id, phase=info.phase, state=info.state, reason=info.reason,
           nodes=info.nodes)
    if info.phase == "pending":
        _say(f"job {info.job_id}: pending" + (f" ({info.reason})" if info.reason else ""))
    elif info.phase == "running":
        _say(f"job {info.job_id}: running on {info.nodes or '?'}")
        if write and run.status().state != "running":
            run.update_status(state="running", started_at=time.time())
    else:
        _say(f"job {info.job_id}: {info.state.lower()}")


def _cancel(job_id: str, run_cmd: slurm_mod.Runner) -> None:
    code, _out, err = run_cmd(slurm_mod.scancel_argv(job_id, stop=False))
    if code != 0:
        _say(f"scancel {job_id} failed: {err.strip() or code}")


def _stop(run: Run, job_id: str, run_cmd: slurm_mod.Runner, phase: str, *, name: str, grace: float) -> str:
    """Ask the job to stop: "checkpoint" when ranks are training, else "cancel" (nothing to save)."""
    if phase == "running" and run.ranks():
        code, _out, err = run_cmd(slurm_mod.scancel_argv(job_id, stop=True))
        if code == 0:
            _say(f"\n{name}: stopping job {job_id} — each node's ranks save a checkpoint at the end of their "
                 f"current step; cancelled after {grace:g} s (Ctrl-C again: cancel now)")
            return "checkpoint"
        _say(f"scancel --batch failed ({err.strip() or code}): cancelling the job")
    else:
        _say(f"\n{name}: no rank has started training yet: cancelling job {job_id} (nothing to save)")
    _cancel(job_id, run_cmd)
    return "cancel"


def _say_meter(run: Run) -> None:
    """The job's meter: what its batch shell summed over the nodes (a job killed at its time limit
    never got there: the nodes' parts found are summed here)."""
    from gaudi_gui.core import meter_files, meter_words

    summary = meter_files.read_summary(run.folder)
    if summary is None:
        with contextlib.suppress(OSError, ValueError):
            summary = slurm_mod.combine_meter(run.folder)
    if summary is not None:
        _say(f"meter: {redact(meter_words.describe(summary))}")


def _finish(run: Run, job_id: str, info: slurm_mod.JobInfo | None, events: list[dict[str, Any]], *,
            stop_requested: bool, before_training: bool, killed: bool, kill_reason: str) -> int:
    exit_code = info.exit_code if info is not None else None
    slurm_state = info.state if info is not None else "UNKNOWN"
    if before_training and not RunProgress().apply_all(events).began:
        result: dict[str, Any] = {"state": "stopped",
                                  "summary": "Stopped before training began — nothing to save"}
    else:
        result = outcome_from_events(events, run.status(), exit_code=exit_code, stop_requested=stop_requested,
                                     killed=killed, log_tail=run.log_tail(40), kill_reason=kill_reason)
        if result["state"] in ("failed", "killed") and slurm_state not in ("COMPLETED", "FAILED", "UNKNOWN"):
            result["summary"] = f"{result['summary']} (Slurm: {slurm_state.lower()})"
    changes = {k: v for k, v in result.items() if k in RunStatus.__dataclass_fields__}
    run.update_status(ended_at=time.time(), exit_description=f"Slurm job {job_id}: {slurm_state}", **changes)
    _say_meter(run)
    return _said_end(run, str(result["state"]), str(result["summary"]))


def _said_end(run: Run, state: str, summary: str) -> int:
    """Say how the run ended; the command's exit status (0: finished or stopped)."""
    if state in ("finished", "stopped"):
        _say(f"{summary}\nrun folder: {run.folder}")
        return 0
    _say(f"gaudi-gui train: {summary}\nlog: {run.log_path}")
    return 1


__all__ = ["STOP_SIGNALS", "add_arguments", "attach", "detached_argv", "follow", "options_from",
           "runner_for", "train"]
