"""The doctor's data model: findings about a host's stack, cards, holders and network, and the gate.

Qt-free and torch-free: the Health view, the start gate and ``gaudi-gui doctor`` share these values,
and ``doctor --json`` prints exactly ``Report.to_json()``, so a host's report travels over ssh as JSON
and is rebuilt here with ``Report.from_json``. Keep the names and JSON keys stable: other parts
(services, ui, commands/train) depend on them.

"unknown" is deliberately not a severity: something that could not be read is a warning whose
``seen`` says what could not be read, so it is never mistaken for "ok".
"""

from __future__ import annotations

import json as _json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core.devices import card_detail, card_name, cards_name

# The hl-smi parsers live with the others in core/hlsmi (one module reads every hl-smi output).
from gaudi_gui.core.hlsmi import (
    hl_smi_program,
    parse_csv,
    parse_links,
    parse_processes,
    parse_query,
    query_args,
)
from gaudi_gui.core.visibility import SUPPORTED_GROUPS, format_ids

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
        """The card's one name (``core.devices.card_name``: "module 3"), '' for a finding that is
        not about one card. The index is secondary: ``card_detail`` says it."""
        if self.module_id is None and self.index is None:
            return ""
        return card_name(self.module_id, self.index)

    def card_detail(self) -> str:
        """"index 2" for a tooltip ('' when not about one card)."""
        return "" if self.module_id is None and self.index is None else card_detail(None, self.index)


def worst_of(severities: Sequence[str]) -> str:
    return max(severities, key=lambda s: _RANK[s], default="ok")


# Within one severity, the finding a card's row tells first (what makes it unusable before what
# only slows it down).
_CARD_ORDER = ("card.status", "card.init", "card.ecc", "busy.held", "smoke", "card.firmware", "net.ports",
               "card.temperature", "card.throttle", "card.power", "card.pcie")


def _card_rank(f: Finding) -> tuple[int, int]:
    order = _CARD_ORDER.index(f.check) if f.check in _CARD_ORDER else len(_CARD_ORDER)
    return (-_RANK[f.severity], order)


#: The card counts a job is offered cards for (besides "all the healthy and free ones").
PICK_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Pick:
    """Cards for a job of ``size`` cards: ``ids`` (empty: none fit), ``warned`` those of them with a
    warning (usable, said), ``note`` which groups were looked at when none fit."""

    size: int
    ids: tuple[int, ...] = ()
    warned: tuple[int, ...] = ()
    note: str = ""

    def text(self) -> str:
        """"for 2 cards: modules 4 and 5" / "for 4 cards: none of 0,1,2,3 / 4,5,6,7" (the warnings'
        words are said once, by ``HostHealth.usable_text``)."""
        what = cards_name(self.ids) if self.ids else f"none {self.note}" if self.note else "none"
        return f"for {self.size} card{'s' if self.size != 1 else ''}: {what}"


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
    def free_groups(self) -> list[frozenset[int]]:
        """Intel's supported groups free right now on cards without an error (the gate's offer)."""
        sick = [f.module_id for f in self.findings if f.severity == "error" and f.module_id is not None]
        return free_groups(self.free_modules, sick)

    def card_problems(self, module_id: int) -> list[Finding]:
        """The card's findings that are not "ok", the one to tell first first (errors, then what makes
        a card unusable before what slows it down)."""
        found = [f for f in self.findings if f.module_id == module_id and f.severity != "ok"]
        return sorted(found, key=_card_rank)

    def card_worst(self, module_id: int) -> Finding | None:
        """The doctor's worst finding about the card (None: every check passed)."""
        problems = self.card_problems(module_id)
        return problems[0] if problems else None

    def healthy_free(self) -> list[int]:
        """Module ids no process holds and the doctor found no error on (warnings allowed: said
        beside them by ``usable_text``)."""
        sick = {f.module_id for f in self.findings if f.severity == "error" and f.module_id is not None}
        return sorted(set(self.free_modules) - sick)

    def warned(self, ids: Sequence[int] | None = None) -> list[int]:
        """Of ``ids`` (default: the healthy and free cards), those with a warning."""
        wanted = set(self.healthy_free() if ids is None else ids)
        return sorted({f.module_id for f in self.findings if f.severity == "warning"
                       and f.module_id is not None and f.module_id in wanted})

    def pick(self, size: int, exclude: Sequence[int] = ()) -> Pick:
        """The cards a job of ``size`` cards should use: healthy and free, one of Intel's supported
        groups for 2 or 4 cards, the whole server for all its cards; cards without a warning first."""
        usable = set(self.healthy_free()) - set(exclude)
        warned = set(self.warned(sorted(usable)))
        clean = usable - warned
        total = len(self.cards) or len(self.free_modules)
        ids: tuple[int, ...] = ()
        note = ""
        if size == 1:
            ids = (min(clean),) if clean else (min(usable),) if usable else ()
        elif size in (2, 4) and size < total:
            groups = [g for g in SUPPORTED_GROUPS if len(g) == size]
            fit = [g for g in groups if g <= clean] or [g for g in groups if g <= usable]
            ids = tuple(sorted(fit[0])) if fit else ()
            if not ids:
                note = "of " + " / ".join(format_ids(g) for g in groups)
        elif size == total:
            all_ids = {int(c.get("module_id", c.get("index", -1))) for c in self.cards} or usable
            ids = tuple(sorted(all_ids)) if all_ids <= usable else ()
        elif size <= len(usable):
            ids = tuple(sorted(sorted(clean) + sorted(usable - clean))[:size])
        return Pick(size, ids, tuple(sorted(set(ids) & warned)), note)

    def picks(self, exclude: Sequence[int] = ()) -> list[Pick]:
        """``pick`` for each of 2, 4 and 8 cards this host has (one card: any healthy free one)."""
        total = len(self.cards) or len(self.free_modules)
        return [self.pick(n, exclude) for n in PICK_SIZES if 1 < n <= total]

    def usable_text(self, exclude: Sequence[int] = ()) -> str:
        """What a job should use, said the same in every view: "healthy and free: modules 0, 4, 5
        and 7 (module 5: power slowdown active); for 2 cards: modules 4 and 5; for 4 cards: none of
        0,1,2,3 / 4,5,6,7". ``exclude``: cards this app's jobs hold now."""
        if not self.cards and not self.free_modules:
            return "no Gaudi cards"
        ids = [m for m in self.healthy_free() if m not in set(exclude)]
        if not ids:
            return "healthy and free: none"
        notes = []
        for m in self.warned(ids):
            worst = self.card_worst(m)
            if worst is not None:
                notes.append(f"{card_name(m)}: {worst.seen}")
        text = f"healthy and free: {cards_name(ids)}" + (f" ({'; '.join(notes)})" if notes else "")
        picks = [p.text() for p in self.picks(exclude) if p.size < len(self.cards or ids) or p.ids]
        return "; ".join([text, *picks])

    def free_text(self) -> str:
        """The doctor's line about which cards to use (``usable_text``)."""
        return self.usable_text()

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
                return f"{cards_name(group)} are healthy and free: use them"
    if wanted and len(free_set) >= wanted:
        ids = sorted(free_set)[:wanted]
        one = len(ids) == 1
        return f"{cards_name(ids)} {'is' if one else 'are'} healthy and free: use {'it' if one else 'them'}"
    if free_set:
        return f"{cards_name(free_set)} {'is' if len(free_set) == 1 else 'are'} healthy and free"
    return ""


def gate(report: Report, modules: Sequence[int] | None, *, multi_node: bool) -> GateResult:
    """Whether a run on ``modules`` (None: all cards) on the report's hosts may start.

    Errors block: an error about a chosen card (held, dead, failed to initialise, double-bit ECC);
    ports down on a chosen card when ``multi_node``; versions differing between hosts; a host that did
    not answer. Everything else (stack findings too) is a warning; errors about cards not chosen are
    left out.
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
                if (f.check == "net.ports" and not multi_node) or f.check == "card.firmware":
                    # Firmware that differs from the driver's was a warning of the stack before it
                    # named its cards: it still warns, it does not stop a run.
                    warnings.append(_describe(f))
                    continue
                errors.append(_describe(f))
                if f.module_id is not None:
                    bad_cards.add(f.module_id)
            else:
                # A stack error (a missing node, a module not loaded) may not stop a run on cards that
                # are themselves fine: the agreed rule lists what blocks; the rest is shown.
                warnings.append(_describe(f))
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


# --------------------------------------------------------------------------------------------------
# Parsing (keyed on names, never positions) and checks. Every root is injectable so tests point them
# at fixture folders; nothing here imports torch (package versions come from importlib.metadata).
# --------------------------------------------------------------------------------------------------


_VERSION = re.compile(r"(\d+\.\d+\.\d+)")


def _card_ids(card: dict[str, str]) -> tuple[int, int]:
    """(module id, index) of a parsed ``-q`` card (the index stands in for a missing module id)."""
    idx = int(card.get("_index", "-1"))
    mod_text = _first(card, "module id")
    return (int(mod_text) if mod_text and mod_text.strip().isdigit() else idx), idx


def firmware_findings(firmware: Mapping[tuple[int, int], str], driver: str, *,
                      host: str = "local") -> list[Finding]:
    """The cards whose firmware differs from the driver's, each named (``card.firmware``, error);
    one "ok" when every card runs the driver's version. ``firmware``: (module id, index) -> version
    ('' unread). Without a driver version the cards are compared with the version most run."""
    known = {ids: v for ids, v in firmware.items() if v}
    if not known:
        return []
    versions = list(known.values())
    expected = driver or max(sorted(set(versions)), key=versions.count)
    odd = {ids: v for ids, v in known.items() if v != expected}
    if not odd:
        return [Finding("stack.firmware", "ok", f"driver and firmware {expected} on every card", host=host)]
    others = len(known) - len(odd)
    against = (f"the driver is {driver}" if driver else f"{others} other card(s) run {expected} "
               "(driver version unknown)")
    return [Finding("card.firmware", "error", f"firmware {version}, {against}",
                    "update this card's firmware to the driver's version (hl-fw-loader)", mod, idx, host)
            for (mod, idx), version in sorted(odd.items())]


def _first(card: dict[str, str], *suffixes: str) -> str | None:
    for suffix in suffixes:
        for key, value in card.items():
            if key == suffix or key.endswith("/" + suffix):
                return value
    return None


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    m = re.search(r"-?\d+(?:\.\d+)?", value)
    return float(m.group(0)) if m else None


def _version_of(value: str | None) -> str:
    m = _VERSION.search(value or "")
    return m.group(1) if m else ""


#: Seconds each tool the doctor runs (hl-smi, dmesg, nvidia-smi) may take by default.
TOOL_TIMEOUT_S = 20.0
#: After a tool exited, how long helpers that still hold its output pipes may take to finish.
HELPER_GRACE_S = 0.5


def tool_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """``GAUDI_GUI_DOCTOR_TOOL_TIMEOUT`` (seconds, finite and above 0; tests shorten it), else
    ``TOOL_TIMEOUT_S``."""
    import math
    text = (os.environ if env is None else env).get("GAUDI_GUI_DOCTOR_TOOL_TIMEOUT", "")
    try:
        value = float(text)
    except ValueError:
        return TOOL_TIMEOUT_S
    return value if math.isfinite(value) and value > 0 else TOOL_TIMEOUT_S


@dataclass
class Roots:
    """Where the doctor looks (injectable for tests)."""

    sysfs: Path = Path("/sys")
    proc: Path = Path("/proc")
    dev: Path = Path("/dev")
    hl_smi: str = ""
    #: Seconds each hl-smi call may take (then it and everything it started are ended).
    timeout_s: float = field(default_factory=tool_timeout_s)

    @classmethod
    def from_env(cls, hl_smi: str = "", env: Mapping[str, str] | None = None) -> Roots:
        """The real folders, or those ``GAUDI_GUI_DOCTOR_SYSFS`` / ``_PROC`` / ``_DEV`` name: tests, and a
        container with /sys mounted elsewhere, point every check (the doctor, the start gates, the
        queue's look at the cards) at other folders the same way."""
        env = os.environ if env is None else env
        return cls(sysfs=Path(env.get("GAUDI_GUI_DOCTOR_SYSFS", "/sys")),
                   proc=Path(env.get("GAUDI_GUI_DOCTOR_PROC", "/proc")),
                   dev=Path(env.get("GAUDI_GUI_DOCTOR_DEV", "/dev")), hl_smi=hl_smi)


def accel_nodes(dev: Path) -> list[str]:
    """The /dev/accel/accelN nodes (names), sorted."""
    folder = dev / "accel"
    return sorted(p.name for p in folder.glob("accel[0-9]*")) if folder.is_dir() else []


def gaudi_evidence(roots: Roots) -> str:
    """What says this machine has Gaudi cards whatever hl-smi says ("" when nothing does): its
    /dev/accel nodes, the habanalabs driver loaded (/proc/modules or /sys/module/habanalabs). Where
    there is any, a missing or failing hl-smi is an error, never "fine on a CPU"."""
    seen: list[str] = []
    nodes = accel_nodes(roots.dev)
    if nodes:
        seen.append(f"{len(nodes)} /dev/accel node{'s' if len(nodes) != 1 else ''} ({nodes[0]}"
                    + (f"..{nodes[-1]})" if len(nodes) > 1 else ")"))
    try:
        modules = {ln.split()[0] for ln in (roots.proc / "modules").read_text().splitlines() if ln.strip()}
    except OSError:
        modules = set()
    if "habanalabs" in modules or (roots.sysfs / "module" / "habanalabs").is_dir():
        seen.append("the habanalabs driver is loaded")
    return " and ".join(seen)


def card_findings(card: dict[str, str], *, host: str = "local",
                  sysfs_status: str | None = None) -> list[Finding]:
    """The per-card checks on one parsed ``-q`` block (and the sysfs status when readable)."""
    out: list[Finding] = []
    idx = int(card.get("_index", "-1"))
    mod_text = _first(card, "module id")
    mod = int(mod_text) if mod_text and mod_text.strip().isdigit() else idx

    def add(check: str, severity: str, seen: str, fix: str = "") -> None:
        out.append(Finding(check, severity, seen, fix, module_id=mod, index=idx, host=host))

    status = sysfs_status if sysfs_status is not None else _first(card, "module status")
    if status is None:
        add("card.status", "warning", "status could not be read (no sysfs status, no 'Module status')",
            "check the driver (dmesg | grep habanalabs)")
    elif status.strip().lower() != "operational":
        add("card.status", "error", f"status is {status.strip()!r}, not operational",
            "reset the card (hl-smi -r) or reboot; see dmesg | grep habanalabs")
    else:
        add("card.status", "ok", "operational")
    temps = [t for k, v in card.items() if k.startswith("temperature/") and (t := _number(v)) is not None]
    if not temps:
        add("card.temperature", "warning", "temperature could not be read", "check hl-smi -q")
    elif max(temps) <= 0:
        add("card.init", "error", "temperature reads 0 C: the card failed to initialise",
            "reset the card (hl-smi -r) or reload habanalabs; replace it if it stays at 0 C")
    elif max(temps) >= 95:
        add("card.temperature", "warning", f"temperature {max(temps):.0f} C", "check the cooling")
    else:
        add("card.temperature", "ok", f"{max(temps):.0f} C")
    draw, limit = None, None
    for key, value in card.items():
        if key.startswith("power readings") and key.endswith("/power draw") and draw is None:
            draw = _number(value)
        if key.startswith("power readings") and key.endswith("/power limit") and limit is None:
            limit = _number(value)
    if draw is not None and limit:
        if draw >= limit:
            add("card.power", "warning", f"power draw {draw:.0f} W at its limit {limit:.0f} W",
                "expect power slowdown; check the power limit")
        else:
            add("card.power", "ok", f"{draw:.0f} W of {limit:.0f} W")
    single = _number(_first(card, "replaced rows/single bit ecc"))
    double = _number(_first(card, "replaced rows/double bit ecc"))
    pending = _first(card, "replaced rows/pending")
    if single is None and double is None:
        add("card.ecc", "warning", "ECC / replaced rows could not be read", "check hl-smi -q")
    elif (double or 0) > 0 or (pending or "").strip().lower() in ("yes", "true", "1"):
        add("card.ecc", "error", f"double-bit ECC {int(double or 0)}, row replacement pending: "
            f"{(pending or 'unknown').strip()}", "reset the card (hl-smi -r) to replace the rows; "
            "replace the card if double-bit errors recur")
    elif (single or 0) > 0:
        add("card.ecc", "warning", f"single-bit ECC {int(single or 0)}", "watch it; rows are replaced")
    else:
        add("card.ecc", "ok", "no ECC errors")
    throttles = {k.rsplit("/", 1)[-1]: v for k, v in card.items() if k.startswith("clocks throttle reasons/")}
    active = sorted(k for k, v in throttles.items() if v.strip().lower() == "active")
    if not throttles:
        add("card.throttle", "warning", "throttle reasons could not be read", "check hl-smi -q")
    elif active:
        add("card.throttle", "warning", f"{', '.join(active)} active",
            "check cooling and the power limit")
    else:
        add("card.throttle", "ok", "no slowdown")
    speed = (_first(card, "link speed/current"), _first(card, "link speed/max"))
    width = (_first(card, "link width/current"), _first(card, "link width/max"))
    if all(speed) and all(width):
        low = [n for n, (cur, top) in (("speed", speed), ("width", width))
               if (_number(cur) or 0) < (_number(top) or 0)]
        if low:
            add("card.pcie", "warning", f"PCIe link {speed[0]} {width[0]} below its max "
                f"{speed[1]} {width[1]}", "reseat the card or check the slot/BIOS settings")
        else:
            add("card.pcie", "ok", f"PCIe {speed[0]} {width[0]}")
    return out


# The packages the stack check reads; accelerate < 1.5 makes is_torch_hpu_available() False.
PACKAGES = ("habana-torch-plugin", "torch", "transformers", "accelerate", "peft", "trl", "bitsandbytes",
            "optimum-habana", "vllm", "vllm-gaudi", "neural-compressor-pt")


def package_versions() -> dict[str, str]:
    # Imported here, where the doctor reads the versions: importlib.metadata (and the email package it
    # loads) was most of this module's import, and the window imports this module to read a report
    # (services.health, docs/benchmarks.md).
    from importlib import metadata as _metadata

    out: dict[str, str] = {}
    for name in PACKAGES:
        try:
            out[name] = _metadata.version(name)
        except _metadata.PackageNotFoundError:
            continue
    return out


def _compat_path() -> Path:
    """Where this installation's compatibility table is (a checkout's resources/, a wheel's package)."""
    from gaudi_gui.core import paths

    return paths.resources_dir() / "gaudi-compat.json"


def load_compat(path: Path | None = None) -> dict[str, Any]:
    """The compatibility table (resources/gaudi-compat.json). A missing or damaged table is
    ``paths.DataFileError``, never an empty table that would call every release unknown."""
    from gaudi_gui.core import paths

    path = path or paths.data_file("gaudi-compat.json")
    try:
        data = _json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise paths.DataFileError(f"gaudi-gui's compatibility table {path} cannot be read ({exc}): this "
                                  "installation is incomplete or damaged; reinstall gaudi-gui") from exc
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise paths.DataFileError(f"gaudi-gui's compatibility table {path} has no list of rows: this "
                                  "installation is damaged; reinstall gaudi-gui")
    return data


def _older(a: str, b: str) -> bool | None:
    """a < b by packaging.version (PEP 440: '2.4.0a0+git74cd574' < '2.4.0'); None when either does not
    parse: the caller says it could not compare, it never calls that version good."""
    from packaging.version import InvalidVersion, Version
    try:
        return Version(a) < Version(b)
    except InvalidVersion:
        return None


def _release(text: str, parts: int) -> tuple[int, ...] | None:
    from packaging.version import InvalidVersion, Version
    try:
        return Version(text).release[:parts]
    except InvalidVersion:
        return None


def compat_row(compat: dict[str, Any], software: str) -> tuple[dict[str, Any] | None, bool]:
    """The table's row for a Gaudi software version: (row, exact). A patch release (1.16.2) falls back
    to its release's row (1.16.0), said in the finding; a release not in the table gives None."""
    rows = [r for r in compat.get("rows", []) if isinstance(r, dict)]
    for r in rows:
        if r.get("gaudi_software") == software:
            return r, True
    minor = _release(software, 2) if software else None
    for r in rows:
        if minor is not None and _release(str(r.get("gaudi_software", "")), 2) == minor:
            return r, False
    return None, False


# The Python packages the table speaks about (habana-torch-plugin and accelerate are checked apart).
_TABLE_PACKAGES = ("torch", "transformers", "peft", "trl", "bitsandbytes", "optimum-habana", "vllm",
                   "vllm-gaudi")


def stack_findings(versions: dict[str, str], *, host: str = "local",
                   compat: dict[str, Any] | None = None) -> list[Finding]:
    """Python packages against resources/gaudi-compat.json (and accelerate >= its minimum).

    One finding per installed package. With the host's Gaudi software in the table each is checked
    with packaging.version against its row: torch against the release the row ships (major.minor),
    the others against the row's minimums; a package the row does not list is "not verified", a
    version that does not parse "could not be compared": warnings, never "ok". Without Gaudi software
    (no hl-smi) the packages are listed as installed, since there is nothing to check them against."""
    out: list[Finding] = []
    if compat is None:
        from gaudi_gui.core.paths import DataFileError
        try:
            compat = load_compat()
        except DataFileError as exc:  # an incomplete installation: said, never an empty table
            return [Finding("stack.compat", "error", str(exc), "reinstall gaudi-gui", host=host)]

    def add(check: str, severity: str, seen: str, fix: str = "") -> None:
        out.append(Finding(check, severity, seen, fix, host=host))

    acc_min = str(dict(compat.get("global_minimums", {})).get("accelerate", "1.5.0"))
    acc = versions.get("accelerate")
    if acc is None:
        add("stack.accelerate", "warning", "accelerate is not installed",
            f"pip install 'accelerate>={acc_min}'")
    else:
        older = _older(acc, acc_min)
        if older is None:
            add("stack.accelerate", "warning", f"accelerate {acc}: version could not be compared with "
                f"{acc_min}", f"pip install 'accelerate>={acc_min}'")
        elif older:
            add("stack.accelerate", "error", f"accelerate {acc} < {acc_min}: is_torch_hpu_available() is "
                "False", f"pip install 'accelerate>={acc_min}'")
        else:
            add("stack.accelerate", "ok", f"accelerate {acc} (>= {acc_min})")
    # FP8 (core.fp8): Intel Neural Compressor measures and quantizes; optimum-habana is out of support.
    inc = versions.get("neural-compressor-pt")
    if inc:
        add("stack.inc", "ok", f"Intel Neural Compressor (neural-compressor-pt) {inc}: FP8 calibrate / --fp8")
    else:
        add("stack.inc", "ok", "Intel Neural Compressor is not installed: FP8 (gaudi-gui calibrate, --fp8) "
                               "needs it (pip install neural-compressor-pt)")
    if versions.get("optimum-habana"):
        add("stack.optimum-habana.support", "warning",
            f"optimum-habana {versions['optimum-habana']} is out of support since 2026-10-31; its last "
            "release (1.21.2) pins transformers 4.55, so it cannot sit beside transformers 5.x",
            "serve with vllm-gaudi (the maintained path); pip uninstall optimum-habana")
    sw = _version_of(versions.get("driver"))
    installed = [(pkg, versions[pkg]) for pkg in _TABLE_PACKAGES if versions.get(pkg)]
    if not sw:
        for pkg, have in installed:
            add(f"stack.{pkg}", "ok", f"{pkg} {have} installed (no Gaudi software here to check it against)")
        return out
    row, exact = compat_row(compat, sw)
    if row is None:
        listed = ", ".join(f"{p} {v}" for p, v in installed) or "no packages"
        add("stack.compat", "warning", f"Gaudi software {sw} is not in the compatibility table: {listed} "
            "not verified", f"update {_compat_path()} from Intel's support matrix")
        return out
    where = f"Gaudi software {sw}" + ("" if exact else f" (table row {row.get('gaudi_software')})")
    add("stack.compat", "ok", f"{where} is in the compatibility table (source {row.get('source', '?')}, "
        f"read {row.get('date', '?')})")
    plugin = versions.get("habana-torch-plugin", "")
    if not plugin:
        add("stack.plugin", "warning", f"habana-torch-plugin is not installed with {where}: torch cannot use "
            "the cards", f"install habana-torch-plugin {sw} (or run in Intel's {sw} container)")
    elif _release(plugin, 2) != _release(sw, 2) or (exact and _version_of(plugin) != sw):
        add("stack.plugin", "error", f"habana-torch-plugin {plugin} with driver {sw}",
            f"install habana-torch-plugin {sw} (or the matching container)")
    else:
        add("stack.plugin", "ok", f"habana-torch-plugin {plugin} matches driver {sw}")
    minimums = {str(k): str(v) for k, v in dict(row.get("minimums", {})).items()}
    unverified: list[str] = []
    for pkg, have in installed:
        if pkg == "torch" and row.get("torch"):
            want = str(row["torch"])
            got_rel, want_rel = _release(have, 2), _release(want, 2)
            if got_rel is None or want_rel is None:
                add("stack.torch", "warning", f"torch {have}: version could not be compared with {want}",
                    f"install the torch {where} ships ({want})")
            elif got_rel != want_rel:
                add("stack.torch", "warning", f"torch {have}, {where} ships torch {want}",
                    f"install the torch {where} ships ({want}), e.g. Intel's {sw} container")
            else:
                add("stack.torch", "ok", f"torch {have} ({where} ships {want})")
        elif pkg in minimums:
            older = _older(have, minimums[pkg])
            if older is None:
                add(f"stack.{pkg}", "warning", f"{pkg} {have}: version could not be compared with "
                    f"{minimums[pkg]}", f"pip install '{pkg}>={minimums[pkg]}'")
            elif older:
                add(f"stack.{pkg}", "warning", f"{pkg} {have} older than {minimums[pkg]} ({where})",
                    f"pip install '{pkg}>={minimums[pkg]}'")
            else:
                add(f"stack.{pkg}", "ok", f"{pkg} {have} (>= {minimums[pkg]} for {where})")
        else:
            unverified.append(f"{pkg} {have}")
    if unverified:
        add("stack.unverified", "warning", f"not in the table's row for {where}: {', '.join(unverified)} "
            "(unknown, not checked)",
            f"check Intel's support matrix; add them to {_compat_path()}")
    return out


def module_findings(proc: Path, dev: Path, card_count: int | None, *, host: str = "local") -> list[Finding]:
    """Kernel modules (habanalabs and _cn/_ib/_en) and /dev/accel nodes against hl-smi's count."""
    out: list[Finding] = []
    try:
        loaded = {line.split()[0] for line in (proc / "modules").read_text().splitlines() if line.strip()}
    except OSError as exc:
        out.append(Finding("stack.modules", "warning", f"could not read {proc / 'modules'}: {exc.strerror}",
                           "run lsmod | grep habanalabs", host=host))
        loaded = None
    if loaded is not None:
        if "habanalabs" not in loaded:
            out.append(Finding("stack.modules", "error", "kernel module habanalabs is not loaded",
                               "sudo modprobe habanalabs (install habanalabs-dkms)", host=host))
        else:
            missing = [m for m in ("habanalabs_cn", "habanalabs_en", "habanalabs_ib") if m not in loaded]
            if missing:
                out.append(Finding("stack.modules", "warning", f"not loaded: {', '.join(missing)}",
                                   "sudo modprobe " + " ".join(missing) + " (scale-out needs them)",
                                   host=host))
            else:
                out.append(Finding("stack.modules", "ok", "habanalabs, _cn, _en, _ib loaded", host=host))
    nodes = accel_nodes(dev)
    if card_count is not None and len(nodes) != card_count:
        out.append(Finding("stack.devices", "error", f"{len(nodes)} /dev/accel nodes, hl-smi sees "
                           f"{card_count} cards", "reload habanalabs; check dmesg", host=host))
    elif nodes:
        out.append(Finding("stack.devices", "ok", f"{len(nodes)} /dev/accel nodes", host=host))
    return out


def accel_holders(proc: Path, dev: Path) -> dict[int, list[int]]:
    """{accel number: [pids]} of the processes here holding /dev/accel/accelN open (readable ones)."""
    holders: dict[int, list[int]] = {}
    prefix = str(dev / "accel" / "accel")
    try:
        pids = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return holders
    for pid_dir in pids:
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            rest = target[len(prefix):] if target.startswith(prefix) else ""
            if rest.isdigit() and int(pid_dir.name) != os.getpid():
                holders.setdefault(int(rest), []).append(int(pid_dir.name))
    return holders


def _held_text(fd_pids: Sequence[int], listed: Sequence[tuple[int | None, str]], proc: Path) -> str:
    """'held by pid 4242 (python3 train.py)' from both sources; '' when neither names a holder.

    The /proc scan sees the processes of this machine (this container) that hold the node open;
    hl-smi's list also names processes of other containers (pids this /proc does not have) and,
    without root, may show only the caller's own ones, so the two are joined, never one chosen."""
    names = {pid: name for pid, name in listed if pid is not None}
    pids = list(dict.fromkeys([*fd_pids, *names]))
    parts: list[str] = []
    outside: list[str] = []
    for pid in pids:
        label = f"{pid} ({names[pid]})" if names.get(pid) else str(pid)
        if pid in fd_pids or (proc / str(pid)).is_dir():
            parts.append(label)
        else:
            outside.append(label)
    hidden = [name for pid, name in listed if pid is None]
    text = f"held by pid {', '.join(parts)}" if parts else ""
    if outside or hidden:
        who = ", ".join([f"pid {o}" for o in outside] + [n or "a process" for n in hidden])
        text = ((text + "; " if text else "held by ")
                + f"{who}: a process outside this view (another container?)")
    return text


def free_groups(free: Sequence[int], sick: Sequence[int] = ()) -> list[frozenset[int]]:
    """Intel's supported groups (0,1 2,3 4,5 6,7 0-3 4-7) whose cards are all free and not sick."""
    usable = set(free) - set(sick)
    return [g for g in SUPPORTED_GROUPS if g <= usable]


def run_tool(argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``argv``; 124 when it did not finish within ``timeout_s``,
    127 when it could not start.

    The tool runs in a session of its own. ``subprocess.run(timeout=)`` kills the tool alone: a
    wrapper's helper (``sleep &``, ``setsid helper &``) lived on, and one holding the output pipes
    kept the call waiting until the timeout. Here, on a timeout, once the tool exited and its
    helpers still hold the pipes past ``HELPER_GRACE_S``, and on any error while waiting, its
    session's group and every descendant seen are ended (``core.proctree.ProcessTree.kill``)."""
    import time

    from gaudi_gui.core.proctree import ProcessTree
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        return 127, "", str(exc)
    tree = ProcessTree(proc.pid)  # start_new_session: the group id is the tool's pid
    deadline = time.monotonic() + timeout_s
    exited_at: float | None = None
    finished = False
    out, err = b"", b""
    # Look at the tree (a scan of the process table) often at first, then less: a helper that
    # leaves the group is found while its parent lives, and the kill looks once more itself.
    slice_s = 0.05
    try:
        while True:
            tree.record()
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                # Retrying communicate() after its timeout loses no output (documented).
                out, err = proc.communicate(timeout=min(slice_s, deadline - now))
                finished = True
                break
            except subprocess.TimeoutExpired:
                if proc.poll() is not None:
                    exited_at = exited_at or now  # the tool is gone, a helper holds the pipes
                    if now - exited_at > HELPER_GRACE_S:
                        break
            slice_s = min(slice_s * 2, 0.5)
    finally:
        tree.kill()  # helpers of a finished tool, the whole tree of a hung one, or after an error
    if not finished:
        try:
            out, err = proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            # A helper that escaped the tree (a session we never saw) holds the pipes: stop reading.
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            proc.wait()
    text_out = (out or b"").decode("utf-8", errors="replace")
    text_err = (err or b"").decode("utf-8", errors="replace")
    if exited_at is None and not finished:
        return 124, text_out, f"timed out after {timeout_s:g} s (it and every process it started were ended)"
    return proc.returncode, text_out, text_err



def _query_cards(hl_smi: str, timeout_s: float) -> list[dict[str, Any]]:
    """The cards of hl-smi's device query (``-Q index,module_id,bus_id,name``), as ``HostHealth.cards``
    rows; [] when it fails or lists none."""
    fields = ("index", "module_id", "bus_id", "name")
    rc, out, _err = run_tool([hl_smi, *query_args(fields)], timeout_s)
    if rc != 0:
        return []
    return [{"index": c.index, "module_id": c.module_id if c.module_id is not None else c.index,
             "bus_id": c.bus_id or "", "name": c.name or ""} for c in parse_csv(out, fields).samples]


def check_host(roots: Roots | None = None, *, host: str = "local", cards: Sequence[int] | None = None,
               compat: dict[str, Any] | None = None) -> HostHealth:
    """Run every check this machine allows; return what was seen (never raises for a sick machine)."""
    roots = roots or Roots()
    findings: list[Finding] = []
    versions = package_versions()
    program, chosen = hl_smi_program(roots.hl_smi)
    hl_smi = shutil.which(program) or ""
    if not hl_smi:
        evidence = gaudi_evidence(roots)
        if chosen:
            findings.append(Finding("stack.hl-smi", "error", f"hl-smi {program} cannot be run here: not "
                                    "found or not executable", "check the hl-smi path (--hl-smi, the "
                                    "host's saved path, GAUDI_GUI_HL_SMI)", host=host))
        elif evidence:
            findings.append(Finding("stack.hl-smi", "error", f"no hl-smi, but {evidence}: the cards "
                                    "cannot be checked", "install habanalabs-firmware-tools, or name "
                                    "the hl-smi: --hl-smi PATH, hosts --add HOST --hl-smi PATH, "
                                    "GAUDI_GUI_HL_SMI", host=host))
        else:
            findings.append(Finding("stack.hl-smi", "ok", "no hl-smi, no /dev/accel nodes and no "
                                    "habanalabs driver: no Gaudi cards on this machine (fine on a CPU or "
                                    "CUDA machine)", host=host))
        findings.extend(stack_findings(versions, host=host, compat=compat))
        if chosen or evidence:
            findings.extend(module_findings(roots.proc, roots.dev, None, host=host))
        return HostHealth(host, True, "", tuple(findings), (), (), versions)
    rc, out, err = run_tool([hl_smi, "-q"], roots.timeout_s)
    header, parsed = parse_query(out) if rc == 0 else ({}, [])
    queried: list[dict[str, Any]] = []  # the cards of the device query, when -q named none
    if rc != 0:
        findings.append(Finding("stack.hl-smi", "error", f"hl-smi -q failed (exit {rc}): "
                                f"{(err.strip().splitlines() or ['no output on stderr'])[-1]}",
                                "check the driver: dmesg | grep habanalabs", host=host))
    elif not parsed:
        # It answered, without a per-card section: what Devices shows comes from the device query
        # (-Q), so ask it too, and say both, rather than "no cards" beside a Devices tab of 8.
        queried = _query_cards(hl_smi, roots.timeout_s)
        where = (f"its device query lists {len(queried)} card{'s' if len(queried) != 1 else ''} "
                 f"({cards_name([c['module_id'] for c in queried])}), whose health could not be checked"
                 if queried else "its device query lists no card either")
        findings.append(Finding("stack.hl-smi", "error", f"hl-smi -q answered (exit 0) with no per-card "
                                f"section: {where}", "check the driver and hl-smi's version (dmesg | "
                                "grep habanalabs; hl-smi -q by hand)", host=host))
    driver = _version_of(header.get("driver version"))
    versions["driver"] = header.get("driver version", "")
    versions["hl-smi"] = header.get("hl-smi version", "")
    fw = {_card_ids(c): _version_of(_first(c, "firmware [spi] version")
                                    or _first(c, "firmware [fit] version")) for c in parsed}
    drivers = {v for v in fw.values() if v}
    versions["firmware"] = ",".join(sorted(drivers))
    findings.extend(firmware_findings(fw, driver, host=host))
    findings.extend(stack_findings(versions, host=host, compat=compat))
    count = len(parsed) or len(queried)
    findings.extend(module_findings(roots.proc, roots.dev, count or None, host=host))
    holders = accel_holders(roots.proc, roots.dev)
    # One `-n link` call per card: run them side by side (8 serial hl-smi starts dominated the time).
    from concurrent.futures import ThreadPoolExecutor
    buses = [c["_bus_id"] for c in parsed if cards is None
             or int(_first(c, "module id") or c["_index"]) in cards]
    with ThreadPoolExecutor(max_workers=max(1, min(9, len(buses) + 1))) as pool:
        # hl-smi's own process list (its summary's "Compute Processes") runs beside the link calls.
        summary = pool.submit(run_tool, [hl_smi], roots.timeout_s) if parsed else None
        link_runs = dict(zip(buses, pool.map(
            lambda bus: run_tool([hl_smi, "-n", "link", "-i", bus], roots.timeout_s), buses), strict=True))
        listed = parse_processes(summary.result()[1]) if summary and summary.result()[0] == 0 else {}
    # Cards only the device query listed are shown (never "no cards" beside Devices) but not free:
    # nothing about them was checked.
    card_rows: list[dict[str, Any]] = list(queried)
    free: list[int] = []
    for card in parsed:
        idx = int(card["_index"])
        mod_text = _first(card, "module id")
        mod = int(mod_text) if mod_text and mod_text.strip().isdigit() else idx
        card_rows.append({"index": idx, "module_id": mod, "bus_id": card["_bus_id"],
                          "name": _first(card, "product name") or ""})
        if cards is not None and mod not in cards:
            continue
        accel = card.get("_accel", f"accel{idx}")
        try:
            status: str | None = (roots.sysfs / "class" / "accel" / accel / "device" / "status").read_text()
        except OSError:
            status = None
        findings.extend(card_findings(card, host=host, sysfs_status=status))
        pids = holders.get(int(accel[5:]) if accel[5:].isdigit() else idx, [])
        used = _number(_first(card, "memory usage/used")) or 0
        held = _held_text(pids, listed.get(idx, []), roots.proc)
        if held:
            findings.append(Finding("busy.held", "error", held,
                                    "stop that process or choose free cards", mod, idx, host))
        elif used > 1024:
            # No process here holds it but its memory is in use: another container's process.
            findings.append(Finding("busy.held", "warning", f"{used:.0f} MB in use and no process here "
                                    "holds it: held by a process outside this view (another container?)",
                                    "free it there or choose free cards", mod, idx, host))
        else:
            free.append(mod)
        rc_n, link_out, _ = link_runs[card["_bus_id"]]
        ports = parse_links(link_out) if rc_n == 0 else {}
        if not ports:
            findings.append(Finding("net.ports", "warning", "scale-out ports could not be read",
                                    f"run hl-smi -n link -i {card['_bus_id']}", mod, idx, host))
        else:
            down = sorted(p for p, up in ports.items() if not up)
            if down:
                findings.append(Finding("net.ports", "error", f"ports {format_ids(down)} DOWN",
                                        "check the cables/switch; ip link / hl-smi -n link", mod, idx, host))
            else:
                findings.append(Finding("net.ports", "ok", f"{len(ports)} ports UP", "", mod, idx, host))
    return HostHealth(host, True, "", tuple(findings), tuple(card_rows), tuple(sorted(free)), versions)


def cross_host_findings(hosts: Sequence[HostHealth]) -> list[Finding]:
    """Versions that differ between reachable hosts (a multi-node job needs them equal)."""
    up = [h for h in hosts if h.reachable]
    if len(up) < 2:
        return []
    out: list[Finding] = []
    for key in ("driver", "firmware", "habana-torch-plugin", "torch", "transformers", "accelerate"):
        seen = {h.host: h.versions.get(key, "") for h in up}
        if len(set(seen.values())) > 1:
            out.append(Finding("hosts.versions", "error", f"{key} differs: " + ", ".join(
                f"{h} {v or 'none'}" for h, v in seen.items()), "install the same Gaudi software and "
                "packages on every host", host=",".join(seen)))
    return out


# --------------------------------------------------------------------------------------------------
# Smoke test orchestration: one child per card, in parallel, each seeing only its card.
# --------------------------------------------------------------------------------------------------


def smoke_argv(kind: str) -> list[str]:
    import sys
    return [sys.executable, "-m", "gaudi_gui.workers.smoke", kind]


def smoke_env(kind: str, card: int | None) -> dict[str, str]:
    env = dict(os.environ)
    if kind == "hpu" and card is not None:
        env["HABANA_VISIBLE_MODULES"] = str(card)
        env["PT_ENABLE_INT64_SUPPORT"] = "1"
    elif kind == "cuda" and card is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(card)
    return env


def classify_smoke(code: int | None, output: str) -> tuple[str, str, str]:
    """(severity, seen, fix) for one child's exit code (None: timed out) and output."""
    last = (output.strip().splitlines() or [""])[-1][:300]
    if code is None:
        return ("error", "smoke test timed out (killed)",
                "the card may be hung or held: check hl-smi, reset it (hl-smi -r)")
    if code == 0 and "SMOKE OK" in output:
        return "ok", "smoke test passed", ""
    if "already acquired" in output.lower() or "synstatus=20" in output.lower():
        return "error", f"held by another process: {last}", "stop the other process or choose free cards"
    if "acquire" in output.lower():
        return ("error", f"acquire failed: {last}",
                "check that driver, firmware and habana-torch-plugin versions match (gaudi-gui doctor)")
    return "error", f"smoke test failed (exit {code}): {last or 'no output'}", "see the message above"


def run_smoke(kind: str, cards: Sequence[tuple[int | None, int | None]], *, timeout_s: float = 120.0,
              argv: Sequence[str] | None = None, host: str = "local") -> list[Finding]:
    """One "smoke" finding per (module_id, index) card (a single (None, None) on a CPU machine).

    ``argv`` replaces the child command (tests start children that pass, fail and hang); the child's
    whole tree is killed on timeout (it runs in its own session)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from gaudi_gui.core.proctree import ProcessTree

    started: list[ProcessTree] = []
    lock = threading.Lock()

    def one(card: tuple[int | None, int | None]) -> Finding:
        module_id, index = card
        visible = module_id if kind == "hpu" else index
        cmd = list(argv) if argv is not None else smoke_argv(kind)
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", env=smoke_env(kind, visible), start_new_session=True,
                                    stdin=subprocess.DEVNULL)
        except OSError as exc:
            return Finding("smoke", "error", f"could not start the smoke child: {exc}", "",
                           module_id, index, host)
        tree = ProcessTree(proc.pid)  # its own session: the group id is its pid
        with lock:
            started.append(tree)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            tree.kill()
            out, _ = proc.communicate()
            code = None
        except BaseException:
            # Any other failure while waiting (a timeout communicate() cannot use, an interrupt):
            # the child and what it started end here, not later on their own.
            tree.kill()
            proc.communicate()
            raise
        severity, seen, fix = classify_smoke(code, out or "")
        if code is None:
            seen = f"smoke test timed out after {timeout_s:g} s (killed)"
        return Finding("smoke", severity, seen, fix, module_id, index, host)

    if not cards:
        return []
    pool = ThreadPoolExecutor(max_workers=min(16, len(cards)))
    try:
        return list(pool.map(one, cards))
    except BaseException:
        # One child failed (or this thread was interrupted): end every child started, so that the
        # other waits return now and nothing outlives the doctor.
        with lock:
            trees = list(started)
        for tree in trees:
            tree.kill()
        raise
    finally:
        pool.shutdown(wait=True)
