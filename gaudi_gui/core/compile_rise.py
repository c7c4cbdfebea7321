"""Graph compilations that keep rising after warm-up: on Gaudi, a run that recompiles every few steps
(dynamic shapes) is slow for a reason no loss curve shows. From the bridge's compile meter
(``core.hpu_metrics``: the per-rank metrics files the supervisor asks for) and the run's logged steps,
:func:`compile_rise` finds it, with the numbers and what to do; the run meter (``core.meter``) checks
while the run trains, writes it once as a ``warning`` event (``EventType.WARNING``) into events.jsonl
(the Training tab says it) and into meter-summary.json as ``compile_warning`` (``runs show`` says it).
Qt-free, torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gaudi_gui.core.hpu_metrics import _number, _when, metric_files, read_dumps

#: Steps of a launch left to warm-up before compilations count as steady-state ones.
RISE_WARMUP_STEPS = 50
#: Steady-state steps needed before a rate is judged (fewer: too few to tell).
RISE_MIN_STEPS = 20
#: More than this many compilations per 100 steady-state steps is a rise.
RISE_PER_100_STEPS = 3.0
RISE_CAUSES = ("the input shapes change from step to step (dynamic shapes): pad every batch to a fixed "
               "length (max_length with pad_to_multiple_of, or buckets of a few lengths) and keep "
               "padding_free off; a smaller last batch of each epoch recompiles too: dataloader_drop_last. "
               "PT_HPU_METRICS_GC_DETAILS=1 names the graphs that recompile")


def compile_timeline(base: str | Path) -> list[tuple[float, int]]:
    """(time, compilations so far) of the rank that compiled most, from its graph_compilation dumps
    (a rank started again, ``name.N``, goes on from its earlier processes' count)."""
    by_rank: dict[int | None, list[tuple[float, int]]] = {}
    offsets: dict[int | None, int] = {}
    for found in metric_files(base):
        try:
            text = found.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        points = by_rank.setdefault(found.rank, [])
        offset = offsets.get(found.rank, 0)
        last = 0
        for dump in read_dumps(text)[0]:
            stats = dump.get("statistics")
            when = _when(dump)
            if dump.get("metric_name") != "graph_compilation" or not isinstance(stats, Mapping) \
                    or when is None:
                continue
            last = int(_number(stats.get("TotalNumber")) or 0)
            points.append((when, offset + last))
        offsets[found.rank] = offset + last
    if not by_rank:
        return []
    worst = max(by_rank.values(), key=lambda p: p[-1][1] if p else 0)
    return sorted(worst)


def compile_rise(timeline: Sequence[tuple[float, int]], steps: Sequence[tuple[float, int]], *,
                 warmup_steps: int = RISE_WARMUP_STEPS, min_steps: int = RISE_MIN_STEPS,
                 per_100: float = RISE_PER_100_STEPS) -> dict[str, Any] | None:
    """A finding when graph compilations keep rising after warm-up, else None.

    ``timeline``: (time, compilations so far) (``compile_timeline``); ``steps``: (time, step) of the
    launch's logged training steps, in order. Warm-up ends at the first logged step ``warmup_steps``
    past the launch's first; the compilations counted until then are warm-up's. The rate is judged
    once ``min_steps`` steps have been logged after it: more than ``per_100`` per 100 steps (and at
    least 3 in all) is a rise."""
    if not timeline or len(steps) < 2:
        return None
    first_step = steps[0][1]
    warm = next(((t, s) for t, s in steps if s >= first_step + warmup_steps), None)
    if warm is None:
        return None
    warm_t, warm_step = warm
    last_t, last_step = steps[-1]
    run_steps = last_step - warm_step
    if run_steps < min_steps:
        return None
    base = max((n for t, n in timeline if t <= warm_t), default=0)
    # Compilations dumped by the last logged step's time (later dumps belong to steps not logged yet).
    now = max((n for t, n in timeline if t <= last_t), default=base)
    steady = now - base
    rate = 100.0 * steady / run_steps
    if steady < 3 or rate <= per_100:
        return None
    return {"kind": "compile_rise", "warmup_steps": warm_step - first_step, "from_step": warm_step,
            "to_step": last_step, "steady_steps": run_steps, "steady_compilations": steady,
            "warmup_compilations": base, "per_100_steps": round(rate, 2),
            "message": (f"graph compilations keep rising after warm-up: {steady} in the {run_steps} steps "
                        f"after step {warm_step} ({rate:.3g} per 100 steps; {base} during warm-up)"),
            "fix": RISE_CAUSES}


def named(finding: Mapping[str, Any], part: str) -> dict[str, Any]:
    """``finding`` as one part of a job found it (a host of a multi-host run, a Slurm node): "part"
    names it and its message starts with the name. A finding already named is left as it is."""
    if not part or finding.get("part"):
        return dict(finding)
    return {**finding, "part": part, "message": f"{part}: {finding.get('message', '')}"}


def findings(summary: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Every finding a meter summary holds: a job of several parts keeps each part's, named
    (``compile_warnings``); a run's own summary its one ``compile_warning``."""
    if not summary:
        return []
    several = summary.get("compile_warnings")
    if isinstance(several, list) and several:
        return [dict(f) for f in several if isinstance(f, Mapping)]
    one = summary.get("compile_warning")
    return [dict(one)] if isinstance(one, Mapping) else []


def rise_text(finding: Mapping[str, Any] | None) -> str:
    """'⚠ graph compilations keep rising …: <fix>' ('' without a finding)."""
    if not finding or not finding.get("message"):
        return ""
    return f"⚠ {finding['message']} — {finding.get('fix') or RISE_CAUSES}"


__all__ = ["RISE_CAUSES", "RISE_MIN_STEPS", "RISE_PER_100_STEPS", "RISE_WARMUP_STEPS",
           "compile_rise", "compile_timeline", "findings", "named", "rise_text"]
