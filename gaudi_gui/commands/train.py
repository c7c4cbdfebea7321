"""``gaudi-gui train --config FILE``: the same launch the Training tab makes, from a terminal.

The run is prepared by ``core.prepare.prepare_run`` exactly as the tab prepares it (device ``auto``
by default: hpu > cuda > cpu, as the environment probe decides), the console streams live, and the
structured events are read from the run's events.jsonl. Ctrl-C, SIGTERM and SIGHUP (a closed
terminal) stop the run the way the tab's Stop does: SIGTERM to the recorded ranks only, "saving
checkpoint… N s" while they save, SIGKILL after ``--grace`` seconds or at a second Ctrl-C. If this
command itself is SIGKILLed, the launch (in its own session) keeps running and keeps writing its
folder; the next ``gaudi-gui`` that reads the run re-attaches to it, or reports how it ended.

The loop that does all this is ``core.supervisor.supervise``, the one supervisor loop of every
placement: this command, its ``--detach`` background child, and the app's runs on this machine (which
it starts as ``train --detach --origin gui`` and follows with ``runs follow``). Here: the arguments,
``--detach``, the announce of a background child, and the signal handlers that count stop requests.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys

from gaudi_gui.commands.profile_flag import add_argument as _add_profile_argument
from gaudi_gui.commands.profile_flag import apply_profile_steps
from gaudi_gui.commands.terminal import StopSignals as _Signals
from gaudi_gui.commands.terminal import printable as _printable
from gaudi_gui.commands.terminal import say as _say
from gaudi_gui.commands.terminal import seconds as _grace
from gaudi_gui.core import jobcheck, visibility
from gaudi_gui.core import prepare as prepare_mod
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError, load_job
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.core.stopper import KILL_NOW_SIGNAL
from gaudi_gui.core.supervisor import supervise

DEFAULT_GRACE_S = 120.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run a training job (the JSON the Training tab saves)")
    p.add_argument("--config", required=True, help="job config JSON ('-': read it from stdin)")
    p.add_argument("--runs-dir", default="", help="where the run folder goes (default: data folder)")
    p.add_argument("--device", default="auto", choices=("auto", *prepare_mod.DEVICES),
                   help="accelerator to launch for (default: auto = hpu > cuda > cpu, as probed)")
    p.add_argument("--grace", type=_grace, default=DEFAULT_GRACE_S,
                   help=f"seconds a stop may take to save its checkpoint before the ranks are killed "
                        f"(default {DEFAULT_GRACE_S:g}); a second Ctrl-C kills at once")
    p.add_argument("--detach", action="store_true",
                   help="start the run in the background (its own session: it outlives this shell and "
                        "an SSH connection), print its folder and return; follow it with `gaudi-gui "
                        "runs follow`, stop it with `gaudi-gui runs stop`")
    p.add_argument("--json", action="store_true", help="with --detach: print the run as JSON")
    p.add_argument("--cards", default="", metavar="IDS",
                   help="the cards the run may use, e.g. 2,3: Gaudi module ids (HABANA_VISIBLE_MODULES) or "
                        "CUDA device indexes (CUDA_VISIBLE_DEVICES); ignored on cpu; recorded in the run's "
                        "env.json (default: all cards). With --host: the host's cards. With --hosts: "
                        "'0,1' uses those cards on every host, 'A=0,1;B=2,3' each host's own (a host "
                        "not named uses all its cards)")
    p.add_argument("--resumed-from", default="", metavar="RUN_FOLDER",
                   help="the run this one resumes (with the job's resume_from_checkpoint): recorded in "
                        "the new run's status, so the history links the two")
    p.add_argument("--overwrite-output", dest="overwrite_output", action="store_true",
                   help="write into an output folder that holds another run's checkpoints, final model "
                        "or adapter (refused otherwise, naming the folder and its run); a job that names "
                        "no output_dir gets a folder of its own, outputs/<run name>")
    _add_profile_argument(p)
    p.add_argument("--announce", default="", help=argparse.SUPPRESS)
    from gaudi_gui.commands import client
    client.add_argument(p)
    # Who asked for the run, as its status records it: the app starts a run on this machine through
    # `train --detach` too, and its runs say "gui" as they always did.
    p.add_argument("--origin", default="cli", choices=("cli", "gui"), help=argparse.SUPPRESS)
    p.add_argument("--no-preflight", dest="no_preflight", action="store_true",
                   help="skip the doctor's check of the chosen cards before the start (Gaudi only)")
    p.add_argument("--hosts", default="", metavar="A,B,…",
                   help="one job across these hosts: accelerate's multi-node launch on each (machine rank "
                        "in this order, host A the main process), followed and stopped as one run")
    p.add_argument("--main-ip", dest="main_ip", default="", metavar="ADDR",
                   help="with --hosts: the first host's address as the others reach it (default: its "
                        "HostName as ssh resolves it)")
    p.add_argument("--reconnect-s", type=_grace, default=600.0,
                   help="with --host: how long to keep reconnecting after the connection dropped "
                        "(the run goes on on the host meanwhile; default 600)")
    from gaudi_gui.commands import slurm_run
    slurm_run.add_arguments(p)


def _cards(args: argparse.Namespace) -> list[int] | None:
    """``--cards`` as ids, None when not given; ValueError (one line) when malformed."""
    text = getattr(args, "cards", "") or ""
    return visibility.parse_cards(text) if text.strip() else None


def run(args: argparse.Namespace) -> int:
    try:
        cards = _cards(args)
    except ValueError as exc:
        print(f"gaudi-gui train: {exc}", file=sys.stderr)
        return 2
    try:
        job = load_job(args.config)
    except JobConfigError as exc:
        print(f"gaudi-gui train: {exc}", file=sys.stderr)
        return 2
    # --overwrite-output travels in the job: the host's own `train` decides (the folder is there).
    job.overwrite_output = job.overwrite_output or bool(getattr(args, "overwrite_output", False))
    apply_profile_steps(job, args)
    try:
        job, resumed = prepare_mod.resolve_resume(job, getattr(args, "resumed_from", ""))
    except prepare_mod.PrepareError as exc:
        print(f"gaudi-gui train: {exc}", file=sys.stderr)
        return 2
    args.resumed_from = resumed
    # The whole job, checked here (the window's Start runs this command too): nothing found later
    # in the launched ranks that this can see now.
    problems = jobcheck.check(job, resumed_from=resumed)
    if problems:
        for field, problem in problems:
            # Another run's files in the output folder (core/outputs.Conflict): this command's way out.
            hint = " (or pass --overwrite-output)" if "a new run would write over them" in problem else ""
            print(f"gaudi-gui train: {field}: {problem}{hint}", file=sys.stderr)
        return 2
    notes = [f"gaudi-gui train: note: {note}" for note in jobcheck.notes(job)]
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    if not getattr(args, "no_preflight", False) and args.device in ("auto", "hpu"):
        from gaudi_gui.commands.doctor import preflight  # the doctor's gate (a no-op without hl-smi)
        refusal = preflight(cards)
        if refusal:
            print(f"gaudi-gui train: {refusal}", file=sys.stderr)
            return 2
    if args.detach:
        return _detach(job, args)
    from gaudi_gui.commands import client
    if client.wanted(args):
        return client.run_job("train", _agent_words(args), config=job.to_dict(), runs_dir=args.runs_dir,
                              said=notes)
    device = args.device if args.device != "auto" else prepare_mod.probe_device()
    if cards is not None and device == "cpu":
        print(f"gaudi-gui train: note: --cards {visibility.format_ids(cards)} ignored: the run is on the "
              f"cpu", file=sys.stderr, flush=True)
    try:
        prepared = prepare_mod.prepare_run(job, device=device, store=RunStore(args.runs_dir or None),
                                           origin=getattr(args, "origin", "cli"),
                                           resumed_from=getattr(args, "resumed_from", ""), cards=cards)
    except prepare_mod.PrepareError as exc:
        print(f"gaudi-gui train: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gaudi-gui train: cannot create the run folder: {exc.strerror or exc}", file=sys.stderr)
        return 1
    run_ = prepared.run
    if args.announce:
        from gaudi_gui.commands.detach import announce
        announce(run_, args.announce, device=device)
    else:
        # This command is the run's supervisor: the only writer of its status (readers defer to it).
        with contextlib.suppress(OSError):
            run_.write_supervisor(folder=str(run_.folder), name=run_.name, device=device)
    print(f"run folder: {run_.folder} (device {device})", flush=True)

    signals = _Signals()
    previous = {s: signal.signal(s, signals.handler)
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, KILL_NOW_SIGNAL)}
    try:
        # A background supervisor's stdout is /dev/null (announce): its console is not read at all.
        result = supervise(prepared, grace_s=args.grace, signals=signals, say=_say,
                           echo=None if args.announce else _echo)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if result.ok:
        _say(f"{result.summary}\nrun folder: {run_.folder}")
        return 0
    _say(f"gaudi-gui train: {result.summary}\nlog: {run_.log_path}")
    return 1


def _echo(line: str) -> None:
    """A console line of the launch on stdout, made safe for a terminal (a closed pipe is no error)."""
    with contextlib.suppress(BrokenPipeError):
        print(_printable(line), flush=True)


# -- detached runs (what a workstation starts on a host over SSH) -------------------------------------


def _detach(job: JobConfig, args: argparse.Namespace) -> int:
    """Start this command again in a session of its own (it outlives the shell and the SSH
    connection), wait until it has created the run folder, print that and return."""
    from gaudi_gui.commands import detach
    info = detach.detach("train", args.runs_dir, lambda path, announce: detached_argv(args, path, announce),
                         job.to_dict())
    if isinstance(info, int):
        return info
    cards = _cards(args)
    if cards is not None and info.get("device") == "cpu":
        print(f"gaudi-gui train: note: --cards {visibility.format_ids(cards)} ignored: the run is on the "
              f"cpu", file=sys.stderr, flush=True)
    if args.json:
        detach.print_started(info, "run", as_json=True)
    else:
        print(f"run folder: {info['folder']} (detached, device {info['device']}, supervisor pid "
              f"{info['pid']}); follow: gaudi-gui runs follow {info['name']}; stop: gaudi-gui runs stop "
              f"{info['name']}", flush=True)
    return 0


def _agent_words(args: argparse.Namespace) -> list[str]:
    """The options that shape the run, for the agent's start of it (``--detach``'s, without its own)."""
    words = ["--device", args.device, "--grace", repr(args.grace), "--no-preflight"]
    cards = _cards(args)
    if cards is not None:
        words += ["--cards", visibility.format_ids(cards)]
    if getattr(args, "resumed_from", ""):
        words += ["--resumed-from", args.resumed_from]
    return words


def detached_argv(args: argparse.Namespace, config_path: str, announce: str) -> list[str]:
    """The background supervisor's command: this ``train`` again, on the saved config, with the
    options that shape the run (device, cards, grace, runs folder, resumed run, origin). The doctor's
    gate ran here already (or was skipped with --no-preflight): the child does not run it again."""
    argv = [sys.executable, "-m", "gaudi_gui", "train", "--config", config_path, "--device", args.device,
            "--grace", repr(args.grace), "--announce", announce, "--no-preflight"]
    if getattr(args, "origin", "cli") != "cli":
        argv += ["--origin", args.origin]
    cards = _cards(args)
    if cards is not None:
        argv += ["--cards", visibility.format_ids(cards)]
    if args.runs_dir:
        argv += ["--runs-dir", args.runs_dir]
    if getattr(args, "resumed_from", ""):
        argv += ["--resumed-from", args.resumed_from]
    return argv
