"""``gaudi-gui hosts [--json]``: every host the app knows ("local", the saved ones, the aliases of
~/.ssh/config), each checked at once: reachable, its gaudi-gui version, device kind and card count.

``--add DEST [--remote-command CMD] [--hl-smi PATH]`` saves a host, ``--remove DEST`` forgets one.
``--setup DEST [--venv PATH] [--python PY] [--no-deps]`` installs this gaudi-gui version into a venv on
the host (``core/host_setup.py``) and saves the host with that venv's python as its remote command.
Exit 0 when every host checked answered, 1 when one did not (the reason is in the table / JSON).

Two pieces of a training run on several hosts, for the agent to run as its children (the window starts
no thread, issue 38), each one answer (``--json``: one JSON object):
``--preflight A,B[,…] --config FILE [--port N] [--main-ip IP] [--host-command HOST=CMD]…`` is the
pre-flight ``train --hosts`` runs before it starts anything (``core.multi_host.preflight``: every host
reachable with this gaudi-gui, the same library versions, the job's paths on every host, the main port
free on host 0) and host 0's address as the others reach it: ``{"main_ip", "problems"}``, exit 0 when
nothing stops the run, 1 when something does. ``--host H --keep-job-meter FOLDER --meter FILE`` keeps the
whole job's meter in host 0's run FOLDER on H (``runs job-meter`` there): ``{"kept", "said"}``, exit 0
when kept, 1 when not. Bad input exits 2 with one line, before any connection.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gaudi_gui.core import remote
from gaudi_gui.core.remote import Host, HostError, RemoteError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hosts", help="the hosts the app can use, each checked (reachable, version, cards)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.add_argument("--add", metavar="DEST", default="", help="save a host (an ssh destination)")
    p.add_argument("--hl-smi", dest="hl_smi", default="", help="with --add: hl-smi's path on the host")
    p.add_argument("--remove", metavar="DEST", default="", help="forget a saved host")
    p.add_argument("--setup", metavar="DEST", default="",
                   help="install this gaudi-gui version on the host (a venv that sees the host's torch)")
    p.add_argument("--venv", default="", metavar="PATH",
                   help="with --setup: the venv on the host (default ~/.local/share/gaudi-gui/venv)")
    p.add_argument("--python", default="", metavar="PY",
                   help="with --setup: the host's Python to make the venv from (default: the remote "
                        "command's, else python3)")
    p.add_argument("--no-deps", dest="no_deps", action="store_true",
                   help="with --setup: install gaudi-gui only (the host's Python already has its "
                        "dependencies, or has no access to a package index)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds each host may take (default 20)")
    p.add_argument("--preflight", metavar="A,B[,…]", default="",
                   help="the pre-flight of a training run on these hosts (train --hosts's: reachable, the "
                        "same versions, the job's paths, the main port free on host 0) and host 0's address "
                        "as the others reach it")
    p.add_argument("--config", default="", metavar="FILE",
                   help="with --preflight: the job file (- reads it on stdin)")
    p.add_argument("--port", type=int, default=0, metavar="N",
                   help="with --preflight: the main process port (default: the job's, else 29500)")
    p.add_argument("--main-ip", dest="main_ip", default="", metavar="IP",
                   help="with --preflight: host 0's address for the others (default: ssh's resolution of it)")
    p.add_argument("--host-command", dest="host_commands", action="append", default=[], metavar="HOST=CMD",
                   help="with --preflight: the command that runs gaudi-gui on HOST (default: the saved "
                        "host's, or --remote-command's); once per host")
    p.add_argument("--keep-job-meter", dest="keep_job_meter", default="", metavar="FOLDER",
                   help="keep a run of several hosts' whole job meter in host 0's run FOLDER on --host, so "
                        "that `runs show` there says the whole job")
    p.add_argument("--meter", default="", metavar="FILE",
                   help="with --keep-job-meter: the whole job's meter, a JSON object (- reads it on stdin)")


def check(host: Host, timeout: float) -> dict[str, Any]:
    """{name, reachable, gaudi_gui, device, cards, error, kind} for one host."""
    out: dict[str, Any] = {"name": host.name, "remote_command": "" if host.is_local else host.remote_command,
                           "reachable": False, "gaudi_gui": None, "device": None, "cards": 0, "error": "",
                           "source": host.source}
    try:
        info = remote.handshake(host, timeout=timeout)
        out["reachable"] = True
        out["gaudi_gui"] = info.get("gaudi_gui")
        # The host's saved hl-smi travels with every command run there (Host.gaudi_gui_argv).
        code, text, err = remote.call(host, host.gaudi_gui_argv("devices", "--json"), timeout=timeout)
        cards = json.loads(text) if text.strip() else []
        accel = [c for c in cards if isinstance(c, dict) and c.get("kind") in ("hpu", "cuda")]
        out["cards"] = len(accel)
        out["device"] = accel[0]["kind"] if accel else "cpu"
        if code not in (0,) and not accel:
            out["error"] = err.strip().splitlines()[-1] if err.strip() else f"devices exited {code}"
    except RemoteError as exc:
        out["reachable"] = exc.kind not in ("auth", "hostkey", "unreachable", "dropped", "ssh")
        out["error"] = str(exc)
        out["kind"] = exc.kind
    except ValueError as exc:
        out["error"] = f"devices printed no JSON: {exc}"
    return out


def _setup(args: argparse.Namespace) -> int:
    from gaudi_gui.core import host_setup
    try:
        host = remote.find_host(args.setup, getattr(args, "remote_command", "") or "")
        host_setup.setup(host, venv=args.venv or host_setup.DEFAULT_VENV, python=args.python,
                         deps=not args.no_deps, say=lambda line: print(line, flush=True))
    except HostError as exc:
        print(f"gaudi-gui hosts --setup: {exc}", file=sys.stderr)
        return 2
    except (RemoteError, host_setup.SetupError, OSError) as exc:
        print(f"gaudi-gui hosts --setup: {exc}", file=sys.stderr)
        return 1
    return 0


def _forget(name: str, saved: list[Host]) -> list[Host]:
    """``saved`` without the host called ``name``; HostError naming the saved ones when none is: a
    mistyped name must not pass for a host forgotten."""
    if all(h.name != name for h in saved):
        known = ", ".join(h.name for h in saved) or "none"
        raise HostError(f"--remove: no saved host is called {name!r} (saved hosts: {known})")
    return [h for h in saved if h.name != name]


def _say_bad(action: str, why: str) -> int:
    print(f"gaudi-gui hosts {action}: {why}", file=sys.stderr)
    return 2


def _preflight_hosts(args: argparse.Namespace) -> list[Host]:
    """--preflight's hosts, each with the command that runs gaudi-gui there; HostError (one line)."""
    from gaudi_gui.core import multi_host
    hosts = multi_host.parse_hosts(args.preflight, "--preflight")
    common = (getattr(args, "remote_command", "") or "").strip()
    own: dict[str, str] = {}
    for item in args.host_commands:
        name, sep, command = item.partition("=")
        name = name.strip()
        if not sep or not name or not command.strip():
            raise HostError(f"--host-command: expected HOST=CMD, not {item!r}")
        if name not in [h.name for h in hosts]:
            raise HostError(f"--host-command names {name!r}, which is not one of --preflight's hosts")
        if name in own:
            raise HostError(f"--host-command names {name!r} twice")
        own[name] = command.strip()
    return [remote.find_host(h.name, own.get(h.name, common)) if h.name in own or common else h
            for h in hosts]


def _preflight(args: argparse.Namespace) -> int:
    from gaudi_gui.core import multi_host
    from gaudi_gui.core.jobconfig import JobConfigError, load_job
    try:
        hosts = _preflight_hosts(args)
        if not args.config:
            raise ValueError("needs --config (the job file, or - for the job on stdin)")
        job = load_job(args.config)
        port = int(args.port or job.launch.main_process_port or multi_host.DEFAULT_PORT)
        if not 0 < port < 65536:
            raise ValueError(f"the main process port must be 1-65535, not {port}")
    except (HostError, JobConfigError, ValueError) as exc:
        return _say_bad("--preflight", str(exc))
    address, problems = multi_host.preflight_answer(hosts, job, port, args.main_ip.strip())
    if args.json:
        print(json.dumps({"main_ip": address, "problems": problems}), flush=True)
    else:
        print(f"main process {address}:{port}", flush=True)
        for line in problems:
            print(f"pre-flight: {line}", flush=True)
        if not problems:
            print(f"pre-flight: nothing stops the run on {', '.join(h.name for h in hosts)}", flush=True)
    return 1 if problems else 0


def _read_meter(name: str) -> dict[str, Any]:
    """--meter's JSON object (``-``: stdin); ValueError with one line."""
    if not name:
        raise ValueError("needs --meter (the whole job's meter as JSON, or - for it on stdin)")
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--meter: cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    where = "stdin" if name == "-" else name
    try:
        meter = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--meter: {where} is not JSON: {exc}") from None
    if not isinstance(meter, dict):
        raise ValueError(f"--meter: {where} is not a JSON object")
    return meter


def _keep_job_meter(args: argparse.Namespace) -> int:
    from gaudi_gui.core import multi_host
    folder = args.keep_job_meter
    try:
        host = remote.find_host(args.host, getattr(args, "remote_command", "") or "")
        if not folder.startswith("/"):
            raise ValueError(f"FOLDER must be the run folder's absolute path on the host, not {folder!r}")
        meter = _read_meter(args.meter)
    except (HostError, ValueError) as exc:
        return _say_bad("--keep-job-meter", str(exc))
    kept, said = multi_host.keep_job_meter_answer(host, folder, meter)
    print(json.dumps({"kept": kept, "said": said}) if args.json else said, flush=True)
    return 0 if kept else 1


def run(args: argparse.Namespace) -> int:
    if args.preflight:
        return _preflight(args)
    if args.keep_job_meter:
        return _keep_job_meter(args)
    if args.setup:
        return _setup(args)
    if args.add or args.remove:
        try:
            if args.add:
                host = Host.parse(args.add, getattr(args, "remote_command", "") or "", args.hl_smi)
                remote.update_hosts(lambda saved: [h for h in saved if h.name != host.name] + [host])
            else:
                remote.check_destination(args.remove)
                remote.update_hosts(functools.partial(_forget, args.remove.strip()))
        except HostError as exc:
            print(f"gaudi-gui hosts: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"gaudi-gui hosts: cannot save the host list: {exc}", file=sys.stderr)
            return 1
        return 0
    hosts = remote.all_hosts()
    only = getattr(args, "host", "") or ""
    if only:
        try:
            hosts = [remote.find_host(only, getattr(args, "remote_command", "") or "")]
        except HostError as exc:
            print(f"gaudi-gui hosts: {exc}", file=sys.stderr)
            return 2
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        rows = list(pool.map(lambda h: check(h, args.timeout), hosts))
    if args.json:
        print(json.dumps(rows), flush=True)
    else:
        for row in rows:
            what = (f"{row['device']} × {row['cards']}" if row["device"] not in (None, "cpu")
                    else row["device"] or "-")
            state = "ok" if row["reachable"] and not row["error"] else row["error"]
            print(f"{row['name']:<24} {row['gaudi_gui'] or '-':<8} {what:<10} {state}")
    return 0 if all(r["reachable"] and not r["error"] for r in rows) else 1
