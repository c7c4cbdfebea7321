"""``gaudi-gui benchmark``: a small fixed set of workloads on this machine's cards, with an honest verdict.

Every benchmark is a run folder of kind ``benchmark`` (core.kinds) in the runs store: its supervisor runs
``gaudi-gui benchmark … --events`` (the job itself), which starts one worker per chosen card
(``gaudi_gui.workers.benchmark``: the matmul roofline per card, copy bandwidth, the all-reduce across
the ranks, decode and a training step of the bench model; repeats interleaved), collects the samples,
judges them against ``--reference`` (core.benchmark: per figure and per card) and writes the result
(result.json: the figures with every sample, the machine's identity, the verdicts, a slow card with
the doctor's findings beside it). The foreground command supervises it here and prints the table;
``--detach`` leaves it in the background; the window starts it through the agent (``job.start``).

``--show RUN`` prints an earlier benchmark's table again, judged against ``--reference`` (nothing runs).
Exit 0; 2 bad input (one line: a missing reference, a reference of another card type or size); 1 the
benchmark failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from gaudi_gui.core import benchmark as bm
from gaudi_gui.core import protocol
from gaudi_gui.core.events import EventType

DEVICES = ("auto", "hpu", "cuda", "cpu")
#: How long a tool asked about the machine's identity may take.
TOOL_S = 15.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("benchmark", help="a reference benchmark of this machine's cards, with a verdict",
                       description="Measure a fixed set of workloads (matmul roofline per card, host-device "
                                   "copy, all-reduce across the cards, decode and a training step of the "
                                   "bench model) with interleaved repeats, keep them in a run folder, and "
                                   "judge each figure against a reference: as expected, slower (beyond "
                                   "the spread of the repeats), or cannot say.")
    p.add_argument("--reference", default="", metavar="FILE|RUN",
                   help="judge against a previous benchmark run (its folder or name, or its result.json) or "
                        "a table of expected figures per card type")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every workload (2 or more "
                                                         "for a verdict; default 3)")
    p.add_argument("--cards", default="", help="card ids, comma-separated: one worker each (default: card 0, "
                                               "one worker; on the CPU, 0,1 runs two processes and a gloo "
                                               "all-reduce)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--size", choices=tuple(bm.SIZES), default="standard",
                   help="the workloads' fixed sizes (figures of different sizes are never compared)")
    p.add_argument("--show", default="", metavar="RUN",
                   help="print an earlier benchmark run's table (judged against --reference) instead of "
                        "running one")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--events", action="store_true",
                   help="run the benchmark itself, printing protocol lines (what its supervisor keeps)")
    p.add_argument("--detach", action="store_true",
                   help="benchmark in the background under a supervisor with a run folder, print the folder "
                        "and return")
    p.add_argument("--runs-dir", default="", help="where the run folder goes (default: the runs store)")
    from gaudi_gui.commands import client
    client.add_argument(p)

    def one_line_error(message: str) -> NoReturn:
        print(f"gaudi-gui benchmark: error: {message}", file=sys.stderr)
        sys.exit(bm.EXIT_BAD_INPUT)

    p.error = one_line_error


def _refuse(message: str) -> int:
    print(f"gaudi-gui benchmark: {message}", file=sys.stderr)
    return bm.EXIT_BAD_INPUT


# -- the machine ----------------------------------------------------------------------------------


def machine_device(wanted: str) -> str:
    """``auto`` as the tools say (hl-smi: hpu, nvidia-smi: cuda, else cpu): no torch in this process."""
    if wanted != "auto":
        return wanted
    from gaudi_gui.core import hlsmi
    if hlsmi.hl_smi_program()[1] or hlsmi.find_hl_smi():
        return "hpu"
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def card_names(device: str) -> dict[int, str]:
    """Card id (module id on Gaudi, index on CUDA) -> its type as the vendor's tool names it."""
    from gaudi_gui.core import health
    if device == "hpu":
        from gaudi_gui.core.hlsmi import find_hl_smi, parse_csv, query_args
        fields = ("index", "module_id", "name")
        tool = find_hl_smi()
        if not tool:
            return {}
        rc, out, _err = health.run_tool([tool, *query_args(fields)], TOOL_S)
        if rc != 0:
            return {}
        return {int(s.module_id if s.module_id is not None else s.index): str(s.name or "")
                for s in parse_csv(out, fields).samples}
    if device == "cuda" and shutil.which("nvidia-smi"):
        rc, out, _err = health.run_tool(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                                        TOOL_S)
        names: dict[int, str] = {}
        for line in out.splitlines() if rc == 0 else []:
            index, _, name = line.partition(",")
            if index.strip().isdigit():
                names[int(index)] = name.strip()
        return names
    return {}


def card_type(device: str, cards: list[int]) -> str:
    """The chosen cards' type ("HL-225", "NVIDIA H100 80GB HBM3", "cpu"); several types joined by '+'."""
    if device == "cpu":
        return "cpu"
    names = card_names(device)
    found = sorted({names[c] for c in cards if names.get(c)}) if cards else sorted(set(names.values()))[:1]
    return "+".join(found) or f"{device} (card type unknown)"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def identity(device: str, cards: list[int], kind: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The machine as the result records it (card type and count, driver, firmware, versions), and the
    doctor's findings per chosen card (Gaudi: its per-card checks; none elsewhere)."""
    from gaudi_gui.core import health
    ident: dict[str, Any] = {"host": socket.gethostname(), "device": device, "card_type": kind,
                             "card_count": len(cards), "cards": cards, "cpu": _cpu_model(),
                             "cpu_count": os.cpu_count(), "python": platform.python_version(),
                             "versions": health.package_versions()}
    findings: dict[str, list[str]] = {}
    if device == "hpu":
        seen = health.check_host(cards=cards or None)
        ident["driver"] = seen.versions.get("driver", "")
        ident["firmware"] = seen.versions.get("firmware", "")
        for f in seen.findings:
            if f.module_id is not None and f.severity != "ok":
                findings.setdefault(str(f.module_id), []).append(
                    f"{f.severity}: {f.check}: {f.seen}" + (f" → {f.fix}" if f.fix else ""))
    elif device == "cuda" and shutil.which("nvidia-smi"):
        rc, out, _err = health.run_tool(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        TOOL_S)
        ident["driver"] = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    return ident, findings


# -- the command ----------------------------------------------------------------------------------


def _words(args: argparse.Namespace, reference: str) -> list[str]:
    words = ["--repeats", str(args.repeats), "--device", args.device, "--size", args.size]
    if args.cards:
        words += ["--cards", args.cards]
    if reference:
        words += ["--reference", reference]
    return words


def _cards(args: argparse.Namespace) -> list[int]:
    if not 1 <= args.repeats <= 100:
        raise bm.BenchmarkInputError(f"--repeats: {args.repeats} is not between 1 and 100")
    if not args.cards:
        return []
    from gaudi_gui.core.visibility import parse_cards
    try:
        return parse_cards(args.cards)
    except ValueError as exc:
        raise bm.BenchmarkInputError(str(exc)) from None


def _reference(args: argparse.Namespace, kind: str, root: Path) -> bm.Reference | None:
    if not args.reference:
        return None
    try:
        return bm.load_reference(args.reference, card_type=kind, size=args.size, runs_root=root)
    except bm.BenchmarkInputError as exc:
        raise bm.BenchmarkInputError(f"--reference: {exc}") from None


def queued(args: argparse.Namespace) -> tuple[list[str], str]:
    """``queue add --kind benchmark -- WORDS``: the words its ``--detach`` passes its background command
    (checked as the command checks them: the reference against this machine's cards), and the run's
    name; BenchmarkInputError for what it would refuse."""
    from gaudi_gui.core.runstore import RunStore
    cards = _cards(args)
    device = machine_device(args.device)
    reference = _reference(args, card_type(device, cards), RunStore(args.runs_dir or None).root)
    where = os.path.abspath(reference.path) if reference is not None else ""
    return _words(args, where), f"benchmark-{'cpu' if device == 'cpu' else device}"


def run(args: argparse.Namespace) -> int:
    from gaudi_gui.core.runstore import RunStore
    root = RunStore(args.runs_dir or None).root
    try:
        cards = _cards(args)
    except bm.BenchmarkInputError as exc:
        return _refuse(str(exc))
    if args.show:
        return _show(args, root)
    device = machine_device(args.device)
    kind = card_type(device, cards)
    try:
        reference = _reference(args, kind, root)
    except bm.BenchmarkInputError as exc:
        return _refuse(str(exc))
    where = os.path.abspath(reference.path) if reference is not None else ""
    if args.events:
        return _benchmark(args, device, cards, kind, reference)
    words = _words(args, where)
    name = f"benchmark-{'cpu' if device == 'cpu' else device}"
    if args.detach:
        from gaudi_gui.commands.detach import detach_command
        return detach_command("benchmark", "benchmark", words, name=name, runs_dir=args.runs_dir,
                              grace_s=10.0, as_json=args.json)
    from gaudi_gui.commands import client
    if client.wanted(args):
        return client.run_job("benchmark", words, runs_dir=args.runs_dir)
    return _supervised(args, words, name)


def _show(args: argparse.Namespace, root: Path) -> int:
    path = Path(args.show).expanduser()
    if not path.exists() and "/" not in args.show and (root / args.show).is_dir():
        path = root / args.show
    try:
        record = bm.read_result(path)
        if record.get("kind") != "benchmark":
            raise bm.BenchmarkInputError(f"{args.show}: not a benchmark result")
        ident = record.get("identity") or {}
        reference = bm.load_reference(args.reference, card_type=str(ident.get("card_type") or ""),
                                      size=str(record.get("size") or ""), runs_root=root) \
            if args.reference else None
    except bm.BenchmarkInputError as exc:
        option = "--reference" if args.reference and str(exc).startswith(args.reference) else "--show"
        return _refuse(f"{option}: {exc}")
    record = bm.judged(record, reference) if args.reference else record
    if args.json:
        print(json.dumps(record, indent=2, ensure_ascii=False))
    else:
        print("\n".join(bm.table_lines(record)))
    return bm.EXIT_OK


def _supervised(args: argparse.Namespace, words: list[str], name: str) -> int:
    """The benchmark in a run folder, supervised by this process (as ``--detach`` would in the
    background), its table printed as it prints it."""
    from gaudi_gui.commands.terminal import StopSignals, printable, say
    from gaudi_gui.core import jobkind
    from gaudi_gui.core.stopper import KILL_NOW_SIGNAL
    from gaudi_gui.core.supervisor import supervise

    argv = [sys.executable, "-m", "gaudi_gui", "benchmark", *words, "--events"]
    try:
        job = jobkind.create("benchmark", name, argv, runs_dir=args.runs_dir)
    except OSError as exc:
        print(f"gaudi-gui benchmark: cannot create the run folder: {exc}", file=sys.stderr)
        return bm.EXIT_FAILED
    say(f"benchmark folder: {job.run.folder}")
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
        say(f"gaudi-gui benchmark: {result.summary}\nlog: {job.run.log_path}")
        return 130 if result.state == "stopped" else bm.EXIT_FAILED
    if args.json:
        with contextlib.suppress(bm.BenchmarkInputError):
            print(json.dumps(bm.read_result(job.run.folder), indent=2, ensure_ascii=False))
    say(f"results: {job.run.folder / bm.RESULT_NAME}")
    return bm.EXIT_OK


def _emit(event_type: str, **fields: Any) -> None:
    protocol.write_line(sys.stdout, protocol.encode({"type": event_type, **fields}))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _take(message: dict[str, Any], samples: list[dict[str, Any]], planned: dict[int, int],
          devices: list[dict[str, Any]], errors: list[str]) -> None:
    """One worker's message: kept, and said as the job's events (progress over every rank's plan)."""
    kind_of = message.get("type")
    rank = int(message.get("rank", 0) or 0)
    if kind_of == EventType.BENCH_SAMPLE:
        samples.append(message)
        _emit(EventType.BENCH_SAMPLE, **{k: v for k, v in message.items() if k != "type"})
        if planned:
            _emit(EventType.PROGRESS, done=len(samples), total=sum(planned.values()))
    elif kind_of == EventType.BENCH_PLAN:
        workloads = [str(w) for w in message.get("workloads") or []]
        # The bench model's workloads run on rank 0 only; the all-reduce is said by rank 0.
        runs = len(workloads) if rank == 0 else \
            len([w for w in workloads if w not in ("decode", "train_step", "allreduce")])
        planned[rank] = runs * int(message.get("repeats") or 0)
    elif kind_of == EventType.BENCH_DEVICE:
        devices.append({k: v for k, v in message.items() if k != "type"})
    elif kind_of == EventType.ERROR:
        errors.append(str(message.get("message") or f"worker {rank} failed"))
    elif kind_of == EventType.PHASE and rank == 0:
        _emit(EventType.PHASE, phase=str(message.get("phase") or ""),
              message=str(message.get("message") or ""))


def _benchmark(args: argparse.Namespace, device: str, cards: list[int], kind: str,
               reference: bm.Reference | None) -> int:
    """The job itself (``--events``): one worker per card, their samples collected, judged, written."""
    from gaudi_gui.core.child import Child
    from gaudi_gui.core.visibility import child_env, device_env

    def _terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminated)
    started = time.time()
    chosen = cards or [0]
    world = len(chosen)
    port = _free_port() if world > 1 else 0
    notes: list[str] = []
    if device == "cpu":
        notes.append("the CPU's matmul is measured in fp32 (bf16 matmul on a CPU is often emulated and "
                     "slow); no host-device copy on the CPU")
        if world > 1:
            notes.append(f"{world} CPU processes share {os.cpu_count()} cores: the all-reduce is gloo's")
    if device == "hpu":
        notes.append("fp8 matmul is not measured on Gaudi yet")
    _emit(EventType.PHASE, phase="starting",
          message=f"benchmark on {kind}: {world} worker(s), size {args.size}, {args.repeats} repeats")
    children: list[Child] = []
    samples: list[dict[str, Any]] = []
    devices: list[dict[str, Any]] = []
    errors: list[str] = []
    planned: dict[int, int] = {}
    try:
        for rank, card in enumerate(chosen):
            extra = device_env(device, [card]) if device != "cpu" else \
                {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
            child = Child([sys.executable, "-m", "gaudi_gui.workers.benchmark"], decode=protocol.decode,
                          env=child_env(extra), tail_lines=20)
            child.send(json.dumps({"device": device, "size": args.size, "repeats": args.repeats, "rank": rank,
                                   "world": world, "card": str(card), "port": port}))
            child.close_stdin()
            children.append(child)
        live = list(children)
        stall_s = bm.SIZES[args.size].stall_s
        heard = time.monotonic()
        while live and not errors:
            for child in list(live):
                message = child.next_message(0.05)
                while message:
                    heard = time.monotonic()
                    _take(message, samples, planned, devices, errors)
                    message = child.next_message(0)
                if message is None:  # its output ended
                    live.remove(child)
            if live and time.monotonic() - heard > stall_s:
                errors.append(f"the workers said nothing for {stall_s:g} s (a collective that hangs?); "
                              f"{len(samples)} samples were measured")
    except KeyboardInterrupt:
        for child in children:
            child.end(5)
        _emit(EventType.ERROR, kind="stopped", message="the benchmark was stopped")
        return 130
    codes = [child.end(10) for child in children]
    if errors or any(codes):
        tails = [line for child in children for line in list(child.tail)[-3:]]
        text = errors[0] if errors else f"a worker ended with code {next(c for c in codes if c)}: " + \
            " | ".join(tails[-3:])
        _emit(EventType.ERROR, kind="failed", message=text, last_lines=tails[-10:])
        print(f"gaudi-gui benchmark: {text}", file=sys.stderr)
        return bm.EXIT_FAILED
    ident, findings = identity(device, chosen, kind)
    ident["workers"] = sorted(devices, key=lambda d: int(d.get("rank", 0)))
    figures = bm.collect(samples)
    record: dict[str, Any] = {"kind": "benchmark", "version": bm.RESULT_VERSION, "created": started,
                              "duration_s": round(time.time() - started, 3), "size": args.size,
                              "sizes": dataclasses.asdict(bm.SIZES[args.size]), "repeats": args.repeats,
                              "identity": ident, "figures": {k: f.to_json() for k, f in figures.items()},
                              "card_findings": findings, "notes": notes}
    record = bm.judged(record, reference)
    _emit(EventType.RESULT, **record)
    print("\n".join(bm.table_lines(record)), flush=True)
    return bm.EXIT_OK


__all__ = ["add_parser", "card_type", "identity", "machine_device", "run"]
