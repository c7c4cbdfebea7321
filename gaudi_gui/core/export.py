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
  (the meter's own integration: trapezoids, gaps held, missing readings never 0), ``card_hours``
  so far and ``energy_coverage``: the share of the run so far that the power readings cover (its
  last value, at the run's end, is the summary's: where it is under the meter's MEASURED_SHARE,
  ``energy_wh`` is what the readings add up to, not the run's energy, and the export says so).
  Their step is **seconds since the meter started** (a meter samples in time, not in training
  steps); the wall time is the sample's, so TensorBoard's "Relative"/"Wall" axes line them up with
  the training series.

Exporting again replaces the run's earlier export (files named ``*.gaudi-gui``); other files in that
folder are left alone.

trackio (``export_trackio``; ``gaudi-gui runs export RUN --trackio``): the same series into trackio's
local storage (one SQLite file per project under its TRACKIO_DIR, by default
``~/.cache/huggingface/trackio``), as one trackio run named after the run: ``train/*`` and ``eval/*``
as metrics by training step with the events' own times, ``meter/*`` as trackio *system metrics*
(what its ``log_system`` writes: by time, no step) stamped with the samples' own times. A run with a
meter and no training step also gets the meter as metrics by seconds since the meter started (trackio
lists a run only from its metrics). The writing happens in a child (``gaudi_gui.workers.
trackio_export``): trackio is imported only there (its import is heavy, it reads TRACKIO_DIR once at
import, and the Qt process must not hold its threads). The child writes through trackio's own storage
class (``SQLiteStorage.bulk_log`` / ``bulk_log_system``, which take the times; ``trackio.log`` and
``log_system`` stamp "now"), under a run id derived from the run's name: exporting again replaces that
run's earlier export, and a trackio run the Trainer itself wrote (``report_to: trackio``, a random id)
is never touched. Nothing reaches the network (no Space, no Hub). trackio is not a dependency of
gaudi-gui: where it is missing the export says so (``trackio_state``).
Qt-free, torch-free; reads only the run folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gaudi_gui.core import meter_account, meter_files
from gaudi_gui.core.jobconfig import JobConfigError
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
_CUMULATIVE = ("meter/energy_wh", "meter/card_hours", "meter/energy_coverage")
_FLAGS = ("meter/throttled/",)


class ExportError(Exception):
    """The run cannot be exported (nothing to read, or the folder cannot be written)."""


@dataclass
class ExportResult:
    #: TensorBoard: the run's folder (``DIR/<run name>``); trackio: the trackio directory.
    folder: Path
    #: TensorBoard: the event file; trackio: the project's SQLite file.
    file: Path
    scalars: int = 0
    tags: list[str] = field(default_factory=list)
    #: What was not there to export (a run without a meter, without metrics).
    missing: list[str] = field(default_factory=list)
    #: "tensorboard" or "trackio".
    tracker: str = "tensorboard"
    #: trackio: the project and the trackio run's name (the run's name).
    project: str = ""
    run_name: str = ""


#: The trackio project an export goes to unless told (``--project``).
TRACKIO_PROJECT = "gaudi-gui"
#: Seconds the trackio child may take (it writes one SQLite file; a 10-hour meter is ~4000 rows).
TRACKIO_TIMEOUT_S = 300.0
#: Variables that would send trackio to a Space, a server or a Hub bucket: never set for the export.
_TRACKIO_REMOTE_ENV = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_WRITE_TOKEN", "TRACKIO_BUCKET_ID",
                       "TRACKIO_DATASET_ID", "SPACE_REPO_NAME", "SPACE_ID", "SYSTEM")


def trackio_state() -> str:
    """'' when trackio can be imported here, else why it cannot be exported to."""
    if importlib.util.find_spec("trackio") is None:
        return ("trackio is not installed here: pip install trackio (gaudi-gui does not install it; the "
                "TensorBoard export needs nothing)")
    return ""


def default_trackio_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where trackio keeps its projects unless told: TRACKIO_DIR, else ``$HF_HOME/trackio`` (HF_HOME:
    ``$XDG_CACHE_HOME/huggingface``, ``~/.cache/huggingface``), as trackio.utils decides it."""
    env = os.environ if env is None else env
    if env.get("TRACKIO_DIR"):
        return Path(env["TRACKIO_DIR"]).expanduser()
    hf_home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(hf_home).expanduser() / "trackio"


def trackio_project_problem(project: str) -> str | None:
    """Why ``project`` cannot name a trackio project, or None. trackio keeps only letters, digits, - and
    _ of a name on disk ("a.b" and "ab" would be one project): anything else is refused here, at the
    field, rather than written somewhere the user does not expect."""
    if not project.strip():
        return "the trackio project may not be empty"
    if not re.fullmatch(r"[A-Za-z0-9_-]+", project):
        return (f"trackio project {project!r}: use letters, digits, - and _ only (trackio stores other "
                f"names under their letters and digits)")
    return None


def trackio_run_id(run_name: str) -> str:
    """The trackio run id of ``run_name``'s export: the same on every export of that run (so the next
    one replaces it), never one trackio gives a run of its own (those are random uuid4 hex)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"gaudi-gui-export:{run_name}").hex


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def meter_samples(folder: str | Path) -> list[dict[str, Any]]:
    """The meter's samples (meter.jsonl), a cut last line skipped."""
    try:
        text = (Path(folder) / meter_files.METER_NAME).read_text(encoding="utf-8", errors="replace")
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
                gap_s: float = meter_account.GAP_S) -> list[tuple[float, list[tuple[str, float]]]]:
    """(wall time, scalars) per meter sample, energy and card-hours so far included."""
    rows: list[tuple[float, list[tuple[str, float]]]] = []
    if not samples:
        return rows
    t0 = float(samples[0]["t"])
    accounts = meter_account.Accounts(gap_s)
    card_count = len((summary or {}).get("cards") or [])
    # The share covered so far is counted from the meter's start (older summaries: the first sample).
    begin = _num((summary or {}).get("started_t"))
    begin = t0 if begin is None or begin > t0 else begin
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
            covered = sum(a.power.covered_s for a in accounts.cards.values())
            if t > begin:
                scalars.append(("meter/energy_coverage",
                                min(1.0, covered / (max(count, len(accounts.cards), 1) * (t - begin)))))
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
    # The run went on after the last reading (an hl-smi that failed for good): the last point of the
    # coverage is the run's end, as the summary counts it, so the series does not end at "all".
    wall, share = _num((summary or {}).get("wall_s")), _num((summary or {}).get("energy_coverage"))
    if wall is not None and share is not None and begin + wall > rows[-1][0]:
        rows.append((begin + wall, [("meter/energy_coverage", share)]))
    return rows


def energy_caveat(summary: Mapping[str, Any] | None) -> str:
    """What an export must say of the run's energy when its readings do not cover the run ('' when
    they do, or without a summary): its ``meter/energy_wh`` is then not the run's energy."""
    status = (summary or {}).get("energy_status")
    share = _num((summary or {}).get("energy_coverage"))
    if status not in (meter_account.PARTIAL, meter_account.NOT_MEASURED) or share is None:
        return ""
    return (f"the run's energy (power read over {meter_account.share_text(share)} of the run, energy "
            f"{status}: meter/energy_wh is what those readings add up to, not the run's)")


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


def _inputs(run: Run) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float | None]:
    """What every export reads: the run's metrics records, its meter samples and its start time (the
    run's, else its first sample's); ExportError when there is nothing to export."""
    records = run.metrics()
    samples = meter_samples(run.folder)
    if not records and not samples:
        raise ExportError(f"{run.name} has no metrics and no meter samples to export")
    start = run.status().started_at or (float(samples[0]["t"]) if samples else 0.0) or None
    return records, samples, start


def export_tensorboard(run: Run, dest: str | Path) -> ExportResult:
    """Write ``run``'s metrics and meter as one TensorBoard event file under ``dest/<run name>/``."""
    folder = Path(dest).expanduser() / run.name
    records, samples, start = _inputs(run)
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
        rows = thin(_meter_rows(samples, meter_files.read_summary(run.folder)))
        t0 = rows[0][0] if rows else 0.0
        for when, scalars in rows:
            writer.add_scalars(round(when - t0), when, scalars)
            tags.update(tag for tag, _ in scalars)
        path = writer.close()
    except OSError as exc:
        writer.discard()
        raise ExportError(f"cannot write {folder}: {exc.strerror or exc}") from exc
    return ExportResult(folder, path, writer.count, sorted(tags),
                        _missing(records, samples, meter_files.read_summary(run.folder)))


@dataclass
class TrackioRows:
    """What a trackio export writes, computed without trackio (``trackio_rows``)."""
    #: (training step, wall time, {tag: value}) per logged step.
    metrics: list[tuple[int, float, dict[str, float]]] = field(default_factory=list)
    #: (wall time, {tag: value}) per meter sample (trackio system metrics).
    system: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    #: The trackio run's config (trackio's own keys: _Created, _Group, _Username).
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def scalars(self) -> int:
        return sum(len(m) for _s, _t, m in self.metrics) + sum(len(m) for _t, m in self.system)


def _missing(records: list[dict[str, Any]], samples: list[dict[str, Any]],
             summary: Mapping[str, Any] | None = None) -> list[str]:
    missing = []
    if not records:
        missing.append("training metrics (the run logged no step)")
    if not samples:
        missing.append("meter samples (no meter.jsonl: an older run, or nothing could be sampled)")
    elif energy_caveat(summary):
        missing.append(energy_caveat(summary))
    return missing


def trackio_rows(run: Run) -> TrackioRows:
    """The rows of ``run``'s trackio export (the TensorBoard export's series); ExportError when the
    run has nothing to export."""
    records, samples, start = _inputs(run)
    out = TrackioRows(missing=_missing(records, samples, meter_files.read_summary(run.folder)))
    tags: set[str] = set()
    for record in records:
        step = record.get("step")
        if not isinstance(step, int) or record.get("summary"):
            continue
        when = _num(record.get("time")) or start or 0.0
        values = {tag: v for key, tag in TRAIN_TAGS.items() if (v := _num(record.get(key))) is not None}
        if values:
            out.metrics.append((step, when, values))
            tags.update(values)
    rows = thin(_meter_rows(samples, meter_files.read_summary(run.folder)))
    for when, scalars in rows:
        if scalars:
            out.system.append((when, dict(scalars)))
            tags.update(tag for tag, _ in scalars)
    if not out.metrics and rows:
        # trackio lists a run from its metrics only: a meter-only run is there by seconds too.
        t0 = rows[0][0]
        out.metrics = [(round(when - t0), when, dict(scalars)) for when, scalars in rows if scalars]
    job_name = model = ""
    with contextlib.suppress(JobConfigError):  # a run without a readable job is exported all the same
        job = run.user_job()
        job_name, model = job.name, job.model
    created = datetime.fromtimestamp(start or 0.0, timezone.utc).isoformat()
    status = run.status()
    out.config = {"gaudi_gui_run": run.name, "run_folder": str(run.folder), "kind": status.kind,
                  "model": model, "job_name": job_name, "state": status.state,
                  "_Created": created, "_Group": None, "_Username": None}
    out.tags = sorted(tags)
    return out


def _trackio_env(trackio_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TRACKIO_REMOTE_ENV}
    env["TRACKIO_DIR"] = str(trackio_dir)
    env["HF_HUB_OFFLINE"] = "1"  # the export reads and writes one local file; nothing on the Hub
    env["PYTHONUNBUFFERED"] = "1"
    return env


def export_trackio(run: Run, trackio_dir: str | Path, project: str = TRACKIO_PROJECT) -> ExportResult:
    """Write ``run``'s metrics and meter into trackio's local storage under ``trackio_dir`` (its
    TRACKIO_DIR), project ``project``, as a trackio run named after the run; an earlier export of the
    run in that project is replaced. Safe to call from any process (the Qt one included, off its
    thread): trackio is imported only in the child this starts. ExportError says why not (trackio
    missing, a bad project name, nothing to export, a folder that cannot be written)."""
    why = trackio_state()
    if why:
        raise ExportError(why)
    problem = trackio_project_problem(project)
    if problem:
        raise ExportError(problem)
    folder = Path(trackio_dir).expanduser()
    if not run.exists():
        raise ExportError(f"no run at {run.folder}")
    trackio_rows(run)  # nothing to export: said here, before a child is started
    argv = [sys.executable, "-m", "gaudi_gui.workers.trackio_export", "--run", str(run.folder),
            "--project", project]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              env=_trackio_env(folder), timeout=TRACKIO_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise ExportError(f"the trackio export did not end within {TRACKIO_TIMEOUT_S:.0f} s") from exc
    except OSError as exc:
        raise ExportError(f"cannot start the trackio export: {exc.strerror or exc}") from exc
    answer: dict[str, Any] = {}
    for line in reversed(done.stdout.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "ok" in value:
            answer = value
            break
    if not answer.get("ok"):
        tail = done.stderr.strip().splitlines()[-3:]
        why = str(answer.get("message") or (" / ".join(tail) if tail else f"exit status {done.returncode}"))
        raise ExportError(f"trackio export failed: {why}")
    return ExportResult(folder, Path(str(answer.get("db", ""))), int(answer.get("scalars", 0)),
                        [str(t) for t in answer.get("tags", [])], [str(m) for m in answer.get("missing", [])],
                        tracker="trackio", project=project, run_name=run.name)


def describe(result: ExportResult) -> str:
    if result.tracker == "trackio":
        text = (f"exported {result.scalars} values of {len(result.tags)} series to trackio project "
                f"{result.project!r}, run {result.run_name!r} ({result.file}) (open: TRACKIO_DIR="
                f"{shlex.quote(str(result.folder))} trackio show --project {shlex.quote(result.project)})")
    else:
        text = (f"exported {result.scalars} values of {len(result.tags)} series to {result.file} "
                f"(open: tensorboard --logdir {result.folder.parent})")
    if result.missing:
        text += f"; not there to export: {'; '.join(result.missing)}"
    return text


__all__ = ["CARD_TAGS", "METER_POINTS", "TRACKIO_PROJECT", "TRAIN_TAGS", "ExportError", "ExportResult",
           "TrackioRows", "default_trackio_dir", "describe", "energy_caveat", "export_tensorboard",
           "export_trackio", "meter_samples", "thin", "trackio_project_problem", "trackio_rows",
           "trackio_run_id", "trackio_state"]
