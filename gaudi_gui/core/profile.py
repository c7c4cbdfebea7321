"""A profiled run (issue 40): what ``<run>/profile/`` holds and how it is read. Qt-free, torch-free.

A job with ``profile_steps: N`` (``gaudi-gui train --profile-steps N``, the form's "Profile N steps")
records N training steps with ``torch.profiler`` in rank 0 (``workers/profile.py``), after
``PROFILE_WAIT`` skipped steps and ``PROFILE_WARMUP`` warm-up steps (the first step of a run pays for
allocations and, on Gaudi, graph compilation: it is no typical step). Only rank 0 profiles: with
data parallelism every rank runs the same operators, and one trace per rank would multiply the cost
and the files. The folder then holds:

- ``rank0.<time>.pt.trace.json``: the trace (Chrome/Perfetto JSON with ``ProfilerStep#N`` spans),
  written by ``torch.profiler.tensorboard_trace_handler``: ui.perfetto.dev and TensorBoard's profile
  plugin open it;
- ``summary.json`` (``SUMMARY_NAME``): the top operators by self time (``key_averages``), host and
  device time, the profiled steps with their times, the data loader's and the collectives' share,
  the wall-clock window of the profiled steps (``t0``, ``t1``), and what torch recorded the trace for.

:func:`read` adds what the run's meter knows of the same window: graph compilations (the Gaudi
bridge's metrics files, ``core.hpu_metrics``) and each card's power, temperature and throttle reasons
(``meter.jsonl``), so the rules (``core.profile_rules``) judge the profiled steps only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Steps skipped before the profiler records anything, then steps it records and throws away.
PROFILE_WAIT = 1
PROFILE_WARMUP = 1
#: Training steps a profile needs before its first profiled step.
PROFILE_SKIP_STEPS = PROFILE_WAIT + PROFILE_WARMUP
#: The run folder's profile folder and the summary in it.
FOLDER_NAME = "profile"
SUMMARY_NAME = "summary.json"
#: Operators kept in the summary (the view shows them all, the rules read the top ones).
TOP_OPERATORS = 25
#: How far around the profiled window the meter's samples count (it samples once a second; a
#: profile of a few small steps is shorter than that).
METER_MARGIN_S = 5.0


def folder(run_folder: str | Path) -> Path:
    return Path(run_folder) / FOLDER_NAME


def trace_files(run_folder: str | Path) -> list[Path]:
    """The trace files of a run's profile, newest last."""
    where = folder(run_folder)
    try:
        found = [p for p in where.iterdir() if p.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))]
    except OSError:
        return []
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def profiler_steps(trace: str | Path) -> list[str]:
    """The ``ProfilerStep#N`` span names of a (plain JSON) trace, in order, each once."""
    data = json.loads(Path(trace).read_text(encoding="utf-8", errors="replace"))
    events = data.get("traceEvents", []) if isinstance(data, dict) else []
    names: dict[str, None] = {}
    for event in events:
        name = event.get("name") if isinstance(event, dict) else None
        if isinstance(name, str) and name.startswith("ProfilerStep#") and event.get("ph") == "X":
            names[name] = None
    return list(names)


def read_summary(run_folder: str | Path) -> dict[str, Any] | None:
    """``profile/summary.json`` as written, None where the run has none (or it is unreadable)."""
    try:
        data = json.loads((folder(run_folder) / SUMMARY_NAME).read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read(run_folder: str | Path) -> dict[str, Any] | None:
    """The run's profile summary with the meter's view of the same window added where it is known:
    ``compilations`` {count, seconds} (Gaudi) and ``cards`` [{name, power_w, temperature_c,
    utilization, throttle}] (the meter's per-card means). None: the run was not profiled."""
    summary = read_summary(run_folder)
    if summary is None:
        return None
    t0, t1 = _finite(summary.get("t0")), _finite(summary.get("t1"))
    if t0 is not None and t1 is not None and "compilations" not in summary:
        found = compilations_between(run_folder, t0, t1)
        if found is not None:
            summary["compilations"] = found
    if t0 is not None and t1 is not None and "cards" not in summary:
        cards = cards_between(run_folder, t0 - METER_MARGIN_S, t1 + METER_MARGIN_S)
        if cards:
            summary["cards"] = cards
    traces = trace_files(run_folder)
    summary["trace"] = str(traces[-1]) if traces else ""
    return summary


def describe(summary: Mapping[str, Any], top: int = 5) -> list[str]:
    """``runs show``'s lines for a profile: the steps and times, the top operators, the rules' sentences
    and the trace's path."""
    from gaudi_gui.core.profile_rules import sentences

    def ms(value: Any) -> str:
        number = _finite(value)
        return f"{number:,.1f} ms" if number is not None else "–"
    device = summary.get("device_ms")
    lines = [f"profile: {summary.get('steps', 0)} step(s) from step {summary.get('first_step', '?')}, mean "
             f"{ms((_finite(summary.get('step_mean_s')) or 0.0) * 1000)}; host {ms(summary.get('host_ms'))}, "
             + (f"device {ms(device)}" if device is not None else "no device activity recorded")
             + f", data loader {ms(summary.get('dataloader_ms'))}"]
    compiled = summary.get("compilations")
    if isinstance(compiled, Mapping):
        lines.append(f"graph compilations in the profiled steps: {compiled.get('count', 0)} "
                     f"({ms((_finite(compiled.get('seconds')) or 0.0) * 1000)})")
    ops = [op for op in summary.get("top_operators") or [] if isinstance(op, Mapping)][:top]
    if ops:
        on_device = device is not None
        lines.append("top operators (self time): " + "; ".join(
            f"{op.get('name')} {ms(op.get('self_device_ms') if on_device else op.get('self_host_ms'))} "
            f"×{op.get('calls')}" for op in ops))
    lines += sentences(summary)
    if summary.get("trace"):
        lines.append(f"trace: {summary['trace']}")
    return lines


def compilations_between(run_folder: str | Path, t0: float, t1: float) -> dict[str, Any] | None:
    """Graph compilations (count and seconds) the bridge's metrics file of rank 0 counted between
    ``t0`` and ``t1`` (its counters are running totals: the difference of the last dump before each
    time). None where the run has no such file (not Gaudi, or the bridge wrote none)."""
    from gaudi_gui.core import hpu_metrics
    base = Path(run_folder) / hpu_metrics.FOLDER_NAME / hpu_metrics.FILE_NAME
    files = [f for f in hpu_metrics.metric_files(base) if f.rank in (0, None)]
    if not files:
        return None
    points: list[tuple[float, float, float]] = []
    for found in files[-1:]:  # the rank's latest process: the one that trained the profiled steps
        try:
            text = found.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        for dump in hpu_metrics.read_dumps(text)[0]:
            stats = dump.get("statistics")
            when = hpu_metrics._when(dump)
            if dump.get("metric_name") != "graph_compilation" or not isinstance(stats, Mapping) \
                    or when is None:
                continue
            points.append((when, hpu_metrics._number(stats.get("TotalNumber")) or 0.0,
                           hpu_metrics._number(stats.get("TotalTime")) or 0.0))
    points.sort()

    def at(t: float) -> tuple[float, float]:
        last = (0.0, 0.0)
        for when, count, ms in points:
            if when > t:
                break
            last = (count, ms)
        return last

    (c0, ms0), (c1, ms1) = at(t0), at(t1)
    return {"count": int(max(0.0, c1 - c0)), "seconds": round(max(0.0, ms1 - ms0) / 1000.0, 3),
            "source": "hpu-metrics"}


def cards_between(run_folder: str | Path, t0: float, t1: float) -> list[dict[str, Any]]:
    """Each metered card's mean power, temperature and utilization between ``t0`` and ``t1``, and the
    throttle reasons read then (``meter.jsonl``); empty where the meter has no sample in the window."""
    from gaudi_gui.core.meter_files import METER_NAME
    sums: dict[str, dict[str, list[float]]] = {}
    throttled: dict[str, set[str]] = {}
    try:
        lines = (Path(run_folder) / METER_NAME).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        t = _finite(record.get("t")) if isinstance(record, dict) else None
        if t is None or not t0 <= t <= t1:
            continue
        for card in record.get("cards") or []:
            if not isinstance(card, dict) or not isinstance(card.get("name"), str):
                continue
            slot = sums.setdefault(card["name"], {"power_w": [], "temperature_c": [], "utilization": []})
            for key, values in slot.items():
                value = _finite(card.get(key))
                if value is not None:
                    values.append(value)
        for name, reasons in (record.get("throttle") or {}).items():
            if reasons:
                throttled.setdefault(str(name), set()).update(str(r) for r in reasons)
    out = []
    for name, slot in sums.items():
        out.append({"name": name, **{k: round(sum(v) / len(v), 2) if v else None for k, v in slot.items()},
                    "throttle": sorted(throttled.get(name, ()))})
    return out


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


__all__ = ["FOLDER_NAME", "PROFILE_SKIP_STEPS", "PROFILE_WAIT", "PROFILE_WARMUP", "SUMMARY_NAME",
           "cards_between", "compilations_between", "describe", "folder", "profiler_steps", "read",
           "read_summary", "trace_files"]
