"""Compare of benchmark runs (Training → Runs, Compare; issue 40): one table, a row per figure (and per
card of a per-card figure), a column per run with its median and spread, and each later run judged
against the first by the benchmark's own verdict (``core.benchmark.verdict``: as expected, slower or
faster beyond the spread, or cannot say).

A later run is judged only where the benchmark itself would take the first run as its reference: the
same card type, size and benchmark version; otherwise its figures are shown and the verdict says why
none is given. Qt-free: the Runs list's Compare window (``ui.benchmark_compare``) paints what this says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core import benchmark as bm

#: How the first run is named in a later run's verdict.
AGAINST = "the first run"


@dataclass(frozen=True)
class Compared:
    """One benchmark run as Compare reads it: its name and result (None: no result, and why)."""

    name: str
    record: dict[str, Any] | None
    problem: str = ""

    @classmethod
    def read(cls, name: str, folder: Path) -> Compared:
        """The run's result.json; a run without one (still running, failed) is kept with why."""
        try:
            record = bm.read_result(folder)
        except bm.BenchmarkInputError as exc:
            return cls(name, None, str(exc))
        if record.get("kind") != "benchmark" or not isinstance(record.get("figures"), dict):
            return cls(name, None, f"{folder}: not a benchmark result")
        return cls(name, record)

    @property
    def identity(self) -> dict[str, Any]:
        found = (self.record or {}).get("identity")
        return found if isinstance(found, dict) else {}

    def figure(self, key: str, card: str = "") -> bm.Figure | None:
        data = ((self.record or {}).get("figures") or {}).get(key)
        if not isinstance(data, dict):
            return None
        figure = bm.Figure.from_json(key, data)
        if not card:
            return figure if figure.samples else None
        values = figure.cards.get(card)
        return bm.Figure(key, list(values)) if values else None


@dataclass(frozen=True)
class Cell:
    """A run's figure in a row: median, spread, repeats (None: not measured in that run)."""

    median: float | None
    spread: float | None
    n: int

    @property
    def text(self) -> str:
        if self.median is None:
            return "–"
        return f"{self.median:.4g} ± {(self.spread or 0) * 100:.0f} %"


@dataclass(frozen=True)
class Against:
    """A later run's figure against the first run's: the ratio of the medians and the verdict."""

    ratio: float | None
    word: str
    words: str

    @property
    def text(self) -> str:
        ratio = f"{self.ratio:.2f}×: " if self.ratio is not None else ""
        return f"{ratio}{self.words}"


@dataclass
class Row:
    key: str
    #: The card of a per-card row ("" for the figure itself).
    card: str
    label: str
    unit: str
    cells: list[Cell] = field(default_factory=list)
    #: One per later run (run 2, 3 …): against the first.
    against: list[Against] = field(default_factory=list)


@dataclass
class Comparison:
    names: list[str]
    #: The machine(s): one line where every run was measured on the same card type and count.
    machine: list[str]
    rows: list[Row]
    #: Runs without a result, and later runs not judged (another card type, size or version).
    notes: list[str]


def _not_judged(first: Compared, later: Compared) -> str:
    """Why the benchmark would refuse ``first`` as ``later``'s reference ("" where it would not)."""
    if later.record is None or first.record is None:
        return "no result to compare"
    mine, theirs = str(later.identity.get("card_type") or "?"), str(first.identity.get("card_type") or "?")
    if mine != theirs:
        return f"not judged: measured on {mine}, the first run on {theirs}"
    if later.record.get("size") != first.record.get("size"):
        return (f"not judged: size {later.record.get('size')}, the first run's {first.record.get('size')} "
                "(figures of different sizes are never compared)")
    if later.record.get("version", bm.RESULT_VERSION) != first.record.get("version", bm.RESULT_VERSION):
        return "not judged: another version of the benchmark (the workloads differ)"
    return ""


def _against(own: bm.Figure | None, ref: bm.Figure | None, refusal: str, card: str) -> Against:
    if refusal:
        ratio = own.median / ref.median if own is not None and ref is not None and ref.median else None
        return Against(ratio if ratio is not None and math.isfinite(ratio) else None, "not judged", refusal)
    if own is None:
        return Against(None, "not measured", "not measured in this run")
    said = bm.verdict(own, ref, card=card, against=AGAINST)
    ratio = 1 + said.change if said.change is not None and math.isfinite(said.change) else None
    return Against(ratio, said.word, said.words)


def _cell(figure: bm.Figure | None) -> Cell:
    if figure is None:
        return Cell(None, None, 0)
    return Cell(figure.median, figure.spread, figure.n)


def machine_lines(runs: Sequence[Compared]) -> list[str]:
    """The card type and count of every run: one line where they all agree, else one per run."""
    said = {r.name: bm.identity_text(r.identity) for r in runs if r.record is not None}
    kinds = {(str(r.identity.get("card_type")), r.identity.get("card_count")) for r in runs
             if r.record is not None}
    if not said:
        return []
    if len(kinds) == 1:
        first = next(r for r in runs if r.record is not None)
        return [f"Machine: {bm.identity_text(first.identity)}"]
    return [f"Machine of {name}: {text}" for name, text in said.items()]


def compare(runs: Sequence[Compared]) -> Comparison:
    """The comparison of ``runs`` (the first is what the later ones are judged against)."""
    names = [r.name for r in runs]
    notes = [f"{r.name}: {r.problem}" for r in runs if r.record is None]
    first = runs[0] if runs else None
    refusals = [_not_judged(first, r) if first is not None else "" for r in runs[1:]]
    for run, refusal in zip(runs[1:], refusals, strict=True):
        if refusal and run.record is not None and first is not None and first.record is not None:
            notes.append(f"{run.name}: {refusal}")
    if first is not None and first.record is None and len(runs) > 1:
        notes.append(f"{first.name} is the first run and has no result: nothing is judged against it")
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys((run.record or {}).get("figures") or {}))
    rows: list[Row] = []
    for key, _data in bm.ordered(keys):
        work = bm.WORKLOAD_OF.get(key)
        cards: dict[str, None] = {}
        for run in runs:
            figure = run.figure(key)
            if figure is not None and (len(figure.cards) > 1 or key.startswith("matmul.")):
                cards.update(dict.fromkeys(figure.cards))
        noun = bm.card_noun(first.identity) if first is not None else "card"
        for card in ["", *cards] if len(cards) > 1 else [""]:
            label = (work.text if work else key) if not card else f"{noun} {card}"
            row = Row(key, card, label, work.unit if work and not card else "")
            figures = [run.figure(key, card) for run in runs]
            row.cells = [_cell(f) for f in figures]
            row.against = [_against(own, figures[0], refusal, card)
                           for own, refusal in zip(figures[1:], refusals, strict=True)]
            rows.append(row)
    return Comparison(names, machine_lines(runs), rows, notes)


def lines(comparison: Comparison) -> list[str]:
    """The comparison as text (one line per row and run): what ``describe`` of a test or a log says."""
    out = list(comparison.machine)
    for row in comparison.rows:
        cells = "; ".join(f"{name} {cell.text}"
                          for name, cell in zip(comparison.names, row.cells, strict=True))
        out.append(f"{row.label} ({row.unit}): {cells}" if row.unit else f"{row.label}: {cells}")
        out += [f"  {name}: {a.text}" for name, a in zip(comparison.names[1:], row.against, strict=True)]
    return out + [f"note: {n}" for n in comparison.notes]


def of_records(named: Mapping[str, dict[str, Any]]) -> Comparison:
    """A comparison of results already read (name -> result), in the mapping's order."""
    return compare([Compared(name, record) for name, record in named.items()])


__all__ = ["AGAINST", "Against", "Cell", "Compared", "Comparison", "Row", "compare", "lines",
           "machine_lines", "of_records"]
