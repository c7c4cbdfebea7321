"""Compare of FP8 calibrations (Training → Runs: select two or more calibrate runs, Compare): what each
manifest says, side by side, with the rows where they differ marked, and what a difference means for
using one in place of another (another model or card generation: not interchangeable; other prompts or
settings: the same model measured differently, so their FP8 quality can differ).

Qt-free: the window paints ``compare``'s answer (``ui/fp8_compare.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core import fp8


def _model(m: dict[str, Any]) -> str:
    return str((m.get("model") or {}).get("model") or (m.get("model") or {}).get("path") or "")


def _revision(m: dict[str, Any]) -> str:
    revision = str((m.get("model") or {}).get("revision") or "")
    return revision[:19] if revision.startswith("sha256:") else revision[:12]


def _where(m: dict[str, Any]) -> str:
    generation, device = str(m.get("generation") or ""), str(m.get("device") or "")
    return f"{device} ({generation})" if generation and generation != device else device


def _ranks(m: dict[str, Any]) -> str:
    ranks = fp8.ranks_of(m)
    cards = m.get("cards") or []
    return f"{ranks}" + (f" (cards {','.join(str(c) for c in cards)})" if cards else "")


def _energy(m: dict[str, Any]) -> str:
    energy = m.get("energy")
    if isinstance(energy, dict) and isinstance(energy.get("energy_j"), (int, float)):
        return f"{energy['energy_j'] / 3600:.2f} Wh"
    return "not measured"


def _number(key: str, unit: str = "") -> Callable[[dict[str, Any]], str]:
    def read(m: dict[str, Any]) -> str:
        value = m.get(key)
        return f"{value}{unit}" if value not in (None, "") else "—"
    return read


def _text(key: str) -> Callable[[dict[str, Any]], str]:
    def read(m: dict[str, Any]) -> str:
        value = m.get(key)
        if isinstance(value, list):
            return ",".join(str(v) for v in value) or "none"
        return str(value) if value not in (None, "") else "—"
    return read


def _prompts(m: dict[str, Any]) -> str:
    digest = str(m.get("prompts_sha256") or "")
    return digest.removeprefix("sha256:")[:12] or "—"


#: (label, read, what a difference here means: "" for a row that may differ freely).
FIELDS: tuple[tuple[str, Callable[[dict[str, Any]], str], str], ...] = (
    ("Model", _model, "another model: a calibration belongs to its model"),
    ("Revision", _revision, "another revision of the model: measured on other weights"),
    ("Measured on", _where, "another device or card generation: its scales do not fit the other's cards"),
    ("Ranks", _ranks, "another number of ranks: serve each on as many cards as it was measured on"),
    ("Prompts (sha256)", _prompts, "other prompts: the same model measured on other data"),
    ("Rows", _number("rows"), "another number of rows measured"),
    ("Observer", _text("observer"), "another observer"),
    ("Scale method", _text("scale_method"), "another scale method"),
    ("Left in bf16", _text("blocklist"), "other layers left in bf16"),
    ("INC", _text("inc_version"), "another Intel Neural Compressor version"),
    ("torch", _text("torch_version"), ""),
    ("transformers", _text("transformers_version"), ""),
    ("Time", _number("duration_s", " s"), ""),
    ("Energy", _energy, ""),
)


@dataclass(frozen=True)
class Row:
    label: str
    values: tuple[str, ...]
    #: The values are not all the same (and the row's difference has a meaning).
    differs: bool
    meaning: str = ""


@dataclass
class Comparison:
    names: list[str]
    rows: list[Row] = field(default_factory=list)
    #: Runs that could not be read (no manifest: not a finished calibration), one line each.
    notes: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        """One sentence: whether the calibrations are interchangeable, or what makes them differ."""
        if len(self.names) < 2:
            return "Nothing to compare: one calibration (or none) could be read."
        hard = [r for r in self.rows if r.differs and r.label in ("Model", "Revision", "Measured on")]
        soft = [r for r in self.rows if r.differs and r.meaning and r not in hard]
        if hard:
            return "Not interchangeable: " + "; ".join(r.meaning for r in hard) + "."
        if soft:
            return ("The same model on the same kind of card, measured differently: "
                    + "; ".join(r.meaning for r in soft)
                    + ". Evaluate each in FP8 (gaudi-gui eval --fp8) to see which keeps more quality.")
        return "The same calibration settings on the same model and cards."


def compare(runs: Sequence[tuple[str, Path]]) -> Comparison:
    """The manifests of ``runs`` ((name, folder), in the order given) side by side."""
    read: list[tuple[str, dict[str, Any]]] = []
    notes: list[str] = []
    for name, folder in runs:
        try:
            read.append((name, fp8.read_manifest(folder)))
        except fp8.Fp8Error as exc:
            notes.append(f"{name}: {exc}")
    comparison = Comparison([name for name, _m in read], notes=notes)
    for label, get, meaning in FIELDS:
        values = tuple(get(m) for _name, m in read)
        differs = len(set(values)) > 1 and bool(meaning)
        comparison.rows.append(Row(label, values, differs, meaning if differs else ""))
    return comparison


__all__ = ["FIELDS", "Comparison", "Row", "compare"]
