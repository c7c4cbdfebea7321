"""The run meter's own CPU cost (issue 27), in the supervisor's process.

A child process runs ``core.meter.Meter`` for a Gaudi run (the fake hl-smi replaying the recorded
8-card server on PATH, its CSV loop at hl-smi's 1 s) for ``BENCH_METER_SECONDS`` and reports the CPU
seconds of its own threads (``os.times`` of the process: the meter's reading, parsing, integrating
and writing) and of its children (the tool: here the fake hl-smi, a Python script, far heavier than
Intel's C binary, so the children's figure is an upper bound that says nothing of a real card).

- app: the whole meter: CSV loop, the throttle reasons (``hl-smi -q``) every 5 s, and the compile
  watch every 10 s over a bridge metrics file of 2,000 dumps and an events.jsonl of 2,000 steps;
- baseline: the same CSV loop only (throttle read once at the start, no compile watch).

Interleaved (app, baseline, ...) by ``bench.harness``: the per-pair ratio of own CPU seconds says what
the throttle reads and the compile watch add; the app's own CPU per wall second is the cost figure
(goal: well under 1 % of one core).

Then what the meter costs the training itself: the same short CPU training (``gaudi-gui train
--device hpu --no-preflight``, a Gaudi launch whose ranks run on the CPU here, logging every step) with
the meter on (the fake hl-smi on PATH at hl-smi's own 1 s: the CSV loop, ``hl-smi -q`` every 5 s, the
compile watch) vs off (no hl-smi on PATH: the meter finds nothing to read and starts no sampler),
interleaved; steps/s between the first and the last logged step of each run (goal: ratio >= 0.99).
The fake hl-smi is a Python script, far heavier than Intel's binary, on the same cores as the ranks:
the ratio is a lower bound of what a real card's meter leaves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness import interleaved_metrics, row

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
from pathlib import Path
from gaudi_gui.core import meter
folder, seconds, full = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
env = dict(os.environ)
if full:
    env["PT_HPU_METRICS_FILE"] = str(folder / "hpu-metrics" / "metrics.json")
else:
    env["GAUDI_GUI_METER_THROTTLE_S"] = "1e9"
m = meter.Meter(folder, device="hpu", env=env)
t0 = os.times()
m.start()
time.sleep(seconds)
m.stop()
t1 = os.times()
children = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
print(json.dumps({"own_s": (t1.user - t0.user) + (t1.system - t0.system), "children_s": children,
                  "samples": m.accounts.samples, "throttle_reads": sum(c.polls for c in m.throttle.values()),
                  "warning": m.compile_warning is not None}))
"""


def _folder(base: Path, name: str) -> Path:
    """A run folder with a long run's bridge file and events (what the compile watch reads)."""
    import datetime as dt
    folder = base / name
    (folder / "hpu-metrics").mkdir(parents=True)
    t0 = 1_700_000_000.0
    dumps = [json.dumps({"metric_name": "graph_compilation", "triggered_by": "metric_change",
                         "generated_on": dt.datetime.fromtimestamp(t0 + i).isoformat(),
                         "statistics": {"TotalNumber": min(i + 1, 60), "TotalTime": 900 * min(i + 1, 60),
                                        "AvgTime": 900}})
             for i in range(2000)]
    (folder / "hpu-metrics" / "metrics-rank0.json").write_text("[" + ",\n".join(dumps))
    with open(folder / "events.jsonl", "w") as fh:
        for step in range(1, 2001):
            fh.write(json.dumps({"type": "metrics", "rank": 0, "time": t0 + step, "step": step, "loss": 2.0,
                                 "elapsed": step}) + "\n")
    return folder


def _fake_path(base: Path) -> str:
    bin_dir = base / "bin"
    bin_dir.mkdir(exist_ok=True)
    program = bin_dir / "hl-smi"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'fake_hl_smi.py'} \"$@\"\n")
    program.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def _steps_per_s(events: Path) -> float:
    """Steps/s between the first and the last logged step (training speed, not start-up)."""
    rows = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("type") == "metrics" and r.get("loss") is not None
            and not r.get("summary")]
    first, last = rows[0], rows[-1]
    return (last["step"] - first["step"]) / max(1e-9, last["elapsed"] - first["elapsed"])


def training_with_meter(quick: bool = False) -> list[dict[str, Any]]:
    """Training steps/s with the meter on vs off (interleaved)."""
    from bench.harness import interleaved
    from gaudi_gui.core.jobconfig import JobConfig

    steps = int(os.environ.get("BENCH_METER_STEPS", "150" if quick else "400"))
    repeats = int(os.environ.get("BENCH_METER_TRAIN_REPEATS", "3" if quick else "5"))
    # BENCH_METER_MODEL=86m: the model (the runner bench's 86M Llama, 12 layers, hidden 768),
    # whose steps are slow enough that the meter's share of the cores is what the ratio measures.
    big = os.environ.get("BENCH_METER_MODEL", "demo").lower() == "86m"
    with tempfile.TemporaryDirectory(prefix="bench-meter-train-") as tmp:
        base = Path(tmp)
        model = ""
        if big:
            from bench.bench_training import _big_model
            model, params = _big_model(base)
            print(f"86M model built: {params:,} parameters", file=sys.stderr)
        with_tool = {**os.environ, "PATH": _fake_path(base), "PYTHONPATH": str(ROOT),
                     "FAKE_HLSMI_PERIOD": "1"}
        without = {**with_tool, "PATH": os.environ["PATH"]}
        without.pop("GAUDI_GUI_HL_SMI", None)
        with_tool.pop("GAUDI_GUI_HL_SMI", None)
        counter = iter(range(10_000))

        def once(env: dict[str, str]) -> float:
            n = next(counter)
            job = JobConfig(training_args={"output_dir": str(base / f"out-{n}"), "max_steps": steps,
                                           "per_device_train_batch_size": 2, "logging_steps": 1,
                                           "save_strategy": "no"})
            if model:
                job.model = model
            job.save(base / f"job-{n}.json")
            runs = base / f"runs-{n}"
            subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config",
                            str(base / f"job-{n}.json"), "--device", "hpu", "--no-preflight", "--runs-dir",
                            str(runs)], env=env, capture_output=True, text=True, timeout=900, check=True)
            (run_folder,) = list(runs.iterdir())
            metered = (run_folder / "meter-summary.json").is_file() and json.loads(
                (run_folder / "meter-summary.json").read_text()).get("samples", 0) > 0
            if metered != (env is with_tool):
                raise RuntimeError(f"run {n}: meter {'on' if metered else 'off'}, not as asked")
            return _steps_per_s(run_folder / "events.jsonl")

        result = interleaved(lambda: once(with_tool), lambda: once(without), repeats=repeats, warmup=0)
    # Each pair (on, off, ratio): on a shared machine the spread says more than the median.
    print("meter on/off pairs (steps/s): " + "; ".join(
        f"{p['app']:.1f}/{p['base']:.1f}={p['ratio']:.2f}" for p in result.get("samples", [])),
        file=sys.stderr)
    name = "86M model" if big else "demo model"
    return [row(f"training steps/s with the meter on vs off ({name}, {steps} steps, logging every step)",
                result, unit="steps/s", goal="ratio >= 0.99")]


def run(quick: bool = False) -> list[dict[str, Any]]:
    seconds = float(os.environ.get("BENCH_METER_SECONDS", "12" if quick else "30"))
    repeats = int(os.environ.get("BENCH_METER_REPEATS", "2" if quick else "4"))
    with tempfile.TemporaryDirectory(prefix="bench-meter-") as tmp:
        base = Path(tmp)
        env = {**os.environ, "PATH": _fake_path(base), "PYTHONPATH": str(ROOT)}
        counter = iter(range(10_000))

        def once(full: bool) -> dict[str, float]:
            folder = _folder(base, f"run-{next(counter)}")
            argv = [sys.executable, "-c", CHILD, str(folder), str(seconds), "1" if full else "0"]
            out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=seconds + 120,
                                 check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            return {"own_cpu_pct": 100 * got["own_s"] / seconds,
                    "children_cpu_pct": 100 * got["children_s"] / seconds,
                    "samples": got["samples"]}

        results = interleaved_metrics(lambda: once(True), lambda: once(False), repeats=repeats)
    own = results["own_cpu_pct"]
    children = results["children_cpu_pct"]
    return [row("meter: own CPU, whole meter vs CSV loop only", own, unit="% core",
                goal="app < 1 % of one core"),
            row("meter: tool children CPU (fake hl-smi: Python)", children, unit="% core",
                goal="(upper bound: the fake is a Python script)"),
            *training_with_meter(quick)]
