"""The Gaudi compile meter reader (core/hpu_metrics.py) on files written in the bridge's format:
a JSON array of dumps closed only at exit, per-rank names, ``.1`` copies, a truncated file."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import hpu_metrics

T0 = 1_800_000_000.0


def _dump(name: str, at: float, stats: dict[str, Any], trigger: str = "metric_change") -> dict[str, Any]:
    # generated_on: ISO, local time, no zone (as the bridge writes it).
    return {"metric_name": name, "triggered_by": trigger,
            "generated_on": dt.datetime.fromtimestamp(at).isoformat(), "statistics": stats}


def _write(path: Path, dumps: list[dict[str, Any]], *, closed: bool = True, cut: str = "") -> None:
    # The bridge's layout: "[" then one object per flushed write, "," between, "]" at exit only.
    body = ",\n".join(json.dumps(d, indent=4) for d in dumps)
    path.write_text("[\n" + body + (",\n" + cut if cut else "") + ("\n]\n" if closed else ""))


def _compilations(times: list[float], ms_each: float = 500.0) -> list[dict[str, Any]]:
    return [_dump("graph_compilation", at, {"TotalNumber": i + 1, "TotalTime": ms_each * (i + 1),
                                            "AvgTime": ms_each})
            for i, at in enumerate(times)]


def test_read_dumps_whole_truncated_and_cut() -> None:
    dumps = _compilations([T0, T0 + 1])
    whole = "[\n" + ",\n".join(json.dumps(d) for d in dumps) + "\n]"
    assert hpu_metrics.read_dumps(whole) == (dumps, True)
    no_bracket = "[\n" + ",\n".join(json.dumps(d) for d in dumps) + ",\n"
    assert hpu_metrics.read_dumps(no_bracket) == (dumps, False)
    cut = no_bracket + '{"metric_name": "graph_compilation", "trigg'
    assert hpu_metrics.read_dumps(cut) == (dumps, False)
    assert hpu_metrics.read_dumps("") == ([], False)
    assert hpu_metrics.read_dumps("[") == ([], False)
    assert hpu_metrics.read_dumps("not json") == ([], False)


def test_file_names_per_rank_and_copies(tmp_path: Path) -> None:
    for name in ("metrics-rank0.json", "metrics-rank0.json.1", "metrics-rank1.json", "metrics-rank12.json",
                 "metrics.json", "metrics-rank0.json.tmp", "other-rank0.json", "metrics-rank1.txt"):
        (tmp_path / name).write_text("[")
    found = hpu_metrics.metric_files(tmp_path / "metrics.json")
    assert [(f.path.name, f.rank, f.copy) for f in found] == [
        ("metrics.json", None, 0), ("metrics-rank0.json", 0, 0), ("metrics-rank0.json.1", 0, 1),
        ("metrics-rank1.json", 1, 0), ("metrics-rank12.json", 12, 0)]


def test_launch_env_is_the_runs_own_path(tmp_path: Path) -> None:
    env = hpu_metrics.launch_env(tmp_path)
    assert env == {"PT_HPU_METRICS_FILE": str(tmp_path / "hpu-metrics" / "metrics.json"),
                   "PT_HPU_METRICS_FILE_FORMAT": "json", "PT_HPU_METRICS_DUMP_TRIGGERS": "metric_change"}


def test_a_run_of_two_ranks_one_killed_one_restarted(tmp_path: Path) -> None:
    base = tmp_path / "metrics.json"
    first_step = T0 + 30
    # Rank 0: 4 compilations in warm-up, 3 after the first step; fallbacks, cache, defrag; exited.
    rank0 = _compilations([T0 + 5, T0 + 10, T0 + 20, T0 + 29, T0 + 40, T0 + 50, T0 + 60], ms_each=1000)
    rank0 += [_dump("cpu_fallback", T0 + 12, {"TotalNumber": 3,
                                              "FallbackOps": {"aten::digamma": 2, "aten::_unique2": 1}}),
              _dump("recipe_cache", T0 + 61, {"TotalHit": 90, "TotalMiss": 10, "RecipeHit": {},
                                              "RecipeMiss": {}}),
              _dump("memory_defragmentation", T0 + 45, {"TotalNumber": 1, "TotalSuccessful": 1,
                                                        "MaxTime": 7})]
    rank0.append(_dump("graph_compilation", T0 + 70, {"TotalNumber": 7, "TotalTime": 7000, "AvgTime": 1000},
                       trigger="process_exit"))
    _write(tmp_path / "metrics-rank0.json", rank0)
    # Rank 1 was killed: no "]", and its last dump cut midway.
    _write(tmp_path / "metrics-rank1.json", _compilations([T0 + 6, T0 + 35]), closed=False,
           cut='{\n    "metric_name": "graph_compilation",\n    "trigg')
    # Rank 1 started again (the name was taken: the bridge wrote .1): 2 more compilations.
    _write(tmp_path / "metrics-rank1.json.1", _compilations([T0 + 80, T0 + 81]))
    summary = hpu_metrics.summarize(base, warmup_until=first_step, steady_steps=200)
    assert summary is not None
    ranks = {r["rank"]: r for r in summary["ranks"]}
    assert ranks[0]["compilations"] == 7 and ranks[0]["compile_s"] == 7.0
    assert ranks[0]["warmup_compilations"] == 4 and ranks[0]["warmup_compile_s"] == 4.0
    assert ranks[0]["steady_compilations"] == 3 and ranks[0]["steady_compile_s"] == 3.0
    assert ranks[0]["cpu_fallbacks"] == 3
    assert list(ranks[0]["cpu_fallback_ops"]) == ["aten::digamma", "aten::_unique2"]
    assert ranks[0]["recipe_cache_hit_rate"] == 0.9
    assert ranks[0]["defragmentations"] == 1 and not ranks[0]["truncated"]
    assert ranks[1]["truncated"] and ranks[1]["files"] == ["metrics-rank1.json", "metrics-rank1.json.1"]
    assert ranks[1]["compilations"] == 2 + 2 and ranks[1]["warmup_compilations"] == 1
    assert ranks[1]["recipe_cache_hit_rate"] is None  # never dumped: unknown, not 0 %
    # The run's headline is the rank that compiled most.
    assert summary["rank"] == 0 and summary["compilations"] == 7
    assert summary["steady_compilations_per_100_steps"] == 1.5
    line = hpu_metrics.describe(summary)
    assert "7 graph compilations (7 s): 4 in warm-up, 3 after" in line
    assert "aten::digamma" in line and "recipe cache 90 % hits" in line


def test_no_logged_step_is_all_warmup_and_no_file_is_none(tmp_path: Path) -> None:
    assert hpu_metrics.summarize(tmp_path / "metrics.json") is None
    _write(tmp_path / "metrics-rank0.json", _compilations([T0, T0 + 1, T0 + 2]), closed=False)
    summary = hpu_metrics.summarize(tmp_path / "metrics.json", warmup_until=None)
    assert summary is not None
    assert summary["compilations"] == 3 and summary["warmup_compilations"] == 3
    assert summary["steady_compilations"] == 0 and summary["truncated"]


def test_statistics_as_text_numbers(tmp_path: Path) -> None:
    _write(tmp_path / "m.json", [_dump("graph_compilation", T0, {"TotalNumber": "5", "TotalTime": "250",
                                                                  "AvgTime": "50"})])
    summary = hpu_metrics.summarize(tmp_path / "m.json", warmup_until=T0 - 1)
    assert summary is not None
    assert summary["compilations"] == 5 and summary["steady_compilations"] == 5
    assert summary["compile_s"] == pytest.approx(0.25)


def test_first_step_time() -> None:
    events = [{"type": "phase", "time": 1.0}, {"type": "metrics", "time": 5.0, "summary": True},
              {"type": "metrics", "time": 7.0, "step": 1}, {"type": "metrics", "time": 9.0, "step": 2}]
    assert hpu_metrics.first_step_time(events) == 7.0
    assert hpu_metrics.first_step_time([]) is None
