"""``gaudi-gui calibrate``: measure a model for FP8 with Intel Neural Compressor (INC's MEASURE step).

Every calibration is a run folder of kind ``calibrate`` (core.kinds) in the runs store: its supervisor
runs ``gaudi-gui calibrate … --events`` (the job itself), which reads the calibration prompts, writes
the QUANT_CONFIG it uses, starts the worker (``gaudi_gui.workers.calibrate``: torch and INC) that runs
the prompts through the prepared model and writes INC's measurement files into the run folder, and
then writes manifest.json (core.fp8: the model and its revision, the device and card generation, INC's
and torch's versions, the prompts' digest, the rows). ``serve --fp8 RUN``, ``eval --fp8 RUN`` and
``doctor --fp8 RUN`` check that manifest against the machine they run on.

Several cards (``--cards IDS``; on the CPU ``--ranks N``): one process a card, started by torch's
launcher (``python -m torch.distributed.run --standalone --nproc-per-node N``) with the chosen cards
visible (HABANA_VISIBLE_MODULES / CUDA_VISIBLE_DEVICES, as serve and train restrict theirs); the ranks
join one process group (gloo on the CPU) and INC writes one file set a rank
(``inc_hooks_maxabs_<rank>_<N>.*``). Each rank loads the whole model and measures its share of the
prompts: there is no tensor parallelism here. The manifest records ``ranks`` and each rank's files;
``serve --fp8`` refuses another tensor-parallel size, ``eval --fp8`` (one process) a calibration on
several ranks.

The foreground command supervises it here (or through the agent); ``--detach`` leaves it in the
background; the window starts it through the agent (``job.start``). Exit 0; 2 bad input (one line: a
missing model, ``--rows 0``, an empty dataset, INC not installed); 1 the calibration failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from gaudi_gui.core import fp8, protocol
from gaudi_gui.core.events import EventType

DEVICES = ("auto", "hpu", "cuda", "cpu")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure a model for FP8 (Intel Neural Compressor) into a run "
                                         "folder",
                       description="Run calibration prompts through a model prepared by Intel Neural "
                                   "Compressor (MEASURE) and keep its measurement files, the QUANT_CONFIG "
                                   "and a manifest (model revision, device and card generation, versions) "
                                   "in a run folder, for serve --fp8 / eval --fp8 on a machine of the same "
                                   "kind.")
    p.add_argument("--model", default="", help="a Hub id, a model folder, a run folder (its final model) or "
                                               "builtin:demo")
    p.add_argument("--dataset", default="", metavar="FILE",
                   help="calibration prompts: JSONL/JSON rows as Training takes them (text, "
                        "prompt/completion, messages) or a text file, one prompt a line")
    p.add_argument("--prompt", action="append", default=[], help="a calibration prompt (repeatable)")
    p.add_argument("--rows", type=int, default=fp8.DEFAULT_ROWS,
                   help=f"rows measured, at most (default {fp8.DEFAULT_ROWS})")
    p.add_argument("--max-length", type=int, default=512, help="tokens of a row, at most (default 512)")
    p.add_argument("--observer", choices=fp8.OBSERVERS, default=fp8.DEFAULT_OBSERVER)
    p.add_argument("--scale-method", default="", choices=("", *fp8.SCALE_METHODS),
                   help="the scale method the QUANTIZE step will use (default maxabs_hw on Gaudi; "
                        "maxabs_pow2 elsewhere: maxabs_hw needs an HPU)")
    p.add_argument("--blocklist", default=",".join(fp8.DEFAULT_BLOCKLIST),
                   help="module names left in high precision, comma-separated (default lm_head)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--cards", default="", metavar="IDS",
                   help="measure on these cards, one process (rank) a card: module ids on Gaudi "
                        "(HABANA_VISIBLE_MODULES), indexes on CUDA; serve --fp8 then needs as many cards")
    p.add_argument("--ranks", type=int, default=0, metavar="N",
                   help="processes that measure (default: one a card of --cards, else 1); on the CPU, "
                        "where there are no cards, the way to measure on N ranks")
    p.add_argument("--json", action="store_true", help="print the manifest as one JSON object")
    p.add_argument("--events", action="store_true",
                   help="run the calibration itself, printing protocol lines (what its supervisor keeps)")
    from gaudi_gui.commands.flags import add_detach_arguments
    add_detach_arguments(p, "calibrate", always_a_run_folder=True)  # the foreground one has a folder too
    from gaudi_gui.commands import client
    client.add_argument(p)

    def one_line_error(message: str) -> NoReturn:
        print(f"gaudi-gui calibrate: error: {message}", file=sys.stderr)
        sys.exit(fp8.EXIT_BAD_INPUT)

    p.error = one_line_error


def _refuse(args: argparse.Namespace, message: str) -> int:
    print(f"gaudi-gui calibrate: {message}", file=sys.stderr)
    if args.events:
        _emit(EventType.ERROR, kind="bad_input", message=message)
    return fp8.EXIT_BAD_INPUT


def _emit(event_type: str, **fields: Any) -> None:
    protocol.write_line(sys.stdout, protocol.encode({"type": event_type, **fields}))


def model_of(value: str) -> str:
    """``--model`` as a loadable name: a run folder (or a run's name) means its saved final model."""
    from gaudi_gui.core.jobcheck import model_problem
    folder = Path(value).expanduser()
    if value and not folder.is_dir() and "/" not in value:
        from gaudi_gui.core.runstore import RunStore
        if (RunStore().root / value).is_dir():
            folder = RunStore().root / value
    # A run folder (its status.json; its config.json is the job's, not a model's) means its saved model.
    if folder.is_dir() and (folder / "status.json").is_file() and (folder / "job.json").is_file():
        from gaudi_gui.core.runstore import Run
        out = Run(folder).output_dir()
        full = next((out / n for n in ("final", "merged") if out and (out / n / "config.json").is_file()),
                    None)
        if full is None:
            raise fp8.Fp8Error(f"--model: the run {folder.name} has no saved full model (final/ or merged/); "
                               "an adapter run must be merged first")
        return str(full)
    bad = model_problem(value)
    if bad:
        raise fp8.Fp8Error(f"--model: {bad}")
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        raise fp8.Fp8Error(f"--model: {value} is an adapter: calibrate a merged model")
    if not fp8.model_identity(value)["path"]:
        # The manifest names the revision measured: the model must be here before it is measured.
        raise fp8.Fp8Error(f"--model: {value} is not in this machine's Hub cache: gaudi-gui download {value} "
                           "first")
    return str(folder.resolve()) if folder.is_dir() else value


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = [p for p in args.prompt if p.strip()]
    if args.dataset:
        try:
            prompts += fp8.read_prompts(args.dataset, args.rows)
        except fp8.Fp8Error as exc:
            raise fp8.Fp8Error(f"--dataset: {exc}") from None
    if not prompts:
        raise fp8.Fp8Error("no calibration prompts: give --dataset FILE or --prompt TEXT")
    return prompts[:args.rows]


def _ranks(args: argparse.Namespace) -> tuple[list[int], int]:
    """(the cards chosen, the ranks): one rank a card, ``--ranks`` where no card is chosen (the CPU).
    Fp8Error (one line) for a malformed ``--cards`` or counts that disagree."""
    from gaudi_gui.core.visibility import parse_cards
    cards: list[int] = []
    if args.cards:
        try:
            cards = parse_cards(args.cards)
        except ValueError as exc:
            raise fp8.Fp8Error(str(exc)) from None
    if not 0 <= args.ranks <= fp8.MAX_RANKS:
        raise fp8.Fp8Error(f"--ranks: {args.ranks} is not between 1 and {fp8.MAX_RANKS}")
    if cards and args.ranks and args.ranks != len(cards):
        raise fp8.Fp8Error(f"--ranks {args.ranks} and --cards {args.cards} ({len(cards)} cards) disagree: "
                           "one rank measures on each card")
    if len(cards) > fp8.MAX_RANKS:
        raise fp8.Fp8Error(f"--cards: {len(cards)} cards, at most {fp8.MAX_RANKS}")
    return cards, len(cards) or args.ranks or 1


def _words(args: argparse.Namespace, model: str) -> list[str]:
    """The command's words for the supervised job, each ``--option=value``: a prompt or a path that
    begins with '-' stays a value."""
    pairs = [("--model", model), ("--rows", str(args.rows)), ("--max-length", str(args.max_length)),
             ("--observer", args.observer), ("--blocklist", args.blocklist), ("--device", args.device)]
    if args.cards:
        pairs.append(("--cards", args.cards.replace(" ", "")))
    if args.ranks:
        pairs.append(("--ranks", str(args.ranks)))
    if args.scale_method:
        pairs.append(("--scale-method", args.scale_method))
    if args.dataset:
        pairs.append(("--dataset", os.path.abspath(os.path.expanduser(args.dataset))))
    pairs += [("--prompt", prompt) for prompt in args.prompt]
    return [f"{option}={value}" for option, value in pairs]


def _device(wanted: str) -> str:
    if wanted != "auto":
        return wanted
    return fp8.machine()["device"]


@dataclasses.dataclass(frozen=True)
class Checked:
    """A calibration's options as checked before anything starts (``checked``)."""

    model: str
    prompts: list[str]
    cards: list[int]
    ranks: int
    device: str


def checked(args: argparse.Namespace) -> Checked:
    """The options checked once, where they enter (this command, and ``queue add --kind calibrate``):
    Fp8Error with the one line that refuses them."""
    if not 1 <= args.rows <= fp8.MAX_ROWS:
        raise fp8.Fp8Error(f"--rows: {args.rows} is not between 1 and {fp8.MAX_ROWS}")
    if not 1 <= args.max_length <= 1 << 20:
        raise fp8.Fp8Error(f"--max-length: {args.max_length} is not a token count")
    if not args.model:
        raise fp8.Fp8Error("--model: give a Hub id, a model folder or a run folder")
    cards, ranks = _ranks(args)
    model = model_of(args.model)
    prompts = _prompts(args)
    if len(prompts) < ranks:
        raise fp8.Fp8Error(f"{len(prompts)} calibration prompt(s) cannot be shared by {ranks} ranks: give "
                           f"at least {ranks} (each rank measures its share)")
    device = _device(args.device)
    if args.scale_method in fp8.HPU_ONLY and device != "hpu":
        raise fp8.Fp8Error(f"--scale-method: {args.scale_method} needs an HPU (Gaudi); on {device} use "
                           "maxabs_pow2")
    return Checked(model, prompts, cards, ranks, device)


def queued(args: argparse.Namespace) -> tuple[list[str], str]:
    """``queue add --kind calibrate -- WORDS``: the words its ``--detach`` passes its background command
    (checked as the command checks them), and the run's name; Fp8Error for what it would refuse."""
    found = checked(args)
    return _words(args, found.model), f"calibrate-{os.path.basename(found.model.rstrip('/')) or 'model'}"


def run(args: argparse.Namespace) -> int:
    try:
        found = checked(args)
    except fp8.Fp8Error as exc:
        return _refuse(args, str(exc))
    model, prompts, cards, ranks, device = found.model, found.prompts, found.cards, found.ranks, found.device
    if args.events:
        return _calibrate(args, model, prompts, device, cards=cards, ranks=ranks)
    words = _words(args, model)
    name = f"calibrate-{os.path.basename(model.rstrip('/')) or 'model'}"
    if args.detach:
        from gaudi_gui.commands.detach import detach_command
        return detach_command("calibrate", "calibrate", words, name=name, runs_dir=args.runs_dir,
                              grace_s=10.0, as_json=args.json)
    from gaudi_gui.commands import client
    if client.wanted(args):
        return client.run_job("calibrate", words, runs_dir=args.runs_dir)
    return _supervised(args, words, name)


def _supervised(args: argparse.Namespace, words: list[str], name: str) -> int:
    """The calibration in a run folder, supervised by this process (as ``--detach`` would in the
    background)."""
    from gaudi_gui.commands.terminal import StopSignals, printable, say
    from gaudi_gui.core import jobkind
    from gaudi_gui.core.stopper import KILL_NOW_SIGNAL
    from gaudi_gui.core.supervisor import supervise

    argv = [sys.executable, "-m", "gaudi_gui", "calibrate", *words, "--events"]
    try:
        job = jobkind.create("calibrate", name, argv, runs_dir=args.runs_dir)
    except OSError as exc:
        print(f"gaudi-gui calibrate: cannot create the run folder: {exc}", file=sys.stderr)
        return fp8.EXIT_FAILED
    say(f"calibrate folder: {job.run.folder}")
    signals = StopSignals()
    previous = {sig: signal.signal(sig, signals.handler)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, KILL_NOW_SIGNAL)}

    def echo(line: str) -> None:
        with contextlib.suppress(ValueError, protocol.ProtocolError):
            if protocol.decode(line) is None and not args.json:
                with contextlib.suppress(BrokenPipeError):
                    print(printable(line), flush=True)

    try:
        result = supervise(job, grace_s=10.0, signals=signals, say=say, echo=echo)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if not result.ok:
        say(f"gaudi-gui calibrate: {result.summary}\nlog: {job.run.log_path}")
        bad = any(e.get("type") == EventType.ERROR and e.get("kind") == "bad_input" for e in job.run.events())
        return 130 if result.state == "stopped" else fp8.EXIT_BAD_INPUT if bad else fp8.EXIT_FAILED
    if result.state == "stopped" or not (job.run.folder / fp8.MANIFEST_NAME).is_file():
        # A stop counts as a clean end for the supervisor (a serve's Stop is), but a calibration that
        # was stopped measured nothing usable: no manifest, and the exit says so.
        say(f"gaudi-gui calibrate: {result.summary or result.state}: no measurements kept (no manifest)"
            f"\nlog: {job.run.log_path}")
        return 130
    if args.json:
        with contextlib.suppress(fp8.Fp8Error):
            print(json.dumps(fp8.read_manifest(job.run.folder), indent=2, ensure_ascii=False))
    say(f"manifest: {job.run.folder / fp8.MANIFEST_NAME}")
    return fp8.EXIT_OK


#: The launcher of several ranks: torch's (torchrun), on ports of its own choosing (--standalone) of the
#: loopback (--local-addr: the ranks' MASTER_ADDR, not this machine's name, which may not resolve), its
#: per-rank log files not written (--log-dir /dev/null: the ranks' output is the job's).
LAUNCHER = ("-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--local-addr=127.0.0.1",
            "--log-dir", os.devnull)


def launch_argv(ranks: int, job_file: str | Path, python: str | None = None) -> list[str]:
    """The worker as one process (its job on stdin), or as ``ranks`` processes under torch's launcher
    (its job in ``job_file``: the ranks share no stdin)."""
    python = python or sys.executable
    if ranks <= 1:
        return [python, "-m", "gaudi_gui.workers.calibrate"]
    return [python, *LAUNCHER, f"--nproc-per-node={ranks}", "-m", "gaudi_gui.workers.calibrate", "--job",
            str(job_file)]


def _calibrate(args: argparse.Namespace, model: str, prompts: list[str], device: str, *, cards: list[int],
               ranks: int) -> int:
    """The job itself (``--events``): the QUANT_CONFIG, the worker's measurements (each rank's), the
    manifest."""
    from gaudi_gui.core import atomic
    from gaudi_gui.core.child import Child
    from gaudi_gui.core.visibility import child_env, device_env

    def _terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminated)
    folder = Path(fp8.env_run_folder() or os.getcwd())
    started = time.time()
    here = fp8.machine()
    if args.device != "auto" and args.device != here["device"]:
        # Measured on another device than the machine's own (the CPU of a Gaudi server): said as such.
        here = {"device": args.device, "generation": args.device}
    if not fp8.inc_version():
        return _refuse(args, f"Intel Neural Compressor is not installed: {fp8.INC_INSTALL}")
    scale_method = args.scale_method or fp8.default_scale_method(device)
    blocklist = [b.strip() for b in args.blocklist.split(",") if b.strip()]
    dump = fp8.dump_prefix(folder)
    measure = fp8.measure_config(dump, device=device, observer=args.observer, blocklist=blocklist)
    identity = fp8.model_identity(model)
    atomic.write_json(folder / fp8.QUANT_CONFIG_NAME, measure, fsync=False)
    atomic.write_json(folder / fp8.QUANTIZE_CONFIG_NAME, fp8.quantize_config(
        dump, device=device, scale_method=scale_method, blocklist=blocklist), fsync=False)
    on = f", {ranks} ranks" + (f" on cards {','.join(map(str, cards))}" if cards else "") if ranks > 1 else ""
    _emit(EventType.PHASE, phase="starting",
          message=f"FP8 calibration of {args.model} on {here['generation']}: {len(prompts)} rows{on}, "
                  f"observer {args.observer}, scale method {scale_method} (INC {fp8.inc_version()})")
    job = {"model": identity["path"] or model, "prompts": prompts, "device": device,
           "max_length": args.max_length, "config": measure}
    job_file = folder / "calibrate-job.json"  # the ranks' job (several processes share no stdin)
    extra = device_env(device, cards)
    if ranks > 1:
        atomic.write_json(job_file, job, fsync=False)
        if device == "cpu":  # the ranks share the cores (torch's launcher would say 1 thread each)
            extra["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks))
    try:
        child = Child(launch_argv(ranks, job_file), decode=protocol.decode, env=child_env(extra),
                      tail_lines=30, stdin=ranks <= 1)
    except OSError as exc:
        job_file.unlink(missing_ok=True)
        _emit(EventType.ERROR, kind="failed", message=f"cannot start the calibration worker: {exc}")
        print(f"gaudi-gui calibrate: cannot start the calibration worker: {exc}", file=sys.stderr)
        return fp8.EXIT_FAILED
    if ranks <= 1:
        child.send(json.dumps(job))
        child.close_stdin()
    error: dict[str, Any] | None = None
    done: dict[int, dict[str, Any]] = {}
    rows_done: dict[int, int] = {}
    try:
        while (message := child.next_message(None)) is not None:
            kind = message.get("type")
            rank = int(message.get("rank") or 0)
            if kind == EventType.ERROR:
                error = error or message  # the first rank's error (the launcher then ends the others)
            elif kind == EventType.DONE:
                done[rank] = message
            elif kind == EventType.PROGRESS:
                rows_done[rank] = int(message.get("done") or 0)
                _emit(str(kind), done=sum(rows_done.values()), total=len(prompts))
            elif kind == EventType.PHASE and rank == 0:
                _emit(str(kind), **{k: v for k, v in message.items() if k not in ("type", "v", "rank")})
    except KeyboardInterrupt:
        child.end(5)
        job_file.unlink(missing_ok=True)
        _emit(EventType.ERROR, kind="stopped", message="the calibration was stopped")
        return 130
    code = child.end(10)
    job_file.unlink(missing_ok=True)
    if error is not None or len(done) < ranks or code != 0:
        tail = list(child.tail)[-3:]
        text = str((error or {}).get("message")
                   or f"the calibration worker ended ({code}): " + " | ".join(tail))
        if error is not None and ranks > 1:
            text = f"rank {int(error.get('rank') or 0)} of {ranks}: {text}"
        kind = str((error or {}).get("kind") or "failed")
        _emit(EventType.ERROR, kind=kind, message=text, last_lines=list(child.tail)[-10:])
        print(f"gaudi-gui calibrate: {text}", file=sys.stderr)
        return fp8.EXIT_BAD_INPUT if kind == "bad_input" else fp8.EXIT_FAILED
    files = fp8.measurement_files(folder)
    per_rank = [[f for f in fp8.rank_files(args.observer, rank, ranks) if (folder / f).is_file()]
                for rank in range(ranks)]
    first = done.get(0) or {}
    manifest = fp8.make_manifest(model=identity, here=here, rows=len(prompts),
                                 prompts_sha256=fp8.prompts_digest(prompts), observer=args.observer,
                                 scale_method=scale_method, blocklist=blocklist, files=files, started=started,
                                 duration_s=time.time() - started,
                                 torch_version=str(first.get("torch") or ""), ranks=ranks, cards=cards,
                                 per_rank=per_rank)
    manifest["tokens"] = sum(int(d.get("tokens") or 0) for d in done.values())
    if ranks > 1:
        manifest["rank_rows"] = [int(done[r].get("rows") or 0) for r in range(ranks)]
    atomic.write_json(folder / fp8.MANIFEST_NAME, manifest, fsync=False)
    _emit(EventType.RESULT, **manifest)
    print(f"calibrated {len(prompts)} rows{on} in {manifest['duration_s']:.1f} s: {', '.join(files)}",
          flush=True)
    return fp8.EXIT_OK


__all__ = ["add_parser", "model_of", "run"]
