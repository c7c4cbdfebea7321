"""Interleaved repeats: the one way bench/ turns two measurements into a ratio.

Drift (page cache warming, another process on the box, CPU frequency) hits a measurement in the order
it is taken. Running ``app, baseline, app, baseline ...`` makes drift hit both sides alike, and taking
one ratio per pair, then the median of those ratios with their spread, shows how far a figure can be
trusted on a busy machine. Every ratio bench/run.py prints comes from here::

    from bench.harness import interleaved, row

    result = interleaved(lambda: time_app(), lambda: time_bare(), repeats=7, warmup=1)
    result["median_ratio"], result["spread"], result["iqr"], result["samples"]
    rows.append(row("startup: first paint", result, unit="ms", scale=1000, goal="ratio <= 1.3"))

A function may also return a dict of figures (``{"first_paint_s": ..., "rss_mib": ...}``); then
``interleaved_metrics`` gives one such summary per key the two sides share.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summarize(app: Sequence[float], base: Sequence[float]) -> dict[str, Any]:
    """Pairwise ratios ``app[i] / base[i]``, their median, min-max spread and IQR, and both medians."""
    if len(app) != len(base) or not app:
        raise ValueError("summarize needs the same, non-zero number of app and baseline samples")
    ratios = [a / b if b else math.nan for a, b in zip(app, base, strict=True)]
    finite = [r for r in ratios if math.isfinite(r)] or [math.nan]
    return {
        "median_ratio": statistics.median(finite),
        "spread": (min(finite), max(finite)),
        "iqr": _quartiles(sorted(finite)),
        "app_median": statistics.median(app),
        "base_median": statistics.median(base),
        "samples": [{"app": a, "base": b, "ratio": r} for a, b, r in zip(app, base, ratios, strict=True)],
        "repeats": len(app),
    }


def _collect(app_fn: Callable[[], Any], base_fn: Callable[[], Any], repeats: int,
             warmup: int) -> tuple[list[Any], list[Any]]:
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for _ in range(warmup):
        # Warm both sides (imports into the page cache, first compile) without keeping the numbers.
        app_fn()
        base_fn()
    app: list[Any] = []
    base: list[Any] = []
    for _ in range(repeats):
        app.append(app_fn())
        base.append(base_fn())
    return app, base


def interleaved(app_fn: Callable[[], float], base_fn: Callable[[], float], repeats: int, *,
                warmup: int = 0) -> dict[str, Any]:
    """Run ``app_fn`` and ``base_fn`` alternately ``repeats`` times (after ``warmup`` unkept pairs).

    Returns ``median_ratio`` (median of the per-pair ratios app/base), ``spread`` (min, max of those
    ratios), ``iqr`` (first and third quartile), ``app_median``, ``base_median``, ``samples`` (one dict
    per pair: app, base, ratio) and ``repeats``. A higher-is-better figure (tokens/s) reads the same
    way: the ratio is app/base either way.
    """
    app, base = _collect(app_fn, base_fn, repeats, warmup)
    return summarize([float(a) for a in app], [float(b) for b in base])


def interleaved_metrics(app_fn: Callable[[], Mapping[str, float]],
                        base_fn: Callable[[], Mapping[str, float]], repeats: int, *,
                        warmup: int = 0) -> dict[str, dict[str, Any]]:
    """Like ``interleaved`` for functions returning several figures: one summary per shared key."""
    app, base = _collect(app_fn, base_fn, repeats, warmup)
    keys = [k for k in app[0] if all(k in a for a in app) and all(k in b for b in base)]
    return {k: summarize([float(a[k]) for a in app], [float(b[k]) for b in base]) for k in keys}


def row(name: str, result: Mapping[str, Any], *, unit: str, goal: str, scale: float = 1.0,
        digits: int = 4) -> dict[str, Any]:
    """A bench/run.py table row from a summary: value and baseline are the medians (times ``scale``),
    ratio the median ratio, spread its min-max."""
    lo, hi = result["spread"]
    q1, q3 = result["iqr"]
    return {"name": name, "value": round(result["app_median"] * scale, digits), "unit": unit,
            "baseline": round(result["base_median"] * scale, digits),
            "ratio": round(result["median_ratio"], 3), "spread": [round(lo, 3), round(hi, 3)],
            "iqr": [round(q1, 3), round(q3, 3)], "repeats": result["repeats"], "goal": goal}


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block; each is put back as it was (or removed) after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
