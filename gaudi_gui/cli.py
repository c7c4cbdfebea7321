"""``gaudi-gui`` command line: no arguments opens the window; subcommands script the same core code.

Each subcommand lives in ``gaudi_gui.commands.<name>`` with ``add_parser(subparsers)`` and
``run(args) -> int``. Subcommand modules are imported lazily so ``gaudi-gui`` (the GUI) never pays for
their imports, and so that no command path imports torch in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from gaudi_gui import __version__

#: subcommand name -> module under gaudi_gui.commands
COMMANDS = {
    "devices": "devices",
    "env": "env",
    "generate": "generate",
    "train": "train",
    "demo-model": "demo_model",
    "runs": "runs",
    "hosts": "hosts",
    "hello": "hello",
    "guard": "guard",
    "ls": "ls",
    "doctor": "doctor",
    "eval": "eval",
    "serve": "serve",
    "download": "download",
    "benchmark": "benchmark",
    "calibrate": "calibrate",
    "models": "models",
    "queue": "queue",
    "agent": "gaudi_gui.agent.main",
}
#: What runs on the host itself (the handshake and the guard): --host makes no sense for them.
_HOST_SIDE = ("hello", "guard", "agent")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # Usage errors exit 2 with one clear line (no usage block, never a traceback).
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` just that subcommand (the host-side commands: the handshake
    must answer on a host whose other dependencies are not installed yet, and fast)."""
    parser = _Parser(prog="gaudi-gui", description=(
        "Control panel for Intel Gaudi (and CUDA / CPU) machines. Without a subcommand it opens the "
        "window."))
    parser.add_argument("--version", action="version", version=f"gaudi-gui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in COMMANDS.items():
        if only is not None and name != only:
            continue
        _command_module(module).add_parser(sub)
        if name not in _HOST_SIDE:
            command = sub.choices[name]
            command.add_argument("--host", default="", metavar="DEST",
                                 help="run it on this host: an ssh destination as `ssh DEST` takes it "
                                      "(alias, user@host, host:port); default: this machine")
            command.add_argument("--remote-command", dest="remote_command", default="", metavar="CMD",
                                 help="the command that runs gaudi-gui on the host (default: the "
                                      "host's saved one, else 'python3 -m gaudi_gui')")
    return parser


def _command_module(name: str) -> Any:
    """A subcommand's module: a name under gaudi_gui.commands, or a dotted path (the agent's own)."""
    return importlib.import_module(name if "." in name else f"gaudi_gui.commands.{name}")


#: A command ended because its reader went away (``| head``): 128 + SIGPIPE, as a shell reports a
#: tool that SIGPIPE ended.
EXIT_READER_GONE = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """``gaudi-gui ARGV`` (``argv`` None: this process's own arguments, the console script's and
    ``python -m gaudi_gui``'s entry); its exit status."""
    own_process = argv is None
    if own_process:
        # Ctrl-C must stop every command and the window, whoever started this process: a parent that
        # ignores SIGINT (a script's background job, nohup under some CI runners) passes SIG_IGN on,
        # and Python then installs no KeyboardInterrupt handler. Not for an in-process call (tests):
        # the caller's own disposition is not ours to change.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
        # What is still buffered goes now, where a reader that left is caught below, rather than at
        # the interpreter's exit (which says "Exception ignored ... BrokenPipeError" and exits 120).
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader of our output went away (`gaudi-gui runs list | head`): nothing more can be said
        # to it and nothing is wrong. Every command ends here quietly; their finally blocks have run.
        if own_process:
            _drop_stdout()
        return EXIT_READER_GONE


def _drop_stdout() -> None:
    """Point file descriptor 1 at /dev/null: the interpreter flushes stdout once more at exit, and
    that write must not fail again on the closed pipe."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _main(args_list: list[str]) -> int:
    if not args_list:
        # The GUI path stays lean: no subcommand modules, no argparse tree.
        return _gui()
    # Anything else goes through the parser, so an unknown option (``gaudi-gui --bogus``) is a usage
    # error (exit 2, one line) instead of silently opening the window.
    # Only the named command's parser: building all of them imports every command module (0.9 s of
    # a 1.3 s `gaudi-gui models` here); `gaudi-gui --help` and unknown words still get the whole tree.
    parser = build_parser(args_list[0] if args_list[0] in COMMANDS else None)
    args, extras = parser.parse_known_args(args_list)
    if extras:
        message = f"unrecognized arguments: {' '.join(extras)}"
        dashed = next((e for e in extras if e.startswith("-") and e != "-"), None)
        if dashed and args.command and "--" not in args_list:
            # A folder named "-dir" looks like an option; say how to pass it as a path.
            message += (f"; a path that begins with '-' goes after '--' "
                        f"(gaudi-gui {args.command} -- {dashed}) or as ./{dashed}")
        parser.error(message)
    from gaudi_gui.commands import flags
    # Options that cannot go together are refused here, before any command starts anything.
    refused = flags.refusal(parser, args_list)
    if refused is not None:
        refused[0].error(refused[1])
    if args.command is None:
        return _gui()
    if args.command == "train" and getattr(args, "slurm", False):
        from gaudi_gui.commands import slurm_run
        try:
            return slurm_run.train(args)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
    if args.command == "train" and (getattr(args, "hosts", "") or "").strip():
        from gaudi_gui.commands import multi_host
        return multi_host.train(args)
    target = (getattr(args, "host", "") or "").strip()
    # eval places itself (core.placement) and reads its events back from the host.
    if target and target != "local" and args.command not in ("hosts", "doctor", "eval", "serve", "queue"):
        return _on_host(args, args_list)
    module = _command_module(COMMANDS[args.command])
    try:
        return int(module.run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _gui() -> int:
    from gaudi_gui.app import run_gui
    try:
        return run_gui([])
    except KeyboardInterrupt:
        # Ctrl-C before the window could take it over (while Qt and the views were still loading);
        # once it is up, Ctrl-C closes it as its close button does (app.run_gui).
        print("interrupted", file=sys.stderr)
        return 130


def _on_host(args: argparse.Namespace, args_list: list[str]) -> int:
    from gaudi_gui.commands import remote_run
    from gaudi_gui.core.remote import HostError, find_host
    try:
        host = find_host(args.host, args.remote_command)
    except HostError as exc:
        print(f"gaudi-gui {args.command}: --host: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "train":
            return remote_run.train(host, args)
        if args.command == "runs" and args.runs_action == "open":
            # The dashboard serves on the host; its port is forwarded here on the same connection.
            from gaudi_gui.commands import runs_open
            return runs_open.on_host(host, args)
        if args.command == "runs" and args.runs_action == "fetch":
            # Brought here over the host's connection (the run's records and its profile trace).
            from gaudi_gui.commands import runs
            return runs.fetch_from(host, args)
        if args.command == "runs" and args.runs_action == "push":
            # Sent there over the host's connection (an FP8 calibration, for serving on that host).
            from gaudi_gui.commands import runs
            return runs.push_to(host, args)
        if args.command == "runs" and args.runs_action == "follow":
            # Following a run on a host reconnects after a dropped connection (the run goes on).
            return remote_run.follow(host, args.run, reconnect_s=600.0)
        return remote_run.forward(host, remote_run.strip_host_options(args_list))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
