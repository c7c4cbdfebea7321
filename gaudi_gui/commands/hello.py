"""``gaudi-gui hello --json``: the handshake a workstation runs on a host before it uses it.

One JSON object: gaudi-gui's version, the remote protocol, python, the platform, whether hl-smi is on
PATH, and the libraries' versions (torch, transformers …, read from package metadata: nothing is
imported, so the answer comes in well under a second). The environment probe proper (devices) is
``gaudi-gui env --json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hello", help="(for hosts) version and protocol handshake, as JSON")
    p.add_argument("--json", action="store_true", help="print JSON (the default; kept for symmetry)")
    p.add_argument("--path", action="append", default=[], metavar="PATH",
                   help="(pre-flight) report whether PATH exists here (repeatable)")
    p.add_argument("--port", type=int, default=0, metavar="N",
                   help="(pre-flight) report whether TCP port N can be listened on here")


def info() -> dict[str, object]:
    from gaudi_gui.core.remote import host_info
    return host_info()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def run(args: argparse.Namespace) -> int:
    answer = info()
    paths = getattr(args, "path", None) or []
    if paths:
        answer["paths"] = {p: os.path.exists(os.path.expanduser(p)) for p in paths}
    if getattr(args, "port", 0):
        answer["port_free"] = 0 < args.port < 65536 and port_free(args.port)
    print(json.dumps(answer, sort_keys=True), flush=True)
    return 0
