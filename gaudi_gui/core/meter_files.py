"""The run meter's files in a run folder: ``meter.jsonl`` (one JSON line a sample, written by
``core.meter.Meter``), ``meter-summary.json`` (a run's part), ``meter-job.json`` (a job of several hosts),
``nodes/<node>/`` (a Slurm job's parts); what reads them: the summaries, the cards a run recorded, the
live reader of a growing meter.jsonl (the agent's ``meter`` event, which the Training tab's strip
shows) and a run's compile meter.
Qt-free and torch-free.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic
from gaudi_gui.core.meter_account import (
    GAP_S,
    MEASURED,
    Accounts,
    combined_compile,
    coverage_status,
    finite,
    share_text,
)
from gaudi_gui.core.meter_words import figure

METER_NAME = "meter.jsonl"
SUMMARY_NAME = "meter-summary.json"


#: A job of several hosts: the whole job's meter (``combine`` of every host's part), kept in host 0's
#: run folder beside its own part's SUMMARY_NAME once the job has ended (``keep_job_summary``).
JOB_SUMMARY_NAME = "meter-job.json"


#: A Slurm job's parts: <run folder>/nodes/<node>/ (core.slurm's meter-node writes them).
NODES_DIR = "nodes"


def read_summary(folder: str | Path) -> dict[str, Any] | None:
    """The run's meter summary, or None when it has none (an older run, or one still running)."""
    try:
        data = json.loads((Path(folder) / SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_job_summary(folder: str | Path) -> dict[str, Any] | None:
    """What a run's meter says of its whole job: host 0's run of a multi-host job, the job's meter
    (every host's part summed, ``JOB_SUMMARY_NAME``); any other run, its own (``read_summary``)."""
    try:
        data = json.loads((Path(folder) / JOB_SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return read_summary(folder)
    return data if is_job_summary(data) else read_summary(folder)


def is_job_summary(data: Any) -> bool:
    """A whole job's meter as ``combine`` makes it (its parts, named)."""
    return isinstance(data, dict) and data.get("kind") == "parts" and isinstance(data.get("parts"), list) \
        and all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in data["parts"])


def keep_job_summary(folder: str | Path, summary: Any) -> Path:
    """Keep a multi-host job's meter (``combine``'s) in host 0's run ``folder``, beside the folder's
    own part; ValueError for anything else, OSError when the disk refuses."""
    if not is_job_summary(summary):
        raise ValueError("not a job's meter (a JSON object of kind 'parts' naming its parts)")
    path = Path(folder) / JOB_SUMMARY_NAME
    atomic.write_json(path, summary)
    return path


def parse_ids(text: str | None) -> list[int] | None:
    """'2,3' -> [2, 3]; None for no selection or anything that is not a list of ids (a UUID list)."""
    if not text or not text.strip():
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return sorted({int(p) for p in parts})


def recorded_cards(folder: str | Path) -> list[int] | None:
    """The cards env.json records the run was given (``train --cards``), when applied."""
    try:
        data = json.loads((Path(folder) / "env.json").read_text(encoding="utf-8"))
        cards = data.get("cards") or {}
        if not cards.get("applied"):
            return None
        return parse_ids(str(cards.get("requested") or ""))
    except (OSError, ValueError, AttributeError):
        return None


# -- a growing meter.jsonl read live (the agent's ``meter`` event: the Training tab's strip) ---------

class LiveReader:
    """The run's meter.jsonl read as it grows (only the new bytes each time): its power now, the
    energy so far (the same integration as the summary's) and card-hours so far: the agent's ``meter``
    event (agent/jobs.py), which the Training tab's live strip shows. A cut last line waits for its end."""

    def __init__(self, folder: str | Path, gap_s: float = GAP_S, started_t: float | None = None) -> None:
        self.path = Path(folder) / METER_NAME
        self.accounts = Accounts(gap_s)
        #: When the run started (its status' ``started_at``): what "the run so far" counts from; None
        #: when unknown (the share covered so far is then not said).
        self.started_t = started_t or None
        self.offset = 0
        self._partial = b""
        self.first_t: float | None = None
        self.last_t: float | None = None
        #: The run's power at the last sample (every card read one), or None.
        self.watts: float | None = None
        self.source = ""
        self.cards: set[str] = set()

    def read(self) -> bool:
        """Take the new samples; True when there were any."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(1 << 22)
        except OSError:
            return False
        if not data:
            return False
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        took = False
        for line in lines:
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            t = finite(sample.get("t")) if isinstance(sample, dict) else None
            if t is None:
                continue
            cards = sample.get("cards")
            if isinstance(cards, list):
                cards = [c for c in cards if isinstance(c, dict)]
                self.accounts.add(t, cards)
                powers = [finite(c.get("power_w")) for c in cards]
                good = [p for p in powers if p is not None and p >= 0]
                self.watts = sum(good) if cards and len(good) == len(cards) else None
                self.cards.update(str(c.get("name")) for c in cards)
            elif sample.get("source") == "rapl":
                watts = finite(sample.get("power_w"))
                self.accounts.add(t, [{"name": "CPU package", "power_w": watts}] if watts is not None else [])
                self.watts = watts
            else:
                continue  # a throttle read: not power
            self.source = str(sample.get("source") or self.source)
            self.first_t = t if self.first_t is None else self.first_t
            self.last_t = t
            took = True
        return took

    @property
    def energy_j(self) -> float | None:
        return self.accounts.energy()[0]

    @property
    def card_hours(self) -> float | None:
        if not self.cards or self.first_t is None or self.last_t is None or self.source == "rapl":
            return None
        return len(self.cards) * (self.last_t - self.first_t) / 3600

    def coverage(self, now: float) -> float | None:
        """The share of the run so far (``started_t`` to ``now``) its cards' power readings cover, or
        None when the run's start is unknown."""
        if self.started_t is None or now <= self.started_t:
            return None
        count = max(len(self.cards), len(self.accounts.cards), 1)
        covered = sum(a.power.covered_s for a in self.accounts.cards.values())
        return min(1.0, covered / (count * (now - self.started_t)))

    def reading(self, now: float) -> dict[str, Any] | None:
        """What the readings say at ``now`` (the agent's ``meter`` event, ``runs show`` of a running
        run): power_w (now), energy_j and card_hours (so far), samples, energy_coverage (the share of
        the run so far they cover), last_t (the last sample's time), text (``text(now)``); None before
        the first sample."""
        if self.last_t is None:
            return None
        return {"power_w": self.watts, "energy_j": self.energy_j, "card_hours": self.card_hours,
                "samples": self.accounts.samples, "energy_coverage": self.coverage(now),
                "last_t": self.last_t, "text": self.text(now=now)}

    def text(self, now: float | None = None) -> str:
        """'⚡ 205 W now · 1.2 Wh so far · 0.0057 card-hours (hl-smi power integrated)', or '' before the
        first sample. With ``now``: a last reading older than the gap is not "now" ('⚡ no power
        reading for 25 s'), and where the readings cover too little of the run so far (``coverage``,
        the summary's rule) the energy is what they read, not the run's so far."""
        if self.last_t is None:
            return ""
        stale = now is not None and now - self.last_t > self.accounts.gap_s
        parts = [f"⚡ no power reading for {now - self.last_t:.0f} s" if stale and now is not None else
                 f"⚡ {self.watts:.0f} W now" if self.watts is not None else "⚡ power now unknown"]
        energy = self.energy_j
        share = self.coverage(now) if now is not None else None
        status = MEASURED if share is None or self.started_t is None or now is None else coverage_status(
            share, (1 - share) * (now - self.started_t))
        wh = None if energy is None else (
            figure(energy / 3600) if energy < 3600 * 10 else f"{energy / 3600:.0f}")
        if wh is not None and status == MEASURED:
            parts.append(f"{wh} Wh so far")
        elif wh is not None:
            parts.append(f"{wh} Wh read over {share_text(share or 0.0)} of the run so far (energy "
                         f"{status}: not the run's)")
        else:
            parts.append("energy so far: not yet measured")
        hours = self.card_hours
        if hours is not None:
            parts.append(f"{figure(hours)} card-hours")
        return " · ".join(parts)


def run_compile(folder: str | Path, summary: Mapping[str, Any] | None = None,
                events: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any] | None:
    """The run's Gaudi compile meter: the one its supervisor put in the summary, else read now from
    the bridge's files in the run folder (a run whose supervisor could not finish, or still running);
    None when the run has none (not a Gaudi run, or the bridge wrote nothing)."""
    compiled = (summary or {}).get("compile")
    if isinstance(compiled, dict) and "compilations" in compiled:
        return compiled
    from gaudi_gui.core import hpu_metrics
    base = Path(folder) / hpu_metrics.FOLDER_NAME / hpu_metrics.FILE_NAME
    found = hpu_metrics.run_summary(base, events) if base.parent.is_dir() else None
    if found and "compilations" in found:
        return found
    # A Slurm job not combined yet (still running, or ended before its batch shell did): each node's
    # ranks wrote into nodes/<node>/hpu-metrics/; the node that compiled most sets the pace.
    nodes: list[tuple[str, Mapping[str, Any]]] = []
    with contextlib.suppress(OSError):
        for part in sorted(p for p in (Path(folder) / NODES_DIR).iterdir() if p.is_dir()):
            node_base = part / hpu_metrics.FOLDER_NAME / hpu_metrics.FILE_NAME
            if node_base.parent.is_dir():
                nodes.append((part.name, {"compile": hpu_metrics.run_summary(node_base, events)}))
    return combined_compile(nodes) if nodes else None
