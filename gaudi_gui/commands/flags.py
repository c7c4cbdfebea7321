"""Options that cannot go together: refused before anything starts, never silently ignored.

argparse knows which options exist, not which ones only mean something beside another (``--nodes``
without ``--slurm``, ``--json`` without ``--detach``) nor which ones one path of a command never reads
(``--cards`` with ``--slurm``). A user who gives such an option expects it to act; ignoring it starts
something other than what was asked. So every such pair is written here once, as a rule, and the
command line refuses the combination with one line and exit 2 (``cli.main`` calls ``refusal`` after
parsing and before any command runs).

Which options a user *gave* is read from a second parse in which every default is a marker, so an
option given with its default value (``--nodes 1``) counts as given, and abbreviations (``--part``)
resolve as argparse resolves them.

Values argparse's ``type=float`` lets through but no command can use (``nan``, ``inf``, 0 seconds)
are refused at parsing by the types here (``positive_seconds``), with the same one line and exit 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: An option not on the command line.
_UNSET = object()


@dataclass(frozen=True)
class Rule:
    """``flag`` of ``command`` ("*": every command that has it) needs one of ``needs`` beside it
    and none of ``excludes``; ``never``: the command takes it in no case. ``why``: the reason, said."""

    command: str
    flag: str
    needs: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    never: bool = False
    why: str = ""


_SLURM_ONLY = ("--nodes", "--partition", "--time", "--account", "--cards-per-node", "--gres", "--login",
               "--node-python", "--print-script", "--events")

RULES: tuple[Rule, ...] = (
    Rule("*", "--remote-command", needs=("--host", "--hosts"),
         why="it is the command that runs gaudi-gui on a host"),
    # train: one machine, one host (--host), several hosts (--hosts) or Slurm (--slurm)
    Rule("train", "--host", excludes=("--hosts", "--slurm"),
         why="a run goes to one place: --host (one host), --hosts (several) or --slurm"),
    Rule("train", "--hosts", excludes=("--slurm",),
         why="a run goes to one place: --host (one host), --hosts (several) or --slurm"),
    Rule("train", "--json", needs=("--detach",), why="it prints the detached run as JSON"),
    Rule("agent", "--json", needs=("--status",), why="it prints the agent's status as JSON"),
    Rule("agent", "--force", needs=("--stop",), why="it stops the agent while work runs"),
    Rule("train", "--detach", excludes=("--hosts",),
         why="--hosts starts every host's part detached already and follows them as one run"),
    Rule("train", "--print-script", excludes=("--detach",), why="--print-script submits nothing"),
    Rule("train", "--events", excludes=("--detach",),
         why="a detached Slurm run's events are in its run folder (`gaudi-gui runs follow` prints them)"),
    Rule("train", "--main-ip", needs=("--hosts",), why="it is the first host's address for the others"),
    Rule("train", "--reconnect-s", needs=("--host", "--hosts"),
         why="it is how long to reconnect to a host after the connection dropped"),
    Rule("train", "--resumed-from", excludes=("--hosts",),
         why="it names one run folder, and with --hosts each host has its own"),
    Rule("train", "--cards", excludes=("--slurm",),
         why="a Slurm job's cards are per node: --cards-per-node, --gres"),
    *(Rule("train", flag, needs=("--slurm",), why="it is a Slurm option") for flag in _SLURM_ONLY),
    # serve and eval: --detach puts the job in a run folder of the runs store (core.jobkind)
    Rule("serve", "--json", needs=("--detach",), why="it prints the detached job as JSON"),
    *(Rule(command, "--runs-dir", needs=("--detach",), why="only a detached job has a run folder")
      for command in ("serve", "eval", "download")),
    Rule("eval", "--fp8-max-rise", needs=("--fp8",), why="it is the FP8 comparison's threshold"),
    *(Rule(command, "--no-agent", excludes=("--detach",),
           why="a detached job runs under its own supervisor, never in this process")
      for command in ("train", "serve", "eval", "download")),
    # benchmark: --show prints a run that exists; it runs nothing
    *(Rule("benchmark", "--show", excludes=(flag,), why="--show prints an earlier benchmark; it runs nothing")
      for flag in ("--repeats", "--cards", "--device", "--size", "--detach", "--events", "--no-agent")),
    Rule("benchmark", "--no-agent", excludes=("--detach",),
         why="a detached job runs under its own supervisor, never in this process"),
    # generate: values that only sampling or a chat reads
    *(Rule("generate", flag, needs=("--do-sample",), why="greedy decoding does not sample")
      for flag in ("--temperature", "--top-p", "--top-k")),
    Rule("generate", "--system", needs=("--chat",), why="a system prompt goes into the chat template"),
    # hosts: one action at a time, and each action's own options
    Rule("hosts", "--host", excludes=("--add", "--remove", "--setup"),
         why="--host checks one host of the list; --add, --remove and --setup name their own host"),
    Rule("hosts", "--add", excludes=("--remove", "--setup"), why="one action at a time"),
    Rule("hosts", "--remove", excludes=("--setup",), why="one action at a time"),
    Rule("hosts", "--remote-command", needs=("--add", "--setup", "--host", "--preflight"),
         why="it is saved with the host --add saves, or used by --setup, on --host or on every "
             "--preflight host"),
    Rule("hosts", "--preflight", excludes=("--add", "--remove", "--setup", "--host", "--keep-job-meter"),
         why="one action at a time, and --preflight names its own hosts"),
    Rule("hosts", "--keep-job-meter", needs=("--host",), excludes=("--add", "--remove", "--setup"),
         why="it keeps the meter in host 0's run folder on --host"),
    *(Rule("hosts", flag, needs=("--preflight",), why="it is a --preflight option")
      for flag in ("--config", "--port", "--main-ip", "--host-command")),
    Rule("hosts", "--meter", needs=("--keep-job-meter",), why="it is the meter --keep-job-meter keeps"),
    Rule("hosts", "--timeout", excludes=("--preflight", "--keep-job-meter"),
         why="it is for the list of hosts (--preflight and --keep-job-meter give each host 60 s)"),
    Rule("hosts", "--hl-smi", needs=("--add",), why="it is saved with the host"),
    *(Rule("hosts", flag, needs=("--setup",), why="it is a --setup option")
      for flag in ("--venv", "--python", "--no-deps")),
    *(Rule("hosts", flag, excludes=("--add", "--remove", "--setup"),
           why="it is for the list of hosts, which --add, --remove and --setup do not print")
      for flag in ("--json", "--timeout")),
    # doctor and ls
    Rule("doctor", "--host", excludes=("--hosts",),
         why="doctor takes --host (one host) or --hosts (several), not both"),
    Rule("doctor", "--smoke-timeout", needs=("--smoke",), why="it limits the smoke test's children"),
    Rule("ls", "--hf-cache", excludes=("path",),
         why="--hf-cache lists the Hugging Face cache, not a folder"),
)


def positive_seconds(text: str) -> float:
    """An argparse ``type=`` for a duration in seconds: a finite number above 0.

    ``float()`` alone takes "nan", "inf" and "-1": a NaN timeout raises deep inside
    ``subprocess.communicate`` (a traceback, with the children already started), an infinite one
    overflows there, and 0 or less times out everything at once. Refused here, while parsing, with
    one line and exit 2 (``cli``'s parser prints argparse's error as one line)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def _chain(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> list[argparse.ArgumentParser]:
    """The parser and the subcommand parsers ``namespace`` went through, outermost first."""
    out = [parser]
    while True:
        subs = [a for a in out[-1]._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(namespace, subs[0].dest, None) if subs else None
        if not subs or not isinstance(name, str) or name not in subs[0].choices:
            return out
        out.append(subs[0].choices[name])


def _unset_defaults(parser: argparse.ArgumentParser) -> None:
    """Every default of ``parser`` and its subcommands becomes the marker (appending ones: None)."""
    parser._defaults.clear()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _unset_defaults(child)
        elif action.dest != argparse.SUPPRESS and action.default != argparse.SUPPRESS:
            action.default = None if isinstance(action, argparse._AppendAction) else _UNSET


def given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[argparse.ArgumentParser],
                                                                           dict[str, str]]:
    """The parsers ``argv`` goes through, and the options and positionals it gives: {its name
    (``--nodes``; a positional's dest, ``path``): its dest}. ``parser`` is changed: parse with it
    once before (its defaults become markers here)."""
    _unset_defaults(parser)
    namespace, _extras = parser.parse_known_args(list(argv))
    chain = _chain(parser, namespace)
    out: dict[str, str] = {}
    for p in chain:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction) or action.dest == argparse.SUPPRESS:
                continue
            value = getattr(namespace, action.dest, _UNSET)
            if value is _UNSET or (value is None and isinstance(action, argparse._AppendAction)):
                continue
            longest = max(action.option_strings, key=len) if action.option_strings else action.dest
            out[longest] = action.dest
    return chain, out


def refusal(parser: argparse.ArgumentParser,
            argv: Sequence[str]) -> tuple[argparse.ArgumentParser, str] | None:
    """The first rule ``argv`` breaks: (the subcommand's parser, one line saying why), else None.
    ``parser`` must have parsed ``argv`` without error already; it is changed (see ``given``)."""
    chain, flags = given(parser, argv)
    if len(chain) < 2:
        return None
    command = chain[1].prog.split()[-1]
    has = {o for p in chain for a in p._actions for o in a.option_strings}
    own = {r.flag for r in RULES if r.command == command}
    for rule in RULES:
        # A command's own rule for a flag replaces the rule every command has for it.
        applies = rule.command == command or (rule.command == "*" and rule.flag not in own)
        if rule.flag not in flags or not applies:
            continue
        if rule.never:
            return chain[-1], f"{command} takes no {rule.flag}: {rule.why}"
        if rule.needs and not any(n in flags for n in rule.needs):
            needs = [n for n in rule.needs if n in has] or list(rule.needs)
            return chain[-1], f"{rule.flag} needs {' or '.join(needs)}: {rule.why}"
        clash = next((e for e in rule.excludes if e in flags), None)
        if clash is not None:
            shown = clash if clash.startswith("-") else clash.upper()
            return chain[-1], f"{rule.flag} cannot go with {shown}: {rule.why}"
    return None


def add_detach_arguments(p: argparse.ArgumentParser, verb: str, *, always_a_run_folder: bool = False) -> None:
    """``--detach`` and ``--runs-dir``, as every kind's command takes them (``verb``: "serve" ...);
    ``always_a_run_folder``: the foreground job has one too (calibrate), so ``--runs-dir`` stands alone."""
    p.add_argument("--detach", action="store_true",
                   help=f"{verb} in the background under a supervisor with a run folder (it outlives this "
                        "shell, the app and an SSH connection), print the folder and return; follow it "
                        "with `gaudi-gui runs follow`, stop it with `gaudi-gui runs stop`")
    p.add_argument("--runs-dir", default="",
                   help=("where the run folder goes (default: the runs store)" if always_a_run_folder
                         else "with --detach: where the run folder goes"))


__all__ = ["RULES", "Rule", "add_detach_arguments", "given", "positive_seconds", "refusal"]
