"""The start gate's orchestration: which hosts and cards to check before work starts, the doctor
child's argv for each host, and the replies combined into one ``Report`` and one verdict.

Qt-free and torch-free, so the GUI (``services.preflight``) and the command line (``check``) share
every rule here, and run the children the same way (``core.child.run``); the rules about findings
themselves are ``core.health.gate``.

Each host is one child, ``python -m gaudi_gui doctor --json [--host DEST --remote-command CMD]``, all
in parallel, each with a timeout; a host whose child times out, crashes or prints no report is an
error that names it. The child checks *all* of a host's cards (no ``--cards``): only then does the
report know which other cards are free and healthy, so a refusal can say "cards 4,5 are free: use
them". The chosen cards are applied here, per host (``decide``).

``python -m gaudi_gui.core.preflight node`` is the same gate on the machine it runs on, in-process:
the Slurm batch script runs it on every node before the launch (the nodes are known only then).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gaudi_gui.core import health
from gaudi_gui.core.child import Outcome, run
from gaudi_gui.core.health import GateResult, HostHealth, Report
from gaudi_gui.core.hlsmi import find_hl_smi
from gaudi_gui.core.visibility import format_ids

LOCAL = "local"
#: Seconds one host's doctor may take (ssh included) before it counts as not answering. The doctor
#: takes about 1 s locally on 8 cards; a host that is up answers within a few seconds.
HOST_TIMEOUT_S = 30.0
#: Extra seconds the child is given beyond the doctor's own ssh timeout (its start-up, the JSON).
_GRACE_S = 5.0
#: How many of a failed child's last lines its error keeps, each cut to ``_LINE_CHARS``.
_LAST_LINES = 3
_LINE_CHARS = 300
#: Environment variable that turns the node check of a Slurm job off (``train --no-preflight``).
SKIP_ENV = "GAUDI_GUI_NO_PREFLIGHT"


@dataclass(frozen=True)
class Target:
    """One host to check and the cards the run will use there (None: all of its cards)."""

    host: str = LOCAL
    cards: tuple[int, ...] | None = None
    remote_command: str = ""

    @property
    def is_local(self) -> bool:
        return self.host == LOCAL

    def label(self) -> str:
        return "this machine" if self.is_local else self.host


@dataclass(frozen=True)
class Plan:
    """What the gate checks before one start. No targets: nothing to check (start at once)."""

    targets: tuple[Target, ...] = ()
    #: One run over several machines: scale-out ports down on a chosen card are then an error.
    multi_node: bool = False
    #: The local hl-smi to run when it is not the one on PATH (settings devices/hl_smi).
    hl_smi: str = ""
    timeout_s: float = HOST_TIMEOUT_S

    @property
    def empty(self) -> bool:
        return not self.targets


@dataclass(frozen=True)
class Verdict:
    """The gate's answer: ``errors`` stop the start, ``warnings`` are shown and the user may go on."""

    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: The fix for card errors ("cards 4,5 are free: use them"; per host when several).
    suggestion: str = ""
    report: Report = field(default_factory=lambda: Report(hosts=()))
    #: Seconds from the first child's start to the verdict.
    elapsed_s: float = 0.0
    #: Who asked (``services.preflight`` runs one check per key: the Training tab, the runner).
    key: str = ""
    #: Some warning is about a chosen card (slowdown, held outside this view, ports down on one
    #: machine...): the user confirms before the start. Stack-only warnings are shown, not asked.
    confirm: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors

    def message(self) -> str:
        """One paragraph for the status line / the command line: the errors, then the fix."""
        if self.errors:
            text = "the card check refused the start: " + "; ".join(self.errors)
            return text + (f". {self.suggestion}" if self.suggestion else "")
        if self.warnings:
            return "the card check found warnings: " + "; ".join(self.warnings)
        return "the card check passed"


# -- deciding whether there is anything to check ------------------------------------------------------


def local_hl_smi(explicit: str = "") -> str:
    """The hl-smi this machine would run (settings, then ``GAUDI_GUI_HL_SMI``, then PATH), or "".

    No hl-smi means no Gaudi cards here: the local gate then starts no child at all (a plain CPU or
    CUDA machine pays nothing for it)."""
    return find_hl_smi(explicit)


def gaudi_here() -> bool:
    """Whether this machine has Gaudi cards whatever hl-smi says (/dev/accel nodes, the driver): then
    a missing hl-smi is the check's error to show, not a reason to skip the check."""
    return bool(health.gaudi_evidence(health.Roots.from_env()))


def local_plan(cards: Sequence[int] | None, *, uses_cards: bool, hl_smi: str = "",
               multi_node: bool = False, timeout_s: float = HOST_TIMEOUT_S) -> Plan:
    """The plan for a run on this machine: empty where it has no hl-smi or the run uses no cards."""
    if not uses_cards:
        return Plan()
    found = local_hl_smi(hl_smi)
    if not found and not gaudi_here():
        return Plan()
    chosen = tuple(sorted(set(cards))) if cards else None
    return Plan((Target(LOCAL, chosen),), multi_node=multi_node,
                hl_smi=hl_smi.strip() and found, timeout_s=timeout_s)


def hosts_plan(targets: Sequence[Target], *, multi_node: bool | None = None,
               timeout_s: float = HOST_TIMEOUT_S) -> Plan:
    """The plan for a run on one or several hosts (each always checked: whether a host has cards is
    something only its doctor can say). ``multi_node`` defaults to "more than one host"."""
    several = len(targets) > 1
    return Plan(tuple(targets), multi_node=several if multi_node is None else multi_node, timeout_s=timeout_s)


# -- the children -----------------------------------------------------------------------------------------


def doctor_argv(target: Target, plan: Plan, *, python: str = "") -> list[str]:
    """The child that checks ``target``: one argv element per word (the host name never reaches a
    shell here; the doctor quotes it for ssh itself)."""
    argv = [python or sys.executable, "-m", "gaudi_gui", "doctor", "--json",
            "--timeout", f"{plan.timeout_s:g}"]
    if target.is_local:
        if plan.hl_smi:
            argv += ["--hl-smi", plan.hl_smi]
    else:
        argv += ["--host", target.host]
        if target.remote_command:
            argv += ["--remote-command", target.remote_command]
    return argv


def child_timeout_s(plan: Plan) -> float:
    """How long the parent waits for one child before killing it (the doctor's own ssh timeout plus
    its start-up)."""
    return plan.timeout_s + _GRACE_S


def host_reply(target: Target, outcome: Outcome, *, timeout_s: float = 0.0) -> HostHealth:
    """One doctor child's end (``core.child.run``) as the host's health. A child that timed out, could
    not start or printed no report is a host that did not answer, with its exit and last lines."""
    if outcome.timed_out:
        return HostHealth(target.host, False, f"the check did not answer within {timeout_s:g} s")
    try:
        got = Report.from_json(json.loads(outcome.stdout)).hosts[0]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        lines = [ln.strip()[:_LINE_CHARS] for ln in outcome.tail if ln.strip()][-_LAST_LINES:]
        detail = " | ".join(lines) if lines else "no output"
        code = outcome.code
        ended = ("could not start" if code is None else f"was killed by signal {-code} without a report"
                 if code < 0 else f"exited with code {code} without a report")
        return HostHealth(target.host, False, f"the doctor {ended}: {detail}")
    if got.host != target.host:
        # The local doctor calls its host "local"; a remote one the name it was given. Keep ours.
        got = HostHealth(target.host, got.reachable, got.error,
                         tuple(health.Finding(f.check, f.severity, f.seen, f.fix, f.module_id, f.index,
                                              target.host) for f in got.findings),
                         got.cards, got.free_modules, got.versions)
    return got


def combine(replies: Sequence[HostHealth]) -> Report:
    """The hosts' reports as one, with the versions that differ between them."""
    return Report(hosts=tuple(replies), cross_host=tuple(health.cross_host_findings(list(replies))))


def decide(plan: Plan, report: Report, *, elapsed_s: float = 0.0) -> Verdict:
    """``core.health.gate`` for each host with that host's chosen cards, plus the cross-host
    findings; a chosen card the host does not have is an error too."""
    errors: list[str] = []
    warnings: list[str] = []
    suggestions: list[str] = []
    confirm = False
    by_host = {h.host: h for h in report.hosts}
    several = len(plan.targets) > 1
    for target in plan.targets:
        found = by_host.get(target.host)
        if found is None:
            errors.append(f"{target.label()}: no report")
            continue
        if not found.reachable:
            errors.append(f"{target.label()} did not answer: {found.error}")
            continue
        result: GateResult = health.gate(Report(hosts=(found,)), target.cards, multi_node=plan.multi_node)
        errors.extend(result.errors)
        warnings.extend(result.warnings)
        confirm = confirm or any(f.severity != "ok" and f.module_id is not None
                                 and (target.cards is None or f.module_id in target.cards)
                                 for f in found.findings)
        seen = {int(c["module_id"]) for c in found.cards if c.get("module_id") is not None}
        missing = sorted(set(target.cards or ()) - seen) if seen else []
        if missing:
            errors.append(f"{'' if target.is_local else target.host + ': '}no card with module id "
                          f"{format_ids(missing)} (cards there: {format_ids(seen)})")
        if result.suggestion:
            suggestions.append(f"{target.host}: {result.suggestion}" if several else result.suggestion)
    if report.cross_host:
        cross = health.gate(Report(hosts=(), cross_host=report.cross_host), None, multi_node=plan.multi_node)
        errors.extend(cross.errors)
        warnings.extend(cross.warnings)
    return Verdict(tuple(errors), tuple(warnings), "; ".join(suggestions), report, elapsed_s,
                   confirm=confirm and not errors)


# -- running it without Qt (the command line, the bench) --------------------------------------------------


def check(plan: Plan, *, python: str = "") -> Verdict:
    """Run the plan's children in parallel (threads waiting on subprocesses) and decide."""
    if plan.empty:
        return Verdict()
    started = time.monotonic()
    limit = child_timeout_s(plan)

    def one(target: Target) -> HostHealth:
        return host_reply(target, run(doctor_argv(target, plan, python=python), limit), timeout_s=limit)

    with ThreadPoolExecutor(max_workers=min(16, len(plan.targets))) as pool:
        replies = list(pool.map(one, plan.targets))
    return decide(plan, combine(replies), elapsed_s=time.monotonic() - started)


# -- the node check of a Slurm job ------------------------------------------------------------------------


def _roots(hl_smi: str) -> health.Roots:
    # The same environment knobs as `gaudi-gui doctor` (tests point them at fixture folders).
    return health.Roots.from_env(hl_smi)


def visible_modules(env: dict[str, str] | None = None) -> tuple[int, ...] | None:
    """The cards this process may use (``HABANA_VISIBLE_MODULES``, as Slurm or the user set it), or
    None when nothing restricts it: then every card of the node is the job's."""
    text = (env if env is not None else os.environ).get("HABANA_VISIBLE_MODULES", "").strip()
    if not text:
        return None
    try:
        return tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        return None


def node_check(*, multi_node: bool, hl_smi: str = "", host: str = "") -> tuple[int, list[str]]:
    """The gate on this machine, in-process: (exit status, lines to print). 0: go on; 1: refused."""
    import socket
    name = host or socket.gethostname()
    if os.environ.get(SKIP_ENV, "").strip() not in ("", "0"):
        return 0, [f"gaudi-gui: {name}: card check skipped ({SKIP_ENV} is set)"]
    program = local_hl_smi(hl_smi)
    if not program and not gaudi_here():
        return 0, [f"gaudi-gui: {name}: no hl-smi: no Gaudi cards to check"]
    cards = visible_modules()
    # Checked as "local" so the findings are not prefixed with the name each line already starts with.
    found = health.check_host(_roots(program))
    plan = Plan((Target(LOCAL, cards),), multi_node=multi_node)
    verdict = decide(plan, Report(hosts=(found,)))
    which = f"cards {format_ids(cards)}" if cards else "all cards"
    lines = [f"gaudi-gui: {name}: card check warning: {w}" for w in verdict.warnings]
    if verdict.ok:
        return 0, [*lines, f"gaudi-gui: {name}: card check passed ({which})"]
    lines += [f"gaudi-gui: {name}: card check failed ({which}): {e}" for e in verdict.errors]
    if verdict.suggestion:
        lines.append(f"gaudi-gui: {name}: {verdict.suggestion}")
    return 1, lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.core.preflight")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("node", help="check this node's cards before a Slurm job's launch (exit 1: refused)")
    p.add_argument("--multi-node", dest="multi_node", action="store_true",
                   help="one run over several nodes: scale-out ports down are an error")
    p.add_argument("--hl-smi", dest="hl_smi", default="", metavar="PATH")
    args = parser.parse_args(argv)
    code, lines = node_check(multi_node=args.multi_node, hl_smi=args.hl_smi)
    print("\n".join(lines), flush=True)
    return code


__all__ = [
    "HOST_TIMEOUT_S",
    "LOCAL",
    "SKIP_ENV",
    "Plan",
    "Target",
    "Verdict",
    "check",
    "child_timeout_s",
    "combine",
    "decide",
    "doctor_argv",
    "host_reply",
    "hosts_plan",
    "local_hl_smi",
    "local_plan",
    "node_check",
    "visible_modules",
]

if __name__ == "__main__":
    sys.exit(main())
