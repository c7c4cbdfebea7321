"""``python bench/run.py [--quick] [--only NAME ...]``: the project's figures as one table.

Each bench/bench_<area>.py exposes ``run(quick) -> list[dict]`` rows with name, value, unit, baseline,
ratio, spread and goal. Every ratio comes from interleaved repeats (app, baseline, app, baseline ...;
bench/harness.py): the ratio is the median of the per-pair ratios and ``spread`` their min-max, so a
figure shows how far it can be trusted on a busy machine. Benchmarks drive the app from outside (the
product package holds no benchmark hooks).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

AREAS = ["startup", "devices", "hosts", "runner", "remote", "training", "sft", "stop", "multihost", "doctor",
         "gate", "eval", "serve", "download", "meter", "queue", "dashboard", "pref", "fp8"]


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return f"{text} {unit}".strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller models")
    parser.add_argument("--only", nargs="*", choices=AREAS, help="run only these areas")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    failures = 0
    for area in args.only or AREAS:
        started = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.bench_{area}")
            got = module.run(quick=args.quick)
        except ModuleNotFoundError as exc:
            if exc.name == f"bench.bench_{area}":
                print(f"[{area}] no benchmark module", file=sys.stderr)
                continue
            raise
        except Exception:
            failures += 1
            print(f"[{area}] FAILED:\n{traceback.format_exc()}", file=sys.stderr)
            continue
        print(f"[{area}] done in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        rows.extend(got)
    width = max([len(r["name"]) for r in rows] + [10])
    header = (f"{'figure':<{width}}  {'value':>12}  {'baseline':>12}  {'ratio':>7}  {'spread':>13}  "
              f"{'n':>3}  goal")
    print(header)
    print("-" * len(header))
    for r in rows:
        spread = r.get("spread")
        spread_text = f"{_fmt(spread[0])}-{_fmt(spread[1])}" if spread else "-"
        print(f"{r['name']:<{width}}  {_fmt(r['value'], r['unit']):>12}  "
              f"{_fmt(r.get('baseline'), r['unit']):>12}  {_fmt(r.get('ratio')):>7}  {spread_text:>13}  "
              f"{r.get('repeats', '-')!s:>3}  {r.get('goal', '')}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
