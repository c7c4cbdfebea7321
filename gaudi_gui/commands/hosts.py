"""``gaudi-gui hosts [--json]``: every host the app knows ("local", the saved ones, the aliases of
~/.ssh/config), each checked at once: reachable, its gaudi-gui version, device kind and card count.

``--add DEST [--remote-command CMD] [--hl-smi PATH]`` saves a host, ``--remove DEST`` forgets one.
``--setup DEST [--venv PATH] [--python PY] [--no-deps]`` installs this gaudi-gui version into a venv on
the host (``core/host_setup.py``) and saves the host with that venv's python as its remote command.
Exit 0 when every host checked answered, 1 when one did not (the reason is in the table / JSON).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from concurrent.futures import ThreadPoolExecutor
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


def run(args: argparse.Namespace) -> int:
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
