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
import json
from concurrent.futures import ThreadPoolExecutor

from gaudi_gui.commands.remote_run import EXIT_HOST, HostRun, follow_all, host_options, stop_runs
from gaudi_gui.commands.terminal import say as _say
from gaudi_gui.core import remote, visibility
from gaudi_gui.core.multi_host import host_jobs, main_address, parse_host_cards, parse_hosts, preflight
from gaudi_gui.core.remote import HostError, RemoteError


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
    # --overwrite-output travels in the job: the host's own `train` decides (the folder is there).
    job.overwrite_output = job.overwrite_output or bool(getattr(args, "overwrite_output", False))
    from gaudi_gui.commands.profile_flag import apply_profile_steps
    apply_profile_steps(job, args)
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
            stop_runs(runs, now=True)
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
            stop_runs(runs, now=True)
            return EXIT_HOST
        print(f"{run.host.name}: machine rank {run.rank}, run folder {run.folder}", flush=True)
    print(f"main process {main_ip}:{port}; {len(hosts)} machines × {job.launch.num_processes} "
          f"process(es) (the run goes on if this command or a connection ends)", flush=True)
    code = follow_all(runs, reconnect_s=args.reconnect_s)
    if job.profile_steps and code == 0:
        from gaudi_gui.commands.remote_run import bring_profile
        bring_profile(runs[0].host, runs[0].folder)  # rank 0 profiles: its run holds the trace
    return code
