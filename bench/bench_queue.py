"""Queue benchmark (issue 29), on the fake hl-smi's 8 cards with real detached demo runs on the CPU:

- cards free -> next job started: a queued job waits for module 2, which a foreign process holds (a
  live sleeper listed in the fake hl-smi's process table); the holder ends and the table no longer lists
  it; measured until the queue's entry says "starting" (the queue decided and spawned the start) and
  until "started" (the run's supervisor made the run folder and announced it), median of repeats,
  goal < 5 s. The queue's periodic look at the cards is left at its default (10 s): the start comes from
  the pid watch.
- a queued job ends -> the next one on its cards started: from the first run's own end (its status'
  ended_at, written by its supervisor) to the second entry's "started".
- the agent's CPU while a queued job waits (holder alive), over BENCH_QUEUE_IDLE_S seconds (default
  30): its own CPU (user+sys) and with its children (the doctor's hl-smi calls of the periodic look;
  the fake hl-smi is a Python script, far dearer than the real one). Goal < 1 % of a core. The queue
  is the agent's (agent/queue.py): this is the whole agent's CPU, its queue the only thing it does.

There is no baseline program for a queue: the rows carry no ratio."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FAKE_HLSMI = ROOT / "tests" / "fake_hl_smi.py"
TABLE = ROOT / "tests" / "data" / "hlsmi" / "table-hl225-1.12.1.txt"


def _row(name: str, values: list[float], unit: str, goal: str) -> dict[str, Any]:
    return {"name": name, "value": round(statistics.median(values), 3), "unit": unit, "baseline": None,
            "ratio": None, "spread": [round(min(values), 3), round(max(values), 3)], "repeats": len(values),
            "goal": goal}


def _held_table(pid: int) -> str:
    lines = TABLE.read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("|   0        N/A"))
    lines[row] = f"|   0        {pid}  C      python3 train.py" + " " * 25 + "2040MiB    |"
    return "\n".join(lines) + "\n"


def _gg(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          env=env, timeout=180, check=True)
    return done.stdout


def _state(home: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((home / "data" / "queue" / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return {e["id"]: e for e in data.get("entries", [])}


def _wait(home: Path, entry: str, states: tuple[str, ...], timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = _state(home).get(entry)
        if got and got["state"] in states:
            return got
        time.sleep(0.02)
    raise TimeoutError(f"{entry} never reached {states}")


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats = 3 if quick else 5
    idle_s = float(os.environ.get("BENCH_QUEUE_IDLE_S", "15" if quick else "30"))
    with tempfile.TemporaryDirectory(prefix="bench-queue-") as tmp:
        base = Path(tmp)
        fake_bin = base / "bin"
        fake_bin.mkdir()
        program = fake_bin / "hl-smi"
        program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_HLSMI} \"$@\"\n")
        program.chmod(0o755)
        table = base / "table.txt"
        home = base / "home"
        env = dict(os.environ, GAUDI_GUI_HOME=str(home), FAKE_HLSMI_TABLE=str(table),
                   PATH=f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        if not env.get("GAUDI_GUI_DEMO_MODEL_DIR"):
            model = base / "demo-model"
            subprocess.run([sys.executable, "-m", "gaudi_gui.workers.demo", str(model), "--steps", "30"],
                           check=True, capture_output=True, timeout=600)
            env["GAUDI_GUI_DEMO_MODEL_DIR"] = str(model)
        job = base / "job.json"
        job.write_text(json.dumps({"name": "bench", "training_args": {
            "max_steps": 2, "logging_steps": 1, "save_strategy": "no"}}))
        to_starting: list[float] = []
        to_started: list[float] = []
        cpu_own: list[float] = []
        cpu_all: list[float] = []
        for index in range(repeats):
            holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            try:
                table.write_text(_held_table(holder.pid))
                entry = json.loads(_gg(env, "queue", "add", "--config", str(job), "--device", "cpu",
                                       "--cards", "2,", "--json"))["entry"]
                _wait(home, entry, ("waiting",))
                if index == 0:
                    cpu_own_pct, cpu_all_pct = _idle_cpu(home, idle_s)
                    cpu_own.append(cpu_own_pct)
                    cpu_all.append(cpu_all_pct)
                table.write_text(TABLE.read_text())
                freed = time.time()
                holder.kill()
                holder.wait()
                starting = _wait(home, entry, ("starting", "started", "ended"))
                to_starting.append(max(0.0, starting["since"] - freed))
                started = _wait(home, entry, ("started", "ended"))
                to_started.append(max(0.0, started["started_at"] - freed))
                _wait(home, entry, ("ended",))
            finally:
                holder.kill()
                holder.wait()
        # A queued job ends -> the next one on the same cards starts.
        gaps: list[float] = []
        table.write_text(TABLE.read_text())
        for _ in range(max(2, repeats - 2)):
            first = json.loads(_gg(env, "queue", "add", "--config", str(job), "--device", "cpu", "--cards",
                                   "3,", "--json"))["entry"]
            second = json.loads(_gg(env, "queue", "add", "--config", str(job), "--device", "cpu", "--cards",
                                    "3,", "--json"))["entry"]
            done = _wait(home, first, ("ended",))
            started = _wait(home, second, ("started", "ended"))
            status = json.loads((Path(done["run_folder"]) / "status.json").read_text())
            gaps.append(max(0.0, started["started_at"] - float(status["ended_at"])))
            _wait(home, second, ("ended",))
        subprocess.run([sys.executable, "-m", "gaudi_gui", "agent", "--stop", "--force"], env=env,
                       capture_output=True, timeout=60, check=False)
    return [
        _row("queue: card freed -> next job 'starting' (queue decided, start spawned)", to_starting, "s",
             "< 5 s"),
        _row("queue: card freed -> next job 'started' (run folder made, supervisor announced)", to_started,
             "s", "< 5 s"),
        _row("queue: a queued run ended -> the next on its cards 'started'", gaps, "s", "< 5 s"),
        _row(f"agent CPU while a queued job waits ({idle_s:g} s), own", cpu_own, "% core", "< 1 %"),
        _row(f"agent CPU while a queued job waits ({idle_s:g} s), with its hl-smi children (fake hl-smi)",
             cpu_all, "% core", "< 1 % (own)"),
    ]


def _idle_cpu(home: Path, seconds: float) -> tuple[float, float]:
    import psutil
    pid = json.loads((home / "data" / "queue" / "state.json").read_text())["pid"]  # the agent's
    proc = psutil.Process(pid)
    before = proc.cpu_times()
    started = time.monotonic()
    time.sleep(seconds)
    after = proc.cpu_times()
    wall = time.monotonic() - started
    own = (after.user + after.system) - (before.user + before.system)
    kids = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    return 100.0 * own / wall, 100.0 * (own + kids) / wall


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
