"""``gaudi-gui guard [--grace S] [--gaudi-gui] -- ARGV``: run ARGV and end it when stdin closes.

What the app starts on a host over SSH runs under this guard. OpenSSH does not signal a remote command
that has no pty when the client goes (a killed app, a dropped connection): the command only sees its
stdin close. The guard copies its stdin to the child's, and when it reaches EOF it gives the child
``--grace`` seconds to end by itself (the generate worker does on EOF), then SIGTERMs the child's
process group, then SIGKILLs the group and every descendant recorded, so an hl-smi loop or a worker
never outlives the connection. The child's stdout and stderr are the guard's own (nothing is buffered
in between); the guard exits with the child's status (128+N for a signal N).

``--gaudi-gui`` runs ``python -m gaudi_gui ARGV`` with the guard's own interpreter, so a remote command
such as ``docker exec -i C python3 -m gaudi_gui`` needs no second spelling of the python inside;
``--python`` runs ``python ARGV`` with it (``--python -- -m gaudi_gui.workers.generate``).
``--env NAME=VALUE`` (repeatable) sets a variable in the child's environment: variables set where the
ssh client runs do not cross the connection, so a host's device visibility (``HABANA_VISIBLE_MODULES``)
travels as arguments, each one checked (a plain variable name, no NUL) and never through a shell.
SIGTERM, SIGHUP and SIGINT to the guard end the child the same way. Qt-free, torch-free.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from gaudi_gui.core.proctree import ProcessTree
from gaudi_gui.core.remote import parse_env_assignments

#: After SIGTERM to the group, how long before SIGKILL.
TERM_GRACE_S = 3.0

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("guard", help="(for hosts) run a command and end it when stdin closes")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds the command may take to end by itself after stdin closed (default 5)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--gaudi-gui", dest="gaudi_gui", action="store_true",
                     help="ARGV is a gaudi-gui command line, run with this python")
    how.add_argument("--python", dest="python", action="store_true",
                     help="ARGV are arguments to this python (-m MODULE ...)")
    p.add_argument("--env", dest="env", action="append", metavar="NAME=VALUE",
                   help="set a variable in the command's environment (repeatable)")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="the command (after --)")


def run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("gaudi-gui guard: no command given (gaudi-gui guard -- PROGRAM ARGS…)", file=sys.stderr)
        return 2
    try:
        import psutil  # noqa: F401  (the guard tracks its child's tree with it: check before starting one)
    except ImportError:
        from gaudi_gui import __version__
        print(f"gaudi-gui guard: psutil is not installed in {sys.executable}, so a command started here "
              f"could outlive the connection; install gaudi-gui {__version__} with its dependencies "
              f"(gaudi-gui hosts --setup HOST on the workstation)", file=sys.stderr)
        return 3
    try:
        extra = parse_env_assignments(getattr(args, "env", None))
    except ValueError as exc:
        print(f"gaudi-gui guard: {exc}", file=sys.stderr)
        return 2
    if args.gaudi_gui:
        argv = [sys.executable, "-m", "gaudi_gui", *argv]
    elif getattr(args, "python", False):
        argv = [sys.executable, *argv]
    env = {**os.environ, **extra} if extra else None
    ending = threading.Event()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True, env=env)
    except OSError as exc:
        print(f"gaudi-gui guard: cannot run {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    tree = ProcessTree(proc.pid)  # start_new_session: the group id is the child's pid

    def end_child(grace: float) -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        if proc.poll() is None:
            tree.record()
            tree.signal(signal.SIGTERM)
            deadline = time.monotonic() + TERM_GRACE_S
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        tree.kill()  # the child, and helpers it left in its group or recorded

    def pump() -> None:
        assert proc.stdin is not None
        while True:
            try:
                data = os.read(0, 65536)
            except OSError:
                data = b""
            if not data:
                break
            try:
                proc.stdin.write(data)
                proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the child does not read stdin (hl-smi): keep watching for EOF
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()
        if not ending.is_set():
            ending.set()
            end_child(max(0.0, args.grace))

    def on_signal(_signum: int, _frame: Any) -> None:
        if not ending.is_set():
            ending.set()
            threading.Thread(target=end_child, args=(0.0,), daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    threading.Thread(target=pump, name="stdin", daemon=True).start()
    code = proc.wait()
    if not ending.is_set():
        ending.set()
        tree.kill()  # the child ended by itself: sweep what it left in its group
    sys.stdout.flush()
    return 128 - code if code < 0 else code
