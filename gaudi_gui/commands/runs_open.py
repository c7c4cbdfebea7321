"""``gaudi-gui runs open RUN --tensorboard|--trackio [--no-browser] [--json] [--port N] [--python PY]``:
the run in TensorBoard's or trackio's own dashboard (``core.dashboard``).

The run is exported where the dashboard reads it, the dashboard starts on a free port of 127.0.0.1
(``--port``: that one), and once its page answers the URL at the run is printed and opened in the
browser (not with ``--no-browser``). The dashboard then serves until this command ends (Ctrl-C, SIGTERM,
or, when stdin is a pipe or a socket, stdin closing: the app and ssh end it that way); it is not a job
that outlives its command. Each further line on stdin names another run (a folder or a name) to open in
the same dashboard: one more URL line each (the app's "Open in …" reuses one dashboard per kind this
way). ``--json``: one JSON line per open, ``{"t": "opened", "url", "port", "run", "kind", "exported",
"seconds", "reused"}`` or ``{"t": "error", "message"}``.

``--python PY``: the Python that serves the dashboard (default: this one, or $GAUDI_GUI_DASHBOARD_PYTHON),
for a tensorboard or trackio installed in another environment. Missing there: said with the pip
command, exit 2. A dashboard that ends before its page answers (a port taken, a crash): its exit status
and last lines, exit 1.

With ``--host DEST`` the run folder is the host's: the export and the dashboard run on the host (this
command there, over the multiplexed ssh connection), and the dashboard's port is forwarded to a free
port here on the same connection (``ssh -O forward``); the URL printed is this machine's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import sys
import threading
from typing import Any

from gaudi_gui.core import dashboard
from gaudi_gui.core.placement import Forward
from gaudi_gui.core.remote import Host, ssh_base, ssh_target
from gaudi_gui.core.runstore import Run

#: The Python that serves the dashboards when --python is not given.
PYTHON_VAR = "GAUDI_GUI_DASHBOARD_PYTHON"


def add_parser(action: argparse._SubParsersAction) -> None:
    p = action.add_parser("open", help="open a run in TensorBoard or trackio (served on 127.0.0.1 until "
                                       "this command ends)")
    p.add_argument("run")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tensorboard", dest="dashboard", action="store_const", const="tensorboard",
                       help="TensorBoard (python -m tensorboard.main over the runs folder)")
    which.add_argument("--trackio", dest="dashboard", action="store_const", const="trackio",
                       help="trackio's dashboard (project gaudi-gui, in the runs folder's .trackio)")
    p.add_argument("--no-browser", dest="browser", action="store_false",
                   help="print the URL only (do not open a browser)")
    p.add_argument("--json", action="store_true", help="one JSON line per open (for a program)")
    p.add_argument("--port", type=int, default=0, metavar="N",
                   help="serve on this port of 127.0.0.1 (default: a free one)")
    p.add_argument("--python", default="", metavar="PY",
                   help=f"the Python with tensorboard/trackio (default: ${PYTHON_VAR}, else this one)")


def _say(args: argparse.Namespace, message: dict[str, Any]) -> None:
    if args.json:
        line = json.dumps(message)
    elif message["t"] == "opened":
        label = dashboard.LABELS[message["kind"]]
        line = (f"{label}: {message['url']}\n  {message['exported']}\n  "
                + ("the same dashboard, the run added" if message["reused"] else
                   f"serving on 127.0.0.1:{message['port']} until this command ends (Ctrl-C); "
                   "the dashboard is not kept after it"))
    else:
        print(f"gaudi-gui runs open: {message['message']}", file=sys.stderr, flush=True)
        return
    print(line, flush=True)


def stdin_hangs_up() -> bool:
    """Whether stdin's end means "the owner went away": a pipe or a socket (the app, ssh), as ``runs
    follow`` decides it; /dev/null, a file or a terminal never end the dashboard."""
    import stat
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _browse(url: str, args: argparse.Namespace) -> None:
    """Open the browser at ``url`` and say whether one opened (webbrowser's answer: False where no
    browser can be started here, a server over ssh, a $BROWSER that fails). ``--json``: nothing said
    (the URL line is the answer; the app asks for no browser)."""
    import webbrowser
    opened = False
    with contextlib.suppress(Exception):  # no browser here (a server, ssh): the URL is printed
        opened = bool(webbrowser.open(url))
    if not args.json:
        print("  opened in the browser" if opened else
              "  no browser could be opened here: open the address above", flush=True)


def run(found: Run, args: argparse.Namespace, find: Any) -> int:
    """``runs open`` on this machine. ``find(text)``: a run by folder or name (stdin's further runs)."""
    kind = args.dashboard
    python = args.python or os.environ.get(PYTHON_VAR, "") or sys.executable
    if args.port and not 0 < args.port < 65536:
        _say(args, {"t": "error", "message": f"--port {args.port}: a port is 1-65535"})
        return 2
    boards = dashboard.Dashboards(python)
    ended = threading.Event()
    lines: queue.Queue[str | None] = queue.Queue()

    def on_signal(_sig: int, _frame: object) -> None:
        ended.set()
        lines.put(None)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            opened = boards.open(kind, found, port=args.port, stop=ended.is_set)
        except dashboard.DashboardError as exc:
            _say(args, {"t": "error", "message": str(exc)})
            return 2 if "pip install" in str(exc) else 1
        _say(args, {"t": "opened", **opened.to_dict()})
        if args.browser:
            _browse(opened.url, args)
        if stdin_hangs_up():
            def read_stdin() -> None:
                with contextlib.suppress(OSError, ValueError):
                    for line in sys.stdin:
                        lines.put(line.strip())
                lines.put(None)

            threading.Thread(target=read_stdin, name="stdin", daemon=True).start()
        while not ended.is_set():
            try:
                text = lines.get(timeout=0.5)
            except queue.Empty:
                board = boards.running.get(kind)
                if board is None or not board.alive():
                    code = board.child.poll() if board is not None and board.child is not None else None
                    _say(args, {"t": "error", "message": (board.failure(code).replace(
                        "before its page answered", "while serving") if board is not None else
                        f"{dashboard.LABELS[kind]} is gone")})
                    return 1
                continue
            if text is None:
                break
            if not text:
                continue
            other = find(text)
            if other is None:
                _say(args, {"t": "error", "message": f"no run {text!r}"})
                continue
            try:
                again = boards.open(kind, other, stop=ended.is_set)
            except dashboard.DashboardError as exc:
                _say(args, {"t": "error", "message": str(exc)})
                continue
            _say(args, {"t": "opened", **again.to_dict()})
            if args.browser:
                _browse(again.url, args)
        return 0
    finally:
        boards.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _forward(host: Host, forward: Forward, cancel: bool = False) -> tuple[int, str]:
    """``ssh -O forward|cancel`` on the multiplexed connection: (exit status, what ssh said)."""
    import subprocess
    argv = [*ssh_base(host.name), "-O", "cancel" if cancel else "forward", *forward.ssh_option(), "--",
            ssh_target(host.name)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 255, str(exc)
    return done.returncode, (done.stderr or done.stdout).strip()


def on_host(host: Host, args: argparse.Namespace) -> int:
    """``runs open RUN --host DEST``: this command runs on the host (it exports the run and serves the
    dashboard on the host's 127.0.0.1) over the multiplexed connection, and the dashboard's port is
    forwarded to a free port here on that connection; the URL printed is this machine's. Ends (and the
    host's dashboard with it: its stdin closes) at Ctrl-C or SIGTERM."""
    import time

    from gaudi_gui.core.child import Child
    from gaudi_gui.core.serve import pick_free_port
    kind = args.dashboard
    remote_args = ["runs", *(["--runs-dir", args.runs_dir] if args.runs_dir else []), "open", args.run,
                   f"--{kind}", "--no-browser", "--json", *(["--port", str(args.port)] if args.port else []),
                   *(["--python", args.python] if args.python else [])]

    def decode(line: str) -> dict[str, Any] | None:
        line = line.strip()
        value = json.loads(line) if line.startswith("{") else None
        return value if isinstance(value, dict) else None

    ended = threading.Event()
    previous = {s: signal.signal(s, lambda _sig, _frame: ended.set())
                for s in (signal.SIGINT, signal.SIGTERM)}
    child: Child | None = None
    forward: Forward | None = None
    try:
        try:
            child = Child(host.wrap(host.gaudi_gui_argv(*remote_args)), decode=decode, stdin=True)
        except OSError as exc:
            _say(args, {"t": "error", "message": f"cannot start ssh: {exc.strerror or exc}"})
            return 3
        message: dict[str, Any] | None = {}
        while message == {} and not ended.is_set():
            message = child.next_message(0.5)
        if ended.is_set():
            return 130
        if not message or message.get("t") != "opened":
            code = child.wait(10)
            why = (message or {}).get("message") or child.tail_text(6) or "it wrote nothing"
            _say(args, {"t": "error", "message": f"on {host.name}: {why} (exit status {code})"})
            return 2 if "pip install" in str(why) else 1
        remote_port = int(message["port"])
        forward = Forward(pick_free_port(), remote_port)
        code, said = 255, ""
        for attempt in range(1, 4):
            code, said = _forward(host, forward)
            if code == 0:
                break
            time.sleep(attempt)  # a master connection still starting answers 255 for a moment
        if code != 0:
            forward = None
            _say(args, {"t": "error", "message": f"the forward of the dashboard's port {remote_port} on "
                                                 f"{host.name} failed (ssh exit {code}: {said})"})
            return 1
        url = str(message["url"]).replace(f":{remote_port}/", f":{forward.local_port}/", 1)
        _say(args, {**message, "url": url, "port": forward.local_port, "remote_port": remote_port,
                    "exported": f"on {host.name}: {message.get('exported', '')}"})
        if args.browser:
            _browse(url, args)
        while not ended.is_set():
            message = child.next_message(0.5)
            if message is None:  # the host's command ended (the connection dropped, its dashboard died)
                code = child.wait(5)
                _say(args, {"t": "error", "message": f"the dashboard on {host.name} ended (exit status "
                                                     f"{code}): {child.tail_text(6) or 'no output'}"})
                return 1
            if message.get("t") == "error":
                _say(args, message)
        return 0
    finally:
        if forward is not None:
            _forward(host, forward, cancel=True)
        if child is not None:
            child.close_stdin()  # the host's command ends its dashboard and itself
            if child.wait(10) is None:
                child.end(5.0)
            child.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
