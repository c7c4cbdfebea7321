"""No option of the command line is silently ignored: every combination that cannot go together is
refused with one line and exit 2, before anything starts (no child process, no connection).

The combinations come from three places, so a new subcommand or option is covered without editing this
file where the parser itself says enough:
- the parser (``cli.build_parser``), walked: every option whose help or group title says
  "with --X" is given without --X; every argparse mutually exclusive group is given two of its options;
  every subcommand that has ``--remote-command`` is given it without a host;
- every rule of ``gaudi_gui.commands.flags.RULES``, broken once;
- an explicit table of pairs (below), the contract as a user reads it.
And the other way: combinations that go together are not refused."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from gaudi_gui import cli
from gaudi_gui.commands import flags
from tests.helpers import refuse_starting

NO_JOB = "/nonexistent/job.json"
#: Values for required options, so that the command would get as far as the flags check.
REQUIRED = {"--config": NO_JOB, "--prompt": "hi"}
#: How a help text or a group title says an option only acts beside another: "with --detach: …",
#: "(with --do-sample)", "Slurm (with --slurm)".
WITH = re.compile(r"(?:^|\()with (--[a-z][\w-]*)")


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal comes before anything starts: a child process or a connection fails the test."""
    refuse_starting(monkeypatch)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``gaudi-gui ARGV`` in this process: (exit status, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def value(action: argparse.Action) -> list[str]:
    """A plausible value for ``action`` (none for a switch)."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    if action.option_strings and max(action.option_strings, key=len) == "--hosts":
        return ["gg-a,gg-b"]
    if action.type in (int, float) or getattr(action.type, "__name__", "") in ("seconds", "_grace"):
        return ["1"]
    return ["x"]


def name(action: argparse.Action) -> str:
    return max(action.option_strings, key=len) if action.option_strings else action.dest


class Level:
    """One parser on a command's path (``runs``, then ``runs show``) and what it needs to parse."""

    def __init__(self, parser: argparse.ArgumentParser, word: str) -> None:
        self.parser, self.word = parser, word
        self.actions = [a for a in parser._actions
                        if not isinstance(a, (argparse._HelpAction, argparse._VersionAction,
                                              argparse._SubParsersAction))
                        and a.help != argparse.SUPPRESS and a.nargs != argparse.REMAINDER]

    def required(self) -> list[str]:
        out: list[str] = []
        for a in self.actions:
            if a.option_strings and a.required:
                out += [name(a), REQUIRED.get(name(a), "x")]
        # A required one-of group (``runs open``: --tensorboard or --trackio): its first member.
        for group in self.parser._mutually_exclusive_groups:
            if group.required:
                first = next(a for a in group._group_actions if a.option_strings)
                out += [name(first), *value(first)]
        return out

    def positionals(self, skip: str = "") -> list[str]:
        return [v for a in self.actions if not a.option_strings and a.nargs not in ("?", "*")
                and a.dest != skip for v in value(a)]


def paths(parser: argparse.ArgumentParser, above: tuple[Level, ...] = ()) -> Iterator[tuple[Level, ...]]:
    """Every command path: (level for ``train``), (``runs``, ``runs list``), …"""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield above
        return
    for word, child in subs[0].choices.items():
        yield from paths(child, (*above, Level(child, word)))


def argv_for(path: tuple[Level, ...], level: Level, given: list[str]) -> list[str]:
    """The command line of ``path`` with ``given`` at ``level`` (and what each level requires)."""
    out: list[str] = []
    for lv in path:
        out += [lv.word, *lv.required(), *(given if lv is level else [])]
    return out + path[-1].positionals()


def all_paths() -> list[tuple[Level, ...]]:
    return list(paths(cli.build_parser()))


def find(path: tuple[Level, ...], flag: str) -> tuple[Level, argparse.Action] | None:
    for lv in path:
        for a in lv.actions:
            if flag in a.option_strings or (not a.option_strings and a.dest == flag):
                return lv, a
    return None


def cases_from_the_parser() -> list[tuple[list[str], str]]:
    cases: list[tuple[list[str], str]] = []
    for path in all_paths():
        for lv in path:
            titled = {id(a): g.title or "" for g in lv.parser._action_groups for a in g._group_actions}
            for a in lv.actions:
                if not a.option_strings:
                    continue
                said = WITH.search(a.help or "") or WITH.search(titled.get(id(a), ""))
                if said and said.group(1) not in a.option_strings:
                    cases.append((argv_for(path, lv, [name(a), *value(a)]), name(a)))
            for group in lv.parser._mutually_exclusive_groups:
                pair = [a for a in group._group_actions if a.option_strings][:2]
                if len(pair) == 2:
                    given = [v for a in pair for v in (name(a), *value(a))]
                    cases.append((argv_for(path, lv, given), "not allowed with"))
            if lv is path[0] and find(path, "--remote-command"):
                given = ["--remote-command", "py -m gaudi_gui"]
                cases.append((argv_for(path, lv, given), "--remote-command"))
    return cases


def cases_from_the_rules() -> list[tuple[list[str], str]]:
    cases: list[tuple[list[str], str]] = []
    for rule in flags.RULES:
        for path in all_paths():
            if rule.command not in ("*", path[0].word) or find(path, rule.flag) is None:
                continue
            if rule.command == "*" and any(r.command == path[0].word and r.flag == rule.flag
                                           for r in flags.RULES):
                continue  # the command's own rule for the flag replaces this one
            lv, action = find(path, rule.flag)  # type: ignore[misc]
            given = [name(action), *value(action)]
            argv = argv_for(path, lv, given)
            if rule.excludes:
                other = find(path, rule.excludes[0])
                assert other is not None and other[0] is lv, (rule, path[0].word)
                if other[1].option_strings:
                    argv = argv_for(path, lv, [*given, name(other[1]), *value(other[1])])
                else:
                    argv.append("/tmp")  # the positional it cannot go with
            cases.append((argv, rule.flag))
    return cases


#: The contract as a user reads it: (command line, what the one line must say).
PAIRS: list[tuple[list[str], str]] = [
    (["train", "--config", NO_JOB, "--nodes", "2"], "--nodes needs --slurm"),
    (["train", "--config", NO_JOB, "--print-script"], "--print-script needs --slurm"),
    (["train", "--config", NO_JOB, "--login", "gg-login"], "--login needs --slurm"),
    (["train", "--config", NO_JOB, "--json"], "--json needs --detach"),
    (["train", "--config", NO_JOB, "--main-ip", "10.0.0.1"], "--main-ip needs --hosts"),
    (["train", "--config", NO_JOB, "--reconnect-s", "5"], "--reconnect-s needs --host or --hosts"),
    (["train", "--config", NO_JOB, "--remote-command", "py -m gaudi_gui"], "--remote-command needs"),
    (["train", "--config", NO_JOB, "--host", "gg-a", "--hosts", "gg-a,gg-b"], "cannot go with --hosts"),
    (["train", "--config", NO_JOB, "--slurm", "--host", "gg-a"], "cannot go with --slurm"),
    (["train", "--config", NO_JOB, "--slurm", "--hosts", "gg-a,gg-b"], "cannot go with --slurm"),
    (["train", "--config", NO_JOB, "--slurm", "--detach", "--print-script"],
     "--print-script cannot go with --detach"),
    (["train", "--config", NO_JOB, "--slurm", "--detach", "--events"], "--events cannot go with --detach"),
    (["train", "--config", NO_JOB, "--hosts", "gg-a,gg-b", "--detach"], "--detach cannot go with --hosts"),
    (["train", "--config", NO_JOB, "--slurm", "--cards", "0,1"], "--cards cannot go with --slurm"),
    (["train", "--config", NO_JOB, "--hosts", "gg-a,gg-b", "--resumed-from", "/r"], "cannot go with --hosts"),
    (["train", "--config", NO_JOB, "--part", "p"], "--partition needs --slurm"),  # an abbreviation counts
    (["generate", "--prompt", "hi", "--temperature", "0.5"], "--temperature needs --do-sample"),
    (["generate", "--prompt", "hi", "--top-p", "0.5"], "--top-p needs --do-sample"),
    (["generate", "--prompt", "hi", "--top-k", "5"], "--top-k needs --do-sample"),
    (["generate", "--prompt", "hi", "--system", "be brief"], "--system needs --chat"),
    (["devices", "--remote-command", "py -m gaudi_gui"], "--remote-command needs --host"),
    (["hosts", "--add", "gg-a", "--remove", "gg-b"], "--add cannot go with --remove"),
    (["hosts", "--setup", "gg-a", "--remove", "gg-b"], "--remove cannot go with --setup"),
    (["hosts", "--hl-smi", "/bin/hl-smi"], "--hl-smi needs --add"),
    (["hosts", "--venv", "/v"], "--venv needs --setup"),
    (["hosts", "--no-deps", "--add", "gg-a"], "--no-deps needs --setup"),
    (["hosts", "--add", "gg-a", "--json"], "--json cannot go with --add"),
    (["hosts", "--host", "gg-a", "--add", "gg-b"], "--host cannot go with --add"),
    (["doctor", "--host", "gg-a", "--hosts", "gg-b,gg-c"], "not both"),
    (["doctor", "--smoke-timeout", "5"], "--smoke-timeout needs --smoke"),
    (["ls", "--hf-cache", "/tmp"], "--hf-cache cannot go with PATH"),
    (["guard", "--gaudi-gui", "--python", "--", "x"], "not allowed with"),
]

#: Combinations that go together: the flags check lets them through (what fails next is the missing
#: job file, or a bad host name — never "needs" / "cannot go with").
ALLOWED: list[list[str]] = [
    ["train", "--config", NO_JOB, "--hosts", "gg-a,gg-b", "--remote-command", "py -m gaudi_gui",
     "--main-ip", "10.0.0.1", "--reconnect-s", "5", "--cards", "0,1", "--runs-dir", "/r", "--no-preflight"],
    ["train", "--config", NO_JOB, "--slurm", "--nodes", "2", "--partition", "p", "--login", "gg-login",
     "--print-script", "--resumed-from", "/r", "--no-preflight", "--device", "cpu"],
    ["train", "--config", NO_JOB, "--detach", "--json", "--cards", "0", "--grace", "5"],
    ["train", "--config", NO_JOB, "--slurm", "--detach", "--json", "--partition", "p", "--time", "10",
     "--device", "cpu", "--runs-dir", "/r"],
    ["generate", "--prompt", "hi", "--do-sample", "--temperature", "0.5", "--top-p", "0.9", "--top-k", "5",
     "--chat", "--system", "be brief", "--model", "/nonexistent/model", "--device", "cpu"],
]


def _ids(cases: list[tuple[list[str], str]]) -> list[str]:
    return [" ".join(argv)[:90] for argv, _ in cases]


def _check(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(argv, capsys)
    assert code == 2, (argv, code, err)
    assert needle in err, (argv, err)
    assert err.strip().count("\n") == 0, err  # one line
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "needle"), cases_from_the_parser(), ids=_ids(cases_from_the_parser()))
def test_what_the_parser_says_goes_together_is_enforced(argv: list[str], needle: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _check(argv, needle, capsys)


@pytest.mark.parametrize(("argv", "needle"), cases_from_the_rules(), ids=_ids(cases_from_the_rules()))
def test_every_rule_refuses(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    _check(argv, needle, capsys)


@pytest.mark.parametrize(("argv", "needle"), PAIRS, ids=_ids(PAIRS))
def test_incompatible_pairs_are_refused(argv: list[str], needle: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    _check(argv, needle, capsys)


@pytest.mark.parametrize("argv", ALLOWED, ids=[" ".join(a)[:90] for a in ALLOWED])
def test_what_goes_together_is_not_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    parser.parse_args(argv)
    assert flags.refusal(parser, argv) is None


def test_the_walk_reaches_every_subcommand() -> None:
    """The walk above sees every command the CLI has (a new one is walked without editing this file)."""
    walked = {path[0].word for path in all_paths()}
    assert walked == set(cli.COMMANDS)
    assert len(cases_from_the_parser()) >= 20 and len(cases_from_the_rules()) >= len(flags.RULES)
