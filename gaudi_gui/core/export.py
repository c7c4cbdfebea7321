"""A run's metrics and meter into a tracker: TensorBoard event files (``gaudi-gui runs export``, the
Runs list's "Export…").

What is written, under ``DIR/<run name>/`` (so ``tensorboard --logdir DIR`` lists runs side by side):

- ``train/*`` by training step: loss, learning_rate, grad_norm, steps_per_s (the worker's
  throughput), samples_per_s, tokens_per_s, true device memory (``memory_peak_mib``,
  ``memory_in_use_mib`` from torch.hpu.memory_stats / torch.cuda) and ``eval/loss``,
  ``eval/perplexity``; wall time = the event's time.
- ``meter/*`` from ``meter.jsonl`` (the supervisor's sampler): per card ``power_w``, ``utilization``,
  ``memory_used_mib`` (as hl-smi sees it), ``temperature_c`` and ``throttled`` (1 while a power or
  thermal slowdown was active), and for the run ``power_w`` (all its cards), ``energy_wh`` so far
  (the meter's own integration: trapezoids, gaps held, missing readings never 0) and ``card_hours``
  so far. Their step is **seconds since the meter started** (a meter samples in time, not in
  training steps); the wall time is the sample's, so TensorBoard's "Relative"/"Wall" axes line them
  up with the training series.

Exporting again replaces the run's earlier export (files named ``*.gaudi-gui``); other files in that
folder are left alone. trackio: not written (it is not installed with gaudi-gui; see ``trackio_state``).
Qt-free, torch-free; reads only the run folder.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core import meter as meter_mod
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.tb_events import EventFileWriter

#: metrics-record key -> TensorBoard tag.
TRAIN_TAGS = {"loss": "train/loss", "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
              "throughput": "train/steps_per_s", "samples_per_second": "train/samples_per_s",
              "tokens_per_second": "train/tokens_per_s", "memory_peak_mib": "train/memory_peak_mib",
              "memory_in_use_mib": "train/memory_in_use_mib", "eval_loss": "eval/loss",
              "eval_perplexity": "eval/perplexity"}
#: meter.jsonl card key -> TensorBoard tag (per card: ``meter/<key>/<card name>``).
CARD_TAGS = ("power_w", "utilization", "memory_used_mib", "temperature_c")
#: At most this many points per meter series: a 10-hour run sampled at 1 Hz has 36,000, more than any
#: chart shows (TensorBoard's own dashboard keeps 1,000 per series). Longer runs are written in
#: buckets of consecutive samples: the mean of what a sample measures (power, utilization, memory,
#: temperature), the last of what accumulates (energy, card-hours), the most of "throttled".
METER_POINTS = 4000
#: Series whose value accumulates (the bucket's last), and those that flag (the bucket's most).
_CUMULATIVE = ("meter/energy_wh", "meter/card_hours")
_FLAGS = ("meter/throttled/",)


class ExportError(Exception):
    """The run cannot be exported (nothing to read, or the folder cannot be written)."""


@dataclass
class ExportResult:
    folder: Path
    file: Path
    scalars: int = 0
    tags: list[str] = field(default_factory=list)
    #: What was not there to export (a run without a meter, without metrics).
    missing: list[str] = field(default_factory=list)


def trackio_state() -> str:
    """'' when trackio can be imported here, else why it cannot be exported to."""
    if importlib.util.find_spec("trackio") is None:
        return ("trackio is not installed in this Python (gaudi-gui does not install it: `pip install "
                "trackio` brings it and its web app); the TensorBoard export needs nothing")
    return ""


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def meter_samples(folder: str | Path) -> list[dict[str, Any]]:
    """The meter's samples (meter.jsonl), a cut last line skipped."""
    try:
        text = (Path(folder) / meter_mod.METER_NAME).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and _num(value.get("t")) is not None:
            out.append(value)
    return out


def _meter_rows(samples: list[dict[str, Any]], summary: Mapping[str, Any] | None,
                gap_s: float = meter_mod.GAP_S) -> list[tuple[float, list[tuple[str, float]]]]:
    """(wall time, scalars) per meter sample, energy and card-hours so far included."""
    rows: list[tuple[float, list[tuple[str, float]]]] = []
    if not samples:
        return rows
    t0 = float(samples[0]["t"])
    accounts = meter_mod.Accounts(gap_s)
    card_count = len((summary or {}).get("cards") or [])
    for sample in samples:
        t = float(sample["t"])
        scalars: list[tuple[str, float]] = []
        cards = sample.get("cards")
        if isinstance(cards, list):
            cards = [c for c in cards if isinstance(c, dict)]
            accounts.add(t, cards)
            total, whole = 0.0, bool(cards)
            for card in cards:
                name = str(card.get("name"))
                for key in CARD_TAGS:
                    value = _num(card.get(key))
                    if value is not None and value >= 0:
                        scalars.append((f"meter/{key}/{name}", value))
                watts = _num(card.get("power_w"))
                if watts is None or watts < 0:
                    whole = False
                else:
                    total += watts
            if whole:
                scalars.append(("meter/power_w", total))
            energy, _unmeasured = accounts.energy()
            if energy is not None:
                scalars.append(("meter/energy_wh", energy / 3600))
            count = card_count or len(cards)
            if count:
                scalars.append(("meter/card_hours", count * (t - t0) / 3600))
        elif isinstance(sample.get("throttle"), dict):  # a read of the cards' throttle reasons (hl-smi -q)
            for name, reasons in sample["throttle"].items():
                if isinstance(reasons, list):
                    scalars.append((f"meter/throttled/{name}", 1.0 if reasons else 0.0))
        else:
            watts = _num(sample.get("power_w"))  # RAPL: the package's power over the last second
            if watts is not None:
                accounts.add(t, [{"name": "CPU package", "power_w": watts}])
                scalars.append(("meter/power_w", watts))
                energy, _ = accounts.energy()
                if energy is not None:
                    scalars.append(("meter/energy_wh", energy / 3600))
        rows.append((t, scalars))
    return rows


def thin(rows: list[tuple[float, list[tuple[str, float]]]],
         limit: int = METER_POINTS) -> list[tuple[float, list[tuple[str, float]]]]:
    """``rows`` in at most ``limit`` buckets of consecutive rows (see ``METER_POINTS``); each bucket
    is stamped with its last row's time."""
    if len(rows) <= limit:
        return rows
    size = -(-len(rows) // limit)
    out: list[tuple[float, list[tuple[str, float]]]] = []
    for start in range(0, len(rows), size):
        bucket = rows[start:start + size]
        values: dict[str, list[float]] = {}
        for _t, scalars in bucket:
            for tag, value in scalars:
                values.setdefault(tag, []).append(value)
        merged = []
        for tag, seen in values.items():
            if tag in _CUMULATIVE:
                merged.append((tag, seen[-1]))
            elif tag.startswith(_FLAGS):
                merged.append((tag, max(seen)))
            else:
                merged.append((tag, sum(seen) / len(seen)))
        out.append((bucket[-1][0], merged))
    return out


def export_tensorboard(run: Run, dest: str | Path) -> ExportResult:
    """Write ``run``'s metrics and meter as one TensorBoard event file under ``dest/<run name>/``."""
    folder = Path(dest).expanduser() / run.name
    records = run.metrics()
    samples = meter_samples(run.folder)
    if not records and not samples:
        raise ExportError(f"{run.name} has no metrics and no meter samples to export")
    status = run.status()
    start = status.started_at or (float(samples[0]["t"]) if samples else 0.0) or None
    try:
        for old in folder.glob(f"events.out.tfevents.*.{EventFileWriter.SUFFIX}"):
            old.unlink()  # an earlier export of this run: replaced, never shown twice
        writer = EventFileWriter(folder, start_time=start)
    except OSError as exc:
        raise ExportError(f"cannot write {folder}: {exc.strerror or exc}") from exc
    tags: set[str] = set()
    try:
        for record in records:
            step = record.get("step")
            if not isinstance(step, int) or record.get("summary"):
                continue
            when = _num(record.get("time")) or start or 0.0
            scalars = [(tag, v) for key, tag in TRAIN_TAGS.items()
                       if (v := _num(record.get(key))) is not None]
            writer.add_scalars(step, when, scalars)
            tags.update(tag for tag, _ in scalars)
        rows = thin(_meter_rows(samples, meter_mod.read_summary(run.folder)))
        t0 = rows[0][0] if rows else 0.0
        for when, scalars in rows:
            writer.add_scalars(round(when - t0), when, scalars)
            tags.update(tag for tag, _ in scalars)
        path = writer.close()
    except OSError as exc:
        writer.discard()
        raise ExportError(f"cannot write {folder}: {exc.strerror or exc}") from exc
    missing = []
    if not records:
        missing.append("training metrics (the run logged no step)")
    if not samples:
        missing.append("meter samples (no meter.jsonl: an older run, or nothing could be sampled)")
    return ExportResult(folder, path, writer.count, sorted(tags), missing)


def export_trackio(run: Run, trackio_dir: str | Path, project: str = "gaudi-gui") -> ExportResult:
    """Write ``run``'s metrics and meter into trackio's local storage under ``trackio_dir`` (its
    TRACKIO_DIR), project ``project``, as a trackio run named after the run. Imports trackio: call it
    in a child process (``python -m gaudi_gui.workers.trackio_export`` / ``gaudi-gui runs export
    --trackio``), never in the Qt process."""
    why = trackio_state()
    if why:
        raise ExportError(why)
    raise ExportError("the trackio export is being written (issue 27): use the TensorBoard export for now")


def describe(result: ExportResult) -> str:
    text = (f"exported {result.scalars} values of {len(result.tags)} series to {result.file} "
            f"(open: tensorboard --logdir {result.folder.parent})")
    if result.missing:
        text += f"; not there to export: {'; '.join(result.missing)}"
    return text


__all__ = ["CARD_TAGS", "METER_POINTS", "TRAIN_TAGS", "ExportError", "ExportResult", "describe",
           "export_tensorboard", "export_trackio", "meter_samples", "thin", "trackio_state"]
