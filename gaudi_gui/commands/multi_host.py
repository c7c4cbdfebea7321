"""``gaudi-gui train --config FILE --hosts A,B[,…]``: one training job across several hosts.

Nothing home-made: every host runs the same ``accelerate launch`` the single-host run uses, with
accelerate's own multi-node options (``--num_machines N --machine_rank i --main_process_ip H0
--main_process_port P``; ``core/launch.py`` builds them from the job's launch section), detached on
the host in a session of its own (``train --detach``), so the run outlives this command and the
connection, exactly as ``train --host`` does. One run is a folder per host.

Before anything starts, a pre-flight on every host in parallel: reachable with this gaudi-gui; the same
versions of torch / transformers / accelerate (a mismatch hangs or corrupts a collective); the model, the
dataset and a resume checkpoint present at the job's paths (or the Hub id to resolve); the main port
free on host 0. Host 0's address "as the others reach it" is ssh's own resolution of host 0
(``ssh -G``: its HostName), or ``--main-ip``.

Then every host's run is followed at once (``runs follow`` over ssh, reconnecting after a drop): log
lines are printed with a ``host|`` prefix, progress and checkpoints come from host 0 (global rank 0),
Ctrl-C stops every host's ranks with a checkpoint (the ranks agree on the step through their own
all-reduce, so a stop asked of one host stops all at the same step), a second Ctrl-C kills. When one
host's ranks fail, are killed or its host is lost, the others are killed at once, since they would
otherwise wait in a collective forever, and the message names the host that failed.

The pre-flight, host 0's address and the per-host jobs are in ``core/multi_host.py`` (the Training
tab's multi-host run uses the same).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gaudi_gui.commands.remote_run import EXIT_HOST, Follower, HostRun, host_options
from gaudi_gui.commands.terminal import StopSignals as _Signals
from gaudi_gui.commands.terminal import printable as _printable
from gaudi_gui.commands.terminal import say as _say
from gaudi_gui.core import remote, visibility
from gaudi_gui.core.multi_host import host_jobs, main_address, parse_host_cards, parse_hosts, preflight
from gaudi_gui.core.remote import HostError, RemoteError

# -- following every host -----------------------------------------------------------------------------

def _stop(run: HostRun, now: bool) -> None:
    if not run.folder or run.final is not None:
        return
    argv = run.host.gaudi_gui_argv("runs", "stop", run.folder, *(["--now"] if now else []))
    try:
        remote.call(run.host, argv, timeout=60)
    except RemoteError as exc:
        _say(f"could not reach {run.host.name} to stop its ranks: {exc}")


def _stop_all(runs: list[HostRun], now: bool) -> None:
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        list(pool.map(lambda r: _stop(r, now), runs))


def _gate_wanted(args: argparse.Namespace) -> bool:
    return not getattr(args, "no_preflight", False) and getattr(args, "device", "auto") in ("auto", "hpu")


def card_gate(hosts: list[remote.Host], cards: dict[str, list[int]]) -> str:
    """The doctor's gate on every host of a multi-node run: "" to go on, else the reason and the fix.

    One ``doctor --json`` child per host, in parallel, each with a timeout (core.preflight): a held,
    dead or ECC-failed chosen card, scale-out ports down on a chosen card (a multi-node run needs
    them), versions differing between the hosts, or a host that does not answer refuse the start.
    Warnings are printed and let it go on. A host without hl-smi has no cards to check."""
    from gaudi_gui.core import preflight as gate_mod
    plan = gate_mod.hosts_plan([gate_mod.Target(h.name, tuple(cards.get(h.name, ())) or None,
                                                h.remote_command) for h in hosts], multi_node=True)
    verdict = gate_mod.check(plan)
    for warning in verdict.warnings:
        _say(f"gaudi-gui train: preflight warning: {warning}")
    if verdict.ok:
        return ""
    fix = f"; {verdict.suggestion}" if verdict.suggestion else ""
    return ("preflight refused the start: " + "; ".join(verdict.errors) + fix
            + " (gaudi-gui doctor --hosts shows all; --no-preflight skips this check)")


def train(args: argparse.Namespace) -> int:
    from gaudi_gui.core.jobconfig import JobConfigError, load_job
    try:
        hosts = parse_hosts(args.hosts)
        remote_command = (getattr(args, "remote_command", "") or "").strip()
        if remote_command:
            # --remote-command runs gaudi-gui on every host of the run (a saved host's own is replaced).
            hosts = [remote.find_host(h.name, remote_command) for h in hosts]
        cards = parse_host_cards(getattr(args, "cards", "") or "", [h.name for h in hosts])
        job = load_job(args.config)
    except (HostError, JobConfigError, ValueError) as exc:
        _say(f"gaudi-gui train: {exc}")
        return 2
    port = int(job.launch.main_process_port or 29500)
    try:
        main_ip = args.main_ip.strip() or main_address(hosts[0])
    except RemoteError as exc:
        _say(f"gaudi-gui train: {exc}")
        return EXIT_HOST
    print(f"pre-flight on {', '.join(h.name for h in hosts)} …", flush=True)
    # The doctor's card gate runs beside the hosts' pre-flight (both ask every host at once).
    with ThreadPoolExecutor(max_workers=1) as pool:
        gate = pool.submit(card_gate, hosts, cards) if _gate_wanted(args) else None
        problems = preflight(hosts, job, port)
        refusal = gate.result() if gate is not None else ""
    if problems:
        for line in problems:
            _say(f"gaudi-gui train: {line}")
        return EXIT_HOST
    if refusal:
        _say(f"gaudi-gui train: {refusal}")
        return 2
    runs = [HostRun(h, i) for i, h in enumerate(hosts)]
    for run, part in zip(runs, host_jobs(job, len(hosts), main_ip, port), strict=True):
        problems_ = [m for _f, m in part.validate()]
        if problems_:
            _say(f"gaudi-gui train: {problems_[0]}")
            _stop_all(runs, now=True)
            return 2
        argv = ["train", "--config", "-", "--detach", "--json", *host_options(args),
                *visibility.cards_argv(cards.get(run.host.name, []))]
        try:
            code, out, err = remote.call(run.host, run.host.gaudi_gui_argv(*argv),
                                         input_text=json.dumps(part.to_dict()), timeout=180)
            info = json.loads(out.strip().splitlines()[-1]) if code == 0 else None
            run.folder = str(info["folder"]) if isinstance(info, dict) else ""
        except (RemoteError, ValueError, KeyError, IndexError) as exc:
            err, code = str(exc), EXIT_HOST
        if not run.folder:
            _say(f"gaudi-gui train: {run.host.name} (machine rank {run.rank}) did not start: "
                 f"{err.strip()[-300:] or f'exit {code}'}; stopping the hosts already started")
            _stop_all(runs, now=True)
            return EXIT_HOST
        print(f"{run.host.name}: machine rank {run.rank}, run folder {run.folder}", flush=True)
    print(f"main process {main_ip}:{port}; {len(hosts)} machines × {job.launch.num_processes} "
          f"process(es) (the run goes on if this command or a connection ends)", flush=True)
    return follow_all(runs, reconnect_s=args.reconnect_s)


def follow_all(runs: list[HostRun], *, reconnect_s: float = 600.0) -> int:
    """Follow every host's run to its end; the exit status of the whole run."""
    signals = _Signals()
    previous = {s: signal.signal(s, signals.handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    out: queue.Queue[tuple[HostRun, dict[str, Any]]] = queue.Queue()
    stopping = threading.Event()
    followers = [Follower(r, out, reconnect_s, stopping) for r in runs]
    for f in followers:
        f.start()
    handled = 0
    failed: HostRun | None = None
    width = max(len(r.host.name) for r in runs)
    ended: set[int] = set()  # the ranks whose follower said "end" or "lost" (after all their lines)
    try:
        while len(ended) < len(runs):
            if signals.count > handled:
                handled = signals.count
                now = handled > 1
                _say(f"\n{signals.last}: " + ("killing every host's ranks now" if now else
                     "stopping every host — the ranks save a checkpoint first (Ctrl-C again: kill now)"))
                threading.Thread(target=_stop_all, args=(runs, now), daemon=True).start()
            try:
                run, msg = out.get(timeout=0.25)
            except queue.Empty:
                continue
            kind = msg.get("t")
            if kind == "log":
                with contextlib.suppress(BrokenPipeError):
                    print(f"{run.host.name:<{width}}| {_printable(str(msg.get('line', '')))}", flush=True)
            elif kind == "event" and run.rank == 0:
                _note(msg.get("event") or {})
            elif kind == "event" and (msg.get("event") or {}).get("type") == "error":
                _note(msg.get("event") or {}, run.host.name)
            elif kind == "reconnecting":
                _say(f"{run.host.name}: {msg.get('why')}; reconnecting in {msg.get('in'):g} s")
            elif kind in ("end", "lost"):
                ended.add(run.rank)
            state = str((run.final or {}).get("state", "")) if kind == "end" else ""
            if failed is None and (run.lost or state in ("failed", "killed")):
                failed = run
                why = run.lost or str((run.final or {}).get("summary") or state)
                _say(f"{run.host.name} (machine rank {run.rank}): {why} — killing the other hosts' ranks, "
                     f"which would otherwise wait for it in a collective")
                threading.Thread(target=_stop_all, args=([r for r in runs if r is not run], True),
                                 daemon=True).start()
    finally:
        stopping.set()
        for f in followers:
            f.close()
        for sig, old in previous.items():
            signal.signal(sig, old)
    for run in runs:
        final = run.final or {}
        _say(f"{run.host.name}: {final.get('summary') or final.get('state') or run.lost} "
             f"(run folder {run.folder})")
    if failed is not None:
        _say(f"the run failed on {failed.host.name}")
        return 1
    states = {str((r.final or {}).get("state")) for r in runs}
    return 0 if states <= {"finished", "stopped"} else 1


def _note(event: dict[str, Any], host: str = "") -> None:
    kind = event.get("type")
    where = f"{host}: " if host else ""
    if kind == "checkpoint_saving":
        _say(f"saving checkpoint-{event.get('step')}…")
    elif kind == "checkpoint_saved":
        _say(f"checkpoint-{event.get('step')} saved")
    elif kind == "error":
        _say(f"{where}error ({event.get('kind')}): {event.get('message')}")
    elif kind == "metrics" and event.get("step") is not None and event.get("loss") is not None:
        _say(f"step {event.get('step')}/{event.get('max_steps')} loss {event.get('loss')}")
