"""A fake of Intel's PyTorch bridge's metrics writer, with the logged steps of a training run: what the
ranks of one machine would leave for its run meter, on a machine without Gaudi.

``python tests/fake_hpu_bridge.py EVENTS STEPS [--ranks 0,1] [--step-event step|metrics]``

For each rank, the file the bridge writes for ``PT_HPU_METRICS_FILE`` (read from the environment, as
the bridge reads it): ``<stem>-rank<N><ext>``, or ``….1``, ``.2`` … when that name is taken (the bridge
never overwrites); a JSON array of ``{metric_name, triggered_by, generated_on, statistics}`` dumps, one
per change (``metric_change``), flushed per write and never closed with ``]`` (as a killed rank's). The
first rank compiles 6 graphs before step 1, then one every 2nd step after step 11 (a rise after a
10-step warm-up); every other rank compiles half as often. A cpu_fallback and a recipe_cache dump follow
the first graphs. Into EVENTS (the run's events.jsonl) goes each step, as rank 0 logs it ("metrics") or
as another machine's first rank does ("step"), timed just after the compilations dumped before it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import IO

from gaudi_gui.core.events import EventWriter


def _open_rank_file(base: Path, rank: int) -> IO[str]:
    name = f"{base.stem}-rank{rank}{base.suffix}"
    path, copy = base.parent / name, 0
    while path.exists():
        copy += 1
        path = base.parent / f"{name}.{copy}"
    return open(path, "x", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("events")
    parser.add_argument("steps", type=int)
    parser.add_argument("--ranks", default="0")
    parser.add_argument("--step-event", default="metrics", choices=("metrics", "step"))
    args = parser.parse_args()
    base = Path(os.environ["PT_HPU_METRICS_FILE"])
    ranks = [int(r) for r in args.ranks.split(",")]
    files = {rank: _open_rank_file(base, rank) for rank in ranks}
    counts = dict.fromkeys(ranks, 0)
    written = dict.fromkeys(ranks, 0)
    t0 = time.time() - args.steps - 5  # one "second" a step, ending now

    def dump(rank: int, when: float, name: str, statistics: dict[str, object]) -> None:
        out = files[rank]
        out.write(("[" if not written[rank] else ",\n") + json.dumps(
            {"metric_name": name, "triggered_by": "metric_change",
             "generated_on": dt.datetime.fromtimestamp(when).isoformat(), "statistics": statistics}))
        out.flush()
        written[rank] += 1

    with EventWriter(args.events) as events:
        for step in range(0, args.steps + 1):
            when = t0 + step
            for i, rank in enumerate(ranks):
                every = 2 * (1 + min(i, 1))
                grew = 6 if step == 0 else (1 if step > 11 and step % every == 0 else 0)
                if grew:
                    counts[rank] += grew
                    dump(rank, when - 0.5, "graph_compilation",
                         {"TotalNumber": counts[rank], "TotalTime": 900 * counts[rank], "AvgTime": 900})
                if step == 0:
                    dump(rank, when - 0.4, "cpu_fallback",
                         {"TotalNumber": 2, "FallbackOps": {"aten::digamma": 2}})
                    dump(rank, when - 0.3, "recipe_cache",
                         {"TotalHit": 90, "TotalMiss": 10, "RecipeHit": 90, "RecipeMiss": 10})
            if step:
                events.write(args.step_event, step=step, max_steps=args.steps, time=when)
    for out in files.values():
        out.close()  # without "]": the array a killed rank leaves
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
