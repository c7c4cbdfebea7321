"""``gaudi-gui benchmark``: what a reference benchmark measured, and an honest verdict against a reference.

The workloads (``WORKLOADS``) run in ``gaudi_gui.workers.benchmark`` (one process per card); their
repeats are interleaved (repeat 1 of every workload, then repeat 2 ...), so a slow minute of the machine
spreads over every figure instead of sinking one. Here, Qt-free and torch-free:

- ``Figure``: one measured figure (its samples, per card for the matmul roofline): median, the range
  of its samples and their spread (range / median).
- ``Reference``: what a run is judged against: a previous benchmark run (its run folder, or its
  result.json copied elsewhere) or a table of expected figures per card type, each with its ``source``
  (``resources/benchmark-reference.json``: entries only where a published figure exists).
- ``verdict``: per figure, in this order: one sample is "cannot say" (a verdict never rests on one);
  medians within ``TOLERANCE`` of the reference's are "as expected" (the spreads said beside it); a
  figure whose repeats (or the reference's) spread wider than ``WIDE_SPREAD`` is "cannot say (spread
  too wide)"; every sample below the reference's lowest is "slower than the reference by X % (beyond
  the spread of N repeats)" (above its highest: "faster"); anything else is "cannot say": the
  difference lies within the spread.
- ``slow_cards``: the card among several whose roofline is below the others' beyond the spreads.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The result file of a benchmark run (written by its supervisor from the RESULT event: core.jobkind).
RESULT_NAME = "result.json"
RESULT_VERSION = 1
#: A reference table's ``format``.
TABLE_FORMAT = "gaudi-gui-benchmark-reference"
TABLE_NAME = "benchmark-reference.json"
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

#: A figure whose samples spread wider than this (range / median) is no base for a verdict.
WIDE_SPREAD = 0.30
#: Medians closer than this (relative to the reference) are as expected whatever the spreads.
TOLERANCE = 0.10
#: A card is named slow when its roofline is this far below the other cards' median, beyond the spreads.
SLOW_CARD = 0.10


@dataclass(frozen=True)
class Workload:
    key: str
    text: str
    unit: str


#: Every figure a benchmark can measure, in the order they run and are shown. Higher is better for all.
WORKLOADS: tuple[Workload, ...] = (
    Workload("matmul.bf16", "matmul roofline, bf16", "TFLOPS"),
    Workload("matmul.fp8", "matmul roofline, fp8", "TFLOPS"),
    Workload("matmul.fp32", "matmul roofline, fp32 (CPU)", "TFLOPS"),
    Workload("copy.h2d", "copy host → device", "GB/s"),
    Workload("copy.d2h", "copy device → host", "GB/s"),
    Workload("allreduce", "all-reduce (bus bandwidth)", "GB/s"),
    Workload("decode", "decode, bench model", "tokens/s"),
    Workload("train_step", "training step, bench model", "tokens/s"),
)
WORKLOAD_OF = {w.key: w for w in WORKLOADS}


@dataclass(frozen=True)
class Size:
    """The fixed sizes of one benchmark size: figures of different sizes are never compared."""

    name: str
    matmul_n: int
    copy_mib: int
    allreduce_mib: int
    #: The bench model (a Llama of these dimensions, random weights, seeded).
    hidden: int
    layers: int
    vocab: int
    batch: int
    seq: int
    new_tokens: int
    #: Each sample times its workload for at least this long (rates: more iterations, same figure).
    min_s: float
    #: A benchmark whose workers say nothing for this long is ended as failed (a collective that hangs).
    stall_s: float


SIZES: dict[str, Size] = {s.name: s for s in (
    # The test suite's: seconds on two CPU cores.
    Size("tiny", matmul_n=128, copy_mib=4, allreduce_mib=1, hidden=64, layers=2, vocab=256, batch=2, seq=32,
         new_tokens=8, min_s=0.1, stall_s=60.0),
    Size("standard", matmul_n=4096, copy_mib=256, allreduce_mib=64, hidden=512, layers=4, vocab=8192,
         batch=4, seq=256, new_tokens=32, min_s=0.5, stall_s=600.0),
)}


class BenchmarkInputError(ValueError):
    """Bad input: one line, exit 2."""


# -- figures ------------------------------------------------------------------------------------


@dataclass
class Figure:
    """One measured figure: its samples in repeat order (``cards``: per card, for a per-card figure;
    ``samples`` then is the median over the cards of each repeat)."""

    key: str
    samples: list[float] = field(default_factory=list)
    cards: dict[str, list[float]] = field(default_factory=dict)
    #: Where it came from, for a reference's figure ("run 20261206-…", a table's source).
    source: str = ""

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples)) if self.samples else math.nan

    @property
    def low(self) -> float:
        return min(self.samples) if self.samples else math.nan

    @property
    def high(self) -> float:
        return max(self.samples) if self.samples else math.nan

    @property
    def spread(self) -> float:
        """(highest - lowest) / median of the samples; 0 for one sample (no spread measured)."""
        med = self.median
        if self.n < 2 or not med or math.isnan(med):
            return 0.0
        return (self.high - self.low) / med

    def to_json(self) -> dict[str, Any]:
        work = WORKLOAD_OF.get(self.key)
        out: dict[str, Any] = {"text": work.text if work else self.key, "unit": work.unit if work else "",
                               "samples": list(self.samples), "n": self.n, "median": _round(self.median),
                               "low": _round(self.low), "high": _round(self.high),
                               "spread": _round(self.spread)}
        if self.cards:
            out["cards"] = {card: list(values) for card, values in self.cards.items()}
        if self.source:
            out["source"] = self.source
        return out

    @classmethod
    def from_json(cls, key: str, data: Mapping[str, Any]) -> Figure:
        samples = [float(v) for v in data.get("samples") or [] if _finite(v)]
        cards = {str(c): [float(v) for v in values if _finite(v)]
                 for c, values in (data.get("cards") or {}).items() if isinstance(values, list)}
        return cls(key, samples, cards, str(data.get("source") or ""))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _round(value: float) -> float | None:
    return None if math.isnan(value) else float(f"{value:.6g}")


def interleaved(workloads: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """The order the worker runs: (repeat, workload) with every workload once per repeat, each repeat
    starting one workload further on (no workload always runs first, after the model's load)."""
    order: list[tuple[int, str]] = []
    n = len(workloads)
    for r in range(repeats):
        shift = r % n if n else 0
        order += [(r, w) for w in [*workloads[shift:], *workloads[:shift]]]
    return order


def collect(samples: Sequence[Mapping[str, Any]]) -> dict[str, Figure]:
    """Figures from the worker's ``bench_sample`` events ({workload, card, repeat, value}): per card
    in repeat order; a per-card figure's ``samples`` are each repeat's median over its cards."""
    by: dict[str, dict[str, dict[int, float]]] = {}
    for sample in samples:
        value = sample.get("value")
        if not _finite(value):
            continue
        key = str(sample.get("workload"))
        card = str(sample.get("card", ""))
        by.setdefault(key, {}).setdefault(card, {})[int(sample.get("repeat", 0))] = float(value or 0.0)
    figures: dict[str, Figure] = {}
    for key in [w.key for w in WORKLOADS if w.key in by] + sorted(k for k in by if k not in WORKLOAD_OF):
        per_card = by[key]
        repeats = sorted({r for values in per_card.values() for r in values})
        samples_ = [float(statistics.median([v[r] for v in per_card.values() if r in v])) for r in repeats]
        cards = {c: [v[r] for r in sorted(v)] for c, v in sorted(per_card.items())} if len(per_card) > 1 \
            or key.startswith("matmul.") else {}
        figures[key] = Figure(key, samples_, cards)
    return figures


# -- verdicts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    key: str
    #: "as expected", "slower", "faster", "cannot say", "no reference"
    word: str
    words: str
    #: (median - reference) / reference; None without a reference.
    change: float | None = None
    card: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"figure": self.key, "card": self.card, "verdict": self.word, "words": self.words,
                "change": None if self.change is None else _round(self.change)}


def verdict(own: Figure, ref: Figure | None, *, card: str = "", against: str = "the reference") -> Verdict:
    """The honest verdict of ``own`` against ``ref`` (see the module's rules); ``against`` names the
    reference in the words (Compare of benchmark runs: "the first run")."""
    if ref is None or not ref.samples:
        return Verdict(own.key, "no reference", f"no {against.removeprefix('the ')} figure", card=card)
    if own.n < 2:
        return Verdict(own.key, "cannot say", "cannot say (one sample: run at least 2 repeats)", card=card)
    r = ref.median
    change = (own.median - r) / r if r else math.nan
    if math.isnan(change):
        return Verdict(own.key, "cannot say", f"cannot say ({against}'s figure is 0)", card=card)
    spreads = f"spread {own.spread * 100:.0f} %"
    if ref.spread:
        spreads += f", {against}'s {ref.spread * 100:.0f} %"
    if abs(change) <= TOLERANCE:
        return Verdict(own.key, "as expected", f"as expected ({change * 100:+.0f} %; {spreads})", change,
                       card)
    wide = [f"{who} {f.n} repeats spread {f.spread * 100:.0f} %"
            for who, f in (("these", own), (f"{against}'s", ref)) if f.spread > WIDE_SPREAD]
    if wide:
        return Verdict(own.key, "cannot say", f"cannot say (spread too wide: {'; '.join(wide)}; the medians "
                                              f"differ by {change * 100:+.0f} %)", change, card)
    beyond = f"beyond the spread of {own.n} repeats"
    if own.high < ref.low:
        return Verdict(own.key, "slower", f"slower than {against} by {-change * 100:.0f} % ({beyond})",
                       change, card)
    if own.low > ref.high:
        return Verdict(own.key, "faster", f"faster than {against} by {change * 100:.0f} % ({beyond})",
                       change, card)
    return Verdict(own.key, "cannot say", f"cannot say (spread too wide: {change * 100:+.0f} % is within the "
                                          f"spread of {own.n} repeats)", change, card)


def verdicts(figures: Mapping[str, Figure], reference: Reference | None) -> list[Verdict]:
    """Every figure's verdict, and each card's for a per-card figure of several cards."""
    out: list[Verdict] = []
    for key, figure in figures.items():
        ref = reference.figures.get(key) if reference is not None else None
        out.append(verdict(figure, ref))
        if len(figure.cards) > 1:
            for card, values in figure.cards.items():
                out.append(verdict(Figure(key, values), ref, card=card))
    return out


@dataclass(frozen=True)
class SlowCard:
    key: str
    card: str
    median: float
    others: float
    below: float

    def words(self, noun: str = "card") -> str:
        work = WORKLOAD_OF.get(self.key)
        return (f"{noun} {self.card} is slower than the other {noun}s by {self.below * 100:.0f} % "
                f"({work.text if work else self.key}: {self.median:.4g} against {self.others:.4g} "
                f"{work.unit if work else ''}, beyond the spreads)").replace("  ", " ")

    def to_json(self, noun: str = "card") -> dict[str, Any]:
        return {"figure": self.key, "card": self.card, "median": _round(self.median),
                "others": _round(self.others), "below": _round(self.below), "words": self.words(noun)}


def slow_cards(figure: Figure) -> list[SlowCard]:
    """The cards of a per-card figure (three or more: two cards cannot say which one is off) whose
    samples all lie below every other card's lowest sample and whose median is more than ``SLOW_CARD``
    below the median of the other cards' medians."""
    if len(figure.cards) < 3:
        return []
    out: list[SlowCard] = []
    for card, values in figure.cards.items():
        others = {c: v for c, v in figure.cards.items() if c != card and v}
        if len(values) < 2 or not others:
            continue
        rest = float(statistics.median([statistics.median(v) for v in others.values()]))
        mine = float(statistics.median(values))
        below = (rest - mine) / rest if rest else 0.0
        lowest_other = min(min(v) for v in others.values())
        if below > SLOW_CARD and max(values) < lowest_other:
            out.append(SlowCard(figure.key, card, mine, rest, below))
    return out


# -- references -----------------------------------------------------------------------------------


@dataclass
class Reference:
    """What a run is judged against."""

    #: "run" (a previous benchmark run) or "table" (expected figures with their sources).
    kind: str
    label: str
    card_type: str
    size: str
    figures: dict[str, Figure]
    #: Where it is (a run folder, a file).
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "card_type": self.card_type, "size": self.size,
                "path": self.path, "figures": {k: f.to_json() for k, f in self.figures.items()}}


def read_result(path: Path) -> dict[str, Any]:
    """A benchmark result (a run folder's result.json, or the file itself); BenchmarkInputError."""
    file = path / RESULT_NAME if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        where = f"{path} has no {RESULT_NAME} (not a finished benchmark run)" if path.is_dir() \
            else f"{path}: no such file or run"
        raise BenchmarkInputError(where) from None
    except (OSError, ValueError) as exc:
        raise BenchmarkInputError(f"{file}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BenchmarkInputError(f"{file}: not a benchmark result or reference table (a JSON object)")
    return data


def latest_result(runs_root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest finished benchmark run of a runs store and its result (None: none yet)."""
    folders = sorted((p for p in runs_root.glob("*") if (p / RESULT_NAME).is_file()), reverse=True) \
        if runs_root.is_dir() else []
    for folder in folders[:200]:
        try:
            data = read_result(folder)
        except BenchmarkInputError:
            continue
        if data.get("kind") == "benchmark":
            return folder, data
    return None


def reference_from_result(data: Mapping[str, Any], path: str) -> Reference:
    figures = data.get("figures")
    identity = data.get("identity") or {}
    if data.get("kind") != "benchmark" or not isinstance(figures, dict) or not isinstance(identity, dict):
        raise BenchmarkInputError(f"{path}: not a benchmark result (no kind 'benchmark' with figures)")
    if data.get("version", RESULT_VERSION) != RESULT_VERSION:
        raise BenchmarkInputError(f"{path}: measured by benchmark version {data.get('version')}, this is "
                                  f"version {RESULT_VERSION}: the workloads differ")
    name = Path(path).parent.name if Path(path).name == RESULT_NAME else Path(path).name
    label = f"run {name}"
    found = {k: Figure.from_json(k, v) for k, v in figures.items() if isinstance(v, dict)}
    for figure in found.values():
        figure.source = label
    return Reference("run", label, str(identity.get("card_type") or ""), str(data.get("size") or ""), found,
                     path)


def reference_from_table(data: Mapping[str, Any], path: str, card_type: str, size: str) -> Reference:
    """The figures a table gives for ``card_type``; BenchmarkInputError when it has none for it (naming
    both) or a figure without its source."""
    cards = data.get("cards")
    if not isinstance(cards, dict):
        raise BenchmarkInputError(f"{path}: a reference table needs 'cards' (card type -> figures)")
    if card_type not in cards:
        have = ", ".join(sorted(cards)) or "none"
        raise BenchmarkInputError(f"{path}: the reference has figures for {have}, not for this machine's "
                                  f"{card_type}")
    entry = cards[card_type]
    if not isinstance(entry, dict) or not isinstance(entry.get("figures"), dict):
        raise BenchmarkInputError(f"{path}: cards.{card_type}: needs 'figures'")
    figures: dict[str, Figure] = {}
    for key, spec in entry["figures"].items():
        if not isinstance(spec, dict) or not _finite(spec.get("value")) or not str(spec.get("source") or ""):
            raise BenchmarkInputError(f"{path}: cards.{card_type}.figures.{key}: needs a number 'value' and "
                                      "its 'source' (who measured it, on which software version)")
        value = float(spec.get("value") or 0.0)
        spread = float(spec["spread"]) if _finite(spec.get("spread")) else 0.0
        half = value * spread / 2
        samples = [value - half, value, value + half] if half else [value, value]
        figures[str(key)] = Figure(str(key), samples, {}, str(spec["source"]))
    return Reference("table", f"table {Path(path).name} ({card_type})", card_type,
                     str(entry.get("size") or size), figures, path)


def load_reference(where: str, *, card_type: str, size: str, runs_root: Path | None = None) -> Reference:
    """``--reference FILE|RUN`` for a machine of ``card_type`` running ``size``: a run folder, a run's
    name in the runs store, a result.json, or a reference table. BenchmarkInputError (one line) when it
    is missing, unreadable, of another card type (naming both) or of another size."""
    path = Path(where).expanduser()
    if not path.exists() and runs_root is not None and where and "/" not in where \
            and (runs_root / where).is_dir():
        path = runs_root / where
    if not path.exists():
        raise BenchmarkInputError(f"{where}: no such file or run")
    data = read_result(path)
    if data.get("format") == TABLE_FORMAT:
        ref = reference_from_table(data, str(path), card_type, size)
    else:
        ref = reference_from_result(data, str(path))
        if ref.card_type != card_type:
            measured = ref.card_type or "an unknown card"
            raise BenchmarkInputError(f"{where}: the reference was measured on {measured}, this machine has "
                                      f"{card_type}: figures of another card type say nothing about these")
    if ref.size and ref.size != size:
        raise BenchmarkInputError(f"{where}: the reference was measured at size {ref.size}, this benchmark "
                                  f"runs {size} (--size {ref.size})")
    return ref


# -- the result and its table -----------------------------------------------------------------------


def card_noun(identity: Mapping[str, Any]) -> str:
    """How the machine's cards are named: Gaudi cards by module id ("module 5"), others "card 0"."""
    return "module" if identity.get("device") == "hpu" else "card"


def judged(record: dict[str, Any], reference: Reference | None) -> dict[str, Any]:
    """``record`` (a result) with its verdicts against ``reference`` and its slow cards."""
    figures = {k: Figure.from_json(k, v) for k, v in (record.get("figures") or {}).items()
               if isinstance(v, dict)}
    out = dict(record)
    out["reference"] = reference.to_json() if reference is not None else None
    out["verdicts"] = [v.to_json() for v in verdicts(figures, reference)]
    slow = [s for f in figures.values() for s in slow_cards(f)]
    findings = record.get("card_findings") or {}
    noun = card_noun(record.get("identity") or {})
    out["slow_cards"] = [{**s.to_json(noun), "findings": list(findings.get(s.card) or [])} for s in slow]
    return out


def summary_words(record: Mapping[str, Any]) -> str:
    """A finished benchmark in a few words (its run's summary: ``runs list``, the window's jobs):
    "6 figures on 2 × cpu; against run X: 4 as expected, 1 slower, 1 cannot say; slow card 5"."""
    figures = record.get("figures") or {}
    identity = record.get("identity") or {}
    plural = "s" if len(figures) != 1 else ""
    words = (f"{len(figures)} figure{plural} on {identity.get('card_count') or '?'} × "
             f"{identity.get('card_type') or '?'}")
    overall = [v for v in record.get("verdicts") or [] if isinstance(v, dict) and not v.get("card")]
    if record.get("reference"):
        counts: dict[str, int] = {}
        for v in overall:
            counts[str(v.get("verdict"))] = counts.get(str(v.get("verdict")), 0) + 1
        order = ("as expected", "faster", "slower", "cannot say", "no reference")
        told = ", ".join(f"{counts[w]} {w}" for w in order if counts.get(w))
        words += f"; against {record['reference'].get('label')}: {told or 'nothing to compare'}"
    slow = [str(s.get("card")) for s in record.get("slow_cards") or [] if isinstance(s, dict)]
    if slow:
        words += f"; slow card{'s' if len(slow) > 1 else ''} {', '.join(slow)}"
    return words


def ordered(figures: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``figures`` in the workloads' order (a record that went through JSON with sorted keys has lost it)."""
    rank = {w.key: i for i, w in enumerate(WORKLOADS)}
    return sorted(figures.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0]))


def table_lines(record: Mapping[str, Any]) -> list[str]:
    """The result as a person reads it: one row per figure (and per card where several), its median,
    spread, the reference's figure and the verdict; then the slow cards with the doctor's findings."""
    figures = record.get("figures") or {}
    ref = (record.get("reference") or {}).get("figures") or {}
    said = {(v.get("figure"), v.get("card", "")): v for v in record.get("verdicts") or []}
    identity = record.get("identity") or {}
    lines = [f"machine: {identity_text(identity)}; size {record.get('size')}, {record.get('repeats')} "
             f"interleaved repeats"]
    if record.get("reference"):
        lines.append(f"reference: {record['reference'].get('label')}")
    rows = [("figure", "unit", "median", "spread", "reference", "verdict")]
    for key, fig in ordered(figures):
        ref_fig = ref.get(key) or {}
        ref_text = _num(ref_fig.get("median")) if ref_fig else "–"
        v = said.get((key, ""), {})
        rows.append((str(fig.get("text") or key), str(fig.get("unit") or ""), _num(fig.get("median")),
                     f"{(fig.get('spread') or 0) * 100:.0f} %", ref_text,
                     str(v.get("words") or "no reference")))
        cards = fig.get("cards") or {}
        if len(cards) > 1:
            for card, values in cards.items():
                f = Figure(key, [float(x) for x in values])
                cv = said.get((key, card), {})
                rows.append((f"  {card_noun(identity)} {card}", "", _num(f.median),
                             f"{f.spread * 100:.0f} %", "", str(cv.get("words") or "")))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        lines.append("  ".join(c.ljust(widths[i]) if i < 5 else c for i, c in enumerate(row)).rstrip())
    for slow in record.get("slow_cards") or []:
        lines.append(f"SLOW CARD: {slow.get('words')}")
        found = slow.get("findings") or []
        lines += [f"  doctor: {f}" for f in found] or ["  doctor: nothing found for this card"]
    lines += [f"note: {n}" for n in record.get("notes") or []]
    return lines


def _num(value: Any) -> str:
    return f"{value:.4g}" if _finite(value) else "–"


def identity_text(identity: Mapping[str, Any]) -> str:
    count = identity.get("card_count") or 0
    card = str(identity.get("card_type") or "?")
    parts = [f"{count} × {card}" if count else card]
    for key in ("driver", "firmware"):
        if identity.get(key):
            parts.append(f"{key} {identity[key]}")
    if identity.get("device") == "cpu" and identity.get("cpu"):
        parts.append(f"{identity['cpu']} ({identity.get('cpu_count')} cores)")
    versions = identity.get("versions") or {}
    parts += [f"{k} {versions[k]}" for k in ("habana-torch-plugin", "torch", "transformers")
              if versions.get(k)]
    return ", ".join(parts)


__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_OK", "RESULT_NAME", "SIZES", "TABLE_FORMAT", "TOLERANCE",
           "WIDE_SPREAD", "WORKLOADS", "BenchmarkInputError", "Figure", "Reference", "SlowCard", "Verdict",
           "card_noun", "collect", "identity_text", "interleaved", "judged", "latest_result",
           "load_reference", "ordered", "read_result", "slow_cards", "summary_words", "table_lines",
           "verdict", "verdicts"]
