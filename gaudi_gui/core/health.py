"""The doctor's data model: findings about a host's stack, cards, holders and network, and the gate.

Qt-free and torch-free: the Health view, the start gate and ``gaudi-gui doctor`` share these values,
and ``doctor --json`` prints exactly ``Report.to_json()``, so a host's report travels over ssh as JSON
and is rebuilt here with ``Report.from_json``. Keep the names and JSON keys stable: other parts
(services, ui, commands/train) depend on them.

"unknown" is deliberately not a severity: something that could not be read is a warning whose
``seen`` says what could not be read, so it is never mistaken for "ok".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gaudi_gui.core.visibility import SUPPORTED_GROUPS, format_ids

Severity = Literal["ok", "warning", "error"]
SEVERITIES: tuple[str, ...] = ("ok", "warning", "error")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}
JSON_VERSION = 1


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class Finding:
    """One observation: ``check`` is a dotted id ("stack.driver", "card.ecc", "busy.held", ...)."""

    check: str
    severity: str
    seen: str
    fix: str = ""
    module_id: int | None = None
    index: int | None = None
    host: str = "local"

    def __post_init__(self) -> None:
        if self.severity not in _RANK:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, not {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.severity, "seen": self.seen, "fix": self.fix,
                "module_id": self.module_id, "index": self.index, "host": self.host}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finding:
        return cls(check=str(d["check"]), severity=str(d["severity"]), seen=str(d.get("seen", "")),
                   fix=str(d.get("fix", "") or ""), module_id=_opt_int(d.get("module_id")),
                   index=_opt_int(d.get("index")), host=str(d.get("host", "local")))

    def card_label(self) -> str:
        """'card 3 (index 2)' / 'card 3' / '' for a finding that is not about one card."""
        if self.module_id is None and self.index is None:
            return ""
        if self.module_id is None:
            return f"index {self.index}"
        if self.index is None or self.index == self.module_id:
            return f"card {self.module_id}"
        return f"card {self.module_id} (index {self.index})"


def worst_of(severities: Sequence[str]) -> str:
    return max(severities, key=lambda s: _RANK[s], default="ok")


@dataclass(frozen=True)
class HostHealth:
    """Everything the doctor saw on one host (``reachable=False`` with ``error`` when it did not answer)."""

    host: str
    reachable: bool
    error: str = ""
    findings: tuple[Finding, ...] = ()
    cards: tuple[dict[str, Any], ...] = ()  # {"index", "module_id", "bus_id", "name"} per card seen
    free_modules: tuple[int, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def worst(self) -> str:
        if not self.reachable:
            return "error"
        return worst_of([f.severity for f in self.findings])

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "reachable": self.reachable, "error": self.error,
                "cards": [dict(c) for c in self.cards], "free_modules": list(self.free_modules),
                "versions": dict(self.versions), "findings": [f.to_json() for f in self.findings]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostHealth:
        return cls(host=str(d["host"]), reachable=bool(d.get("reachable", False)),
                   error=str(d.get("error", "") or ""),
                   findings=tuple(Finding.from_json(f) for f in d.get("findings", [])),
                   cards=tuple(dict(c) for c in d.get("cards", [])),
                   free_modules=tuple(int(m) for m in d.get("free_modules", [])),
                   versions={str(k): str(v) for k, v in dict(d.get("versions", {})).items()})


@dataclass(frozen=True)
class Report:
    """The doctor's answer for one or more hosts plus the cross-host ("hosts.versions") findings."""

    hosts: tuple[HostHealth, ...]
    cross_host: tuple[Finding, ...] = ()

    def all_findings(self) -> list[Finding]:
        out: list[Finding] = []
        for h in self.hosts:
            if not h.reachable:
                out.append(Finding("host.reachable", "error", f"{h.host} did not answer: {h.error}",
                                   "check that the host is up and reachable over ssh", host=h.host))
            out.extend(h.findings)
        out.extend(self.cross_host)
        return out

    @property
    def errors(self) -> int:
        return sum(1 for f in self.all_findings() if f.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for f in self.all_findings() if f.severity == "warning")

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def to_json(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "hosts": [h.to_json() for h in self.hosts],
                "cross_host": [f.to_json() for f in self.cross_host],
                "errors": self.errors, "warnings": self.warnings}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Report:
        return cls(hosts=tuple(HostHealth.from_json(h) for h in d.get("hosts", [])),
                   cross_host=tuple(Finding.from_json(f) for f in d.get("cross_host", [])))


@dataclass(frozen=True)
class GateResult:
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    suggestion: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors


# Card findings that make a chosen card unusable (held, dead, failed init, double-bit ECC).
_BLOCKING_CARD_CHECKS = frozenset({"busy.held", "card.status", "card.init", "card.ecc"})


def _describe(f: Finding) -> str:
    where = f.card_label()
    host = "" if f.host == "local" else f"{f.host}: "
    text = f"{host}{where + ': ' if where else ''}{f.seen}"
    return f"{text} ({f.fix})" if f.fix else text


def _suggest(free: Sequence[int], wanted: int) -> str:
    """Free module ids forming one of Intel's supported groups of the wanted size (or any free ids)."""
    free_set = set(free)
    if wanted in (2, 4):
        for group in SUPPORTED_GROUPS:
            if len(group) == wanted and group <= free_set:
                return f"cards {format_ids(group)} are free: use them"
    if wanted and len(free_set) >= wanted:
        return f"cards {format_ids(sorted(free_set)[:wanted])} are free: use them"
    if free_set:
        return f"cards {format_ids(free_set)} are free"
    return ""


def gate(report: Report, modules: Sequence[int] | None, *, multi_node: bool) -> GateResult:
    """Whether a run on ``modules`` (None: all cards) on the report's hosts may start.

    Errors block: a chosen card held, dead, failed to initialise, with double-bit ECC; ports down on a
    chosen card when ``multi_node``; versions differing between hosts; a host that did not answer; and
    any other error-severity stack finding. Warnings (and errors about cards not chosen) let it go on.
    """
    chosen = None if modules is None else set(modules)
    errors: list[str] = []
    warnings: list[str] = []
    bad_cards: set[int] = set()
    for h in report.hosts:
        if not h.reachable:
            errors.append(f"{h.host} did not answer: {h.error}")
    for f in [f for h in report.hosts for f in h.findings] + list(report.cross_host):
        if f.severity == "ok":
            continue
        about_card = f.module_id is not None
        on_chosen = about_card and (chosen is None or f.module_id in chosen)
        if f.severity == "error":
            if f.check == "hosts.versions":
                errors.append(_describe(f))
            elif about_card:
                if not on_chosen:
                    continue  # a sick card nobody asked for does not stop this run
                if f.check == "net.ports" and not multi_node:
                    warnings.append(_describe(f))
                    continue
                errors.append(_describe(f))
                if f.module_id is not None:
                    bad_cards.add(f.module_id)
            else:
                errors.append(_describe(f))
        elif not about_card or on_chosen:
            warnings.append(_describe(f))
    suggestion = ""
    if bad_cards:
        free: set[int] = set()
        sick: set[int] = set()
        for h in report.hosts:
            free |= set(h.free_modules)
            sick |= {f.module_id for f in h.findings if f.severity == "error" and f.module_id is not None}
        wanted = len(chosen) if chosen else len(bad_cards)
        suggestion = _suggest(sorted(free - sick), wanted)
    return GateResult(tuple(errors), tuple(warnings), suggestion)
