"""The Gaudi compile meter: Intel's PyTorch bridge's metrics files, read into numbers.

With ``PT_HPU_METRICS_FILE=<path>`` the bridge (``habana_frameworks.torch.hpu.metrics``) writes, per
process, a JSON array of dumps ``{metric_name, triggered_by, generated_on, statistics}``, one flushed
per write. The array is opened with ``[`` and closed only at exit: a killed rank never writes the
``]`` (and a dump being written when it died is cut). The name gets ``-rank<RANK>`` before its
extension when RANK is set (``metrics.json`` -> ``metrics-rank0.json``), and an existing file is never
overwritten: the bridge writes ``metrics-rank0.json.1``, ``.2`` … instead (a rank started again).
With ``PT_HPU_METRICS_DUMP_TRIGGERS=metric_change`` each change is a dump, so the file is the
history of the counters; ``generated_on`` is an ISO time of this machine (no zone: local time).

The statistics are counters since the process started:
``graph_compilation`` {TotalNumber, TotalTime, AvgTime} (times read as milliseconds),
``cpu_fallback`` {TotalNumber, FallbackOps: {op: count}}, ``recipe_cache`` {TotalHit, TotalMiss,
RecipeHit, RecipeMiss} (with ``PT_HPU_ENABLE_CACHE_METRICS=1``), ``memory_defragmentation``
{TotalNumber, TotalSuccessful, MaxTime}.

:func:`summarize` turns a run's files into: compilations (count and seconds), split into warm-up
(dumps before the first logged training step) and steady state, CPU fallbacks with their op names,
the recipe cache's hit rate and defragmentations, per rank and for the run (the rank with the most
compilations: the slowest one sets the pace). Qt-free and torch-free.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core.events import EventType

#: The folder of a run that holds the bridge's files, and the name the supervisor gives it.
FOLDER_NAME = "hpu-metrics"
FILE_NAME = "metrics.json"
#: What the supervisor adds to a Gaudi run's launch environment (the path is the run's own).
DUMP_TRIGGERS = "metric_change"
FILE_FORMAT = "json"


def launch_env(run_folder: str | Path) -> dict[str, str]:
    """The variables that make the bridge write the run's compile meter into its own folder."""
    return {"PT_HPU_METRICS_FILE": str(Path(run_folder) / FOLDER_NAME / FILE_NAME),
            "PT_HPU_METRICS_FILE_FORMAT": FILE_FORMAT,
            "PT_HPU_METRICS_DUMP_TRIGGERS": DUMP_TRIGGERS}


def read_dumps(text: str) -> tuple[list[dict[str, Any]], bool]:
    """The dumps of one file's text, and whether it was whole (closed with ``]``, nothing cut).

    Reads object by object, so an array without its ``]`` (a killed rank) or with a last dump cut
    midway gives every complete dump before it; anything that is not a dump object is skipped."""
    decoder = json.JSONDecoder()
    dumps: list[dict[str, Any]] = []
    pos, end = 0, len(text)
    while pos < end and text[pos] in " \t\r\n":
        pos += 1
    if pos >= end or text[pos] != "[":
        return dumps, False
    pos += 1
    closed = False
    while pos < end:
        char = text[pos]
        if char in " \t\r\n,":
            pos += 1
            continue
        if char == "]":
            closed = True
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break  # cut midway: the rank died while this dump was written
        if isinstance(value, dict) and isinstance(value.get("metric_name"), str):
            dumps.append(value)
    return dumps, closed


@dataclass(frozen=True)
class MetricsFile:
    path: Path
    #: The RANK the bridge put in the name (None: a process without RANK).
    rank: int | None
    #: 0 for the first file of that name, N for ``name.N`` (the N-th process that found it taken).
    copy: int


def metric_files(base: str | Path) -> list[MetricsFile]:
    """Every file the bridge wrote for ``PT_HPU_METRICS_FILE=base``: ``base``, ``<stem>-rank<N><ext>``,
    and their ``.1``, ``.2`` … copies, ordered by rank and copy."""
    base = Path(base)
    suffix = base.suffix
    stem = base.name[: -len(suffix)] if suffix else base.name
    pattern = re.compile(rf"^{re.escape(stem)}(?:-rank(\d+))?{re.escape(suffix)}(?:\.(\d+))?$")
    found = []
    try:
        entries = list(base.parent.iterdir())
    except OSError:
        return []
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or not entry.is_file():
            continue
        found.append(MetricsFile(entry, int(m.group(1)) if m.group(1) else None,
                                 int(m.group(2)) if m.group(2) else 0))
    found.sort(key=lambda f: (-1 if f.rank is None else f.rank, f.copy))
    return found


def _number(value: Any) -> float | None:
    """A statistic: a number, or a number in text (the bridge's text format); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _when(dump: Mapping[str, Any]) -> float | None:
    """``generated_on`` as seconds since the epoch (ISO, this machine's local time), or None."""
    text = dump.get("generated_on")
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


@dataclass
class RankCompile:
    """One rank's compile meter (the sum over its files when it was started more than once)."""

    rank: int | None
    files: list[str] = field(default_factory=list)
    #: A file was cut (no closing ``]``): that process did not exit normally.
    truncated: bool = False
    dumps: int = 0
    compilations: int = 0
    compile_ms: float = 0.0
    warmup_compilations: int = 0
    warmup_compile_ms: float = 0.0
    fallbacks: int = 0
    fallback_ops: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    defragmentations: int = 0
    defragmentations_ok: int = 0
    #: A file held a recipe_cache dump (the hit rate is known).
    cache_seen: bool = False

    @property
    def steady_compilations(self) -> int:
        return self.compilations - self.warmup_compilations

    @property
    def cache_hit_rate(self) -> float | None:
        total = self.cache_hits + self.cache_misses
        return self.cache_hits / total if self.cache_seen and total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "files": self.files, "truncated": self.truncated, "dumps": self.dumps,
                "compilations": self.compilations, "compile_s": round(self.compile_ms / 1000, 3),
                "warmup_compilations": self.warmup_compilations,
                "warmup_compile_s": round(self.warmup_compile_ms / 1000, 3),
                "steady_compilations": self.steady_compilations,
                "steady_compile_s": round((self.compile_ms - self.warmup_compile_ms) / 1000, 3),
                "cpu_fallbacks": self.fallbacks,
                "cpu_fallback_ops": dict(sorted(self.fallback_ops.items(), key=lambda kv: -kv[1])),
                "recipe_cache_hits": self.cache_hits if self.cache_seen else None,
                "recipe_cache_misses": self.cache_misses if self.cache_seen else None,
                "recipe_cache_hit_rate": (None if self.cache_hit_rate is None
                                          else round(self.cache_hit_rate, 4)),
                "defragmentations": self.defragmentations,
                "defragmentations_successful": self.defragmentations_ok}


def _take_file(rank: RankCompile, dumps: Sequence[Mapping[str, Any]], warmup_until: float | None) -> None:
    """Add one process's dumps (counters since that process started) to ``rank``."""
    last: dict[str, Mapping[str, Any]] = {}
    warm: Mapping[str, Any] | None = None
    for dump in dumps:
        name = str(dump.get("metric_name"))
        stats = dump.get("statistics")
        if not isinstance(stats, Mapping):
            continue
        last[name] = stats
        if name == "graph_compilation" and warmup_until is not None:
            when = _when(dump)
            if when is not None and when <= warmup_until:
                warm = stats
    compile_stats = last.get("graph_compilation") or {}
    count = int(_number(compile_stats.get("TotalNumber")) or 0)
    rank.compilations += count
    rank.compile_ms += _number(compile_stats.get("TotalTime")) or 0.0
    if warmup_until is None:
        # No logged step (the run never trained): everything it compiled was warm-up.
        rank.warmup_compilations += count
        rank.warmup_compile_ms += _number(compile_stats.get("TotalTime")) or 0.0
    elif warm is not None:
        rank.warmup_compilations += int(_number(warm.get("TotalNumber")) or 0)
        rank.warmup_compile_ms += _number(warm.get("TotalTime")) or 0.0
    fallback = last.get("cpu_fallback") or {}
    rank.fallbacks += int(_number(fallback.get("TotalNumber")) or 0)
    ops = fallback.get("FallbackOps")
    if isinstance(ops, Mapping):
        for op, times in ops.items():
            rank.fallback_ops[str(op)] = rank.fallback_ops.get(str(op), 0) + int(_number(times) or 0)
    elif isinstance(ops, list):  # a list of names, should a version print it so
        for op in ops:
            rank.fallback_ops[str(op)] = rank.fallback_ops.get(str(op), 0) + 1
    cache = last.get("recipe_cache")
    if cache is not None:
        rank.cache_seen = True
        rank.cache_hits += int(_number(cache.get("TotalHit")) or 0)
        rank.cache_misses += int(_number(cache.get("TotalMiss")) or 0)
    defrag = last.get("memory_defragmentation") or {}
    rank.defragmentations += int(_number(defrag.get("TotalNumber")) or 0)
    rank.defragmentations_ok += int(_number(defrag.get("TotalSuccessful")) or 0)


def logged_steps(events: Iterable[Mapping[str, Any]]) -> list[tuple[float, int]]:
    """(time, step) of each logged training step, in order: rank 0's "metrics" events (not the
    end-of-training summary), and on another machine of a multi-machine run (a host's part, a Slurm
    node) that machine's own "step" events; a step already seen is not counted again."""
    out: list[tuple[float, int]] = []
    for event in events:
        step, when = event.get("step"), event.get("time")
        if event.get("type") not in (EventType.METRICS, EventType.STEP) or event.get("summary") \
                or not isinstance(step, int) or isinstance(step, bool) \
                or not isinstance(when, (int, float)) or isinstance(when, bool):
            continue
        if not out or step > out[-1][1]:
            out.append((float(when), step))
    return out


def first_step_time(events: Iterable[Mapping[str, Any]]) -> float | None:
    """The time of the run's first logged training step (``logged_steps``)."""
    steps = logged_steps(events)
    return steps[0][0] if steps else None


def run_summary(base: str | Path, events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``summarize`` of a run (or of one machine's part of it) timed by its own logged steps."""
    steps = logged_steps(events)
    return summarize(base, warmup_until=steps[0][0] if steps else None,
                     steady_steps=(steps[-1][1] - steps[0][1]) if len(steps) > 1 else None)


def summarize(base: str | Path, *, warmup_until: float | None = None,
              steady_steps: int | None = None) -> dict[str, Any] | None:
    """The compile meter of the files written for ``PT_HPU_METRICS_FILE=base``; None when there are
    none (not a Gaudi run, or the bridge wrote nothing).

    ``warmup_until``: the first logged training step's time (``first_step_time``): compilations
    dumped up to then are warm-up, the rest steady state. ``steady_steps``: steps trained after it,
    for a rate per 100 steps."""
    files = metric_files(base)
    if not files:
        return None
    ranks: dict[int | None, RankCompile] = {}
    unreadable: list[str] = []
    for found in files:
        try:
            text = found.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            unreadable.append(found.path.name)
            continue
        dumps, closed = read_dumps(text)
        rank = ranks.setdefault(found.rank, RankCompile(found.rank))
        rank.files.append(found.path.name)
        rank.truncated = rank.truncated or not closed
        rank.dumps += len(dumps)
        _take_file(rank, dumps, warmup_until)
    if not ranks:
        return {"ranks": [], "unreadable": unreadable}
    # The rank that compiled most sets the pace of all (they wait for it at every collective).
    worst = max(ranks.values(), key=lambda r: (r.compilations, r.compile_ms))
    out = worst.to_dict()
    out["ranks"] = [r.to_dict() for r in ranks.values()]
    out["unreadable"] = unreadable
    out["fallback_ops_all_ranks"] = sorted({op for r in ranks.values() for op in r.fallback_ops})
    if steady_steps:
        out["steady_steps"] = steady_steps
        out["steady_compilations_per_100_steps"] = round(100 * worst.steady_compilations / steady_steps, 3)
    return out


def describe(summary: Mapping[str, Any]) -> str:
    """One line: '12 graph compilations (34.5 s): 10 in warm-up, 2 after · 3 CPU fallbacks (aten::digamma)
    · recipe cache 96 % hits · 0 defragmentations'."""
    parts = [f"{summary.get('compilations', 0)} graph compilations ({summary.get('compile_s', 0):g} s): "
             f"{summary.get('warmup_compilations', 0)} in warm-up, "
             f"{summary.get('steady_compilations', 0)} after"]
    ops = summary.get("cpu_fallback_ops") or {}
    fallbacks = summary.get("cpu_fallbacks", 0)
    parts.append(f"{fallbacks} CPU fallbacks" + (f" ({', '.join(list(ops)[:5])})" if ops else ""))
    rate = summary.get("recipe_cache_hit_rate")
    if isinstance(rate, (int, float)):
        parts.append(f"recipe cache {100 * rate:.0f} % hits")
    parts.append(f"{summary.get('defragmentations', 0)} defragmentations")
    if summary.get("truncated"):
        parts.append("its file was cut (the rank did not exit normally)")
    return " · ".join(parts)


__all__ = ["DUMP_TRIGGERS", "FILE_FORMAT", "FILE_NAME", "FOLDER_NAME", "MetricsFile", "RankCompile",
           "describe", "first_step_time", "launch_env", "logged_steps", "metric_files", "read_dumps",
           "run_summary", "summarize"]
