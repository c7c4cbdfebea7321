"""Multi-host training speed: a two-host run started by the app (``gaudi-gui train --hosts A,B``)
against the same two ``accelerate launch`` commands started by hand.

The "two hosts" are two aliases of one real SSH server on 127.0.0.1 (``bench_remote.ssh_server``), so
the app's side goes through everything a real multi-host run does: the pre-flight over ssh on both
hosts, ``train --detach`` on each (a background supervisor, ``tee`` into log.txt), and ``runs follow``
on both until the end. The baseline is the same job split the same way (``core.multi_host.host_jobs``:
machine ranks 0 and 1, main process 127.0.0.1 on a fresh port), each rank's launch built by
``core.launch`` exactly as ``prepare_run`` builds it (generated accelerate config, ``ACCELERATE_USE_CPU``,
the worker's training arguments for the device) and started here as two plain subprocesses.

Both sides run the same worker, so both write the same events.jsonl in their run folders; steps/s is
read from machine rank 0's events the same way on both: from the 3rd logged step to the last, by the
events' ``elapsed`` (training steady state: loading, the rendezvous and the first steps are outside
the window). The sides alternate app, baseline, app, baseline … (bench/harness.py) with a fresh main
port per run; the ratio is the median of the per-pair ratios app/baseline, with their spread.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_remote import ssh_server  # noqa: E402
from bench.bench_training import _ensure_model  # noqa: E402
from bench.harness import environ, interleaved, row  # noqa: E402
from gaudi_gui.core import launch as launch_mod  # noqa: E402
from gaudi_gui.core import paths  # noqa: E402
from gaudi_gui.core.jobconfig import JobConfig  # noqa: E402
from gaudi_gui.core.multi_host import host_jobs  # noqa: E402
from gaudi_gui.core.runstore import RunStore  # noqa: E402

SECOND = "gg-bench-b"
BATCH = 2
RUN_TIMEOUT_S = 900.0
FOLDER_LINE = re.compile(r"^(?P<host>\S+): machine rank (?P<rank>\d+), run folder (?P<folder>.+)$")


def _job(model: str, out: Path, steps: int) -> JobConfig:
    return JobConfig(model=model, name="bench-multihost",
                     training_args={"output_dir": str(out), "max_steps": steps,
                                    "per_device_train_batch_size": BATCH, "logging_steps": 1,
                                    "save_strategy": "no"})


def _steady(events_path: Path, skip: int = 2) -> float:
    """Steps/s from the (skip+1)-th metrics event to the last, by the events' ``elapsed`` (after
    checking that the run trained with world size 2)."""
    events = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
    metrics = sorted((e for e in events if e.get("type") == "metrics" and e.get("loss") is not None
                      and e.get("step") is not None), key=lambda e: e["step"])
    if len(metrics) < skip + 2:
        raise RuntimeError(f"{events_path}: only {len(metrics)} metrics events")
    first, last = metrics[skip], metrics[-1]
    started = [e for e in events if e.get("type") == "training_started"]
    if not started or started[0].get("world_size") != 2:
        raise RuntimeError(f"{events_path}: no training_started with world_size 2 ({started[:1]})")
    return (last["step"] - first["step"]) / max(1e-9, last["elapsed"] - first["elapsed"])


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _stop_leftovers(runs_root: Path) -> None:
    """Kill any detached run still alive under ``runs_root`` (after a failed or timed-out repeat)."""
    from gaudi_gui.core.runstore import Run
    for folder in sorted(runs_root.glob("*")):
        if folder.is_dir() and Run(folder).processes_alive():
            subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "stop", "--now", str(folder)],
                           capture_output=True, timeout=60, check=False)


def run(quick: bool = False) -> list[dict[str, Any]]:
    steps, repeats = (60, 3) if quick else (200, 5)
    tmp = Path(tempfile.mkdtemp(prefix="gaudi-gui-bench-mh-"))
    try:
        _ensure_model(tmp)
        model = str(os.environ.get("GAUDI_GUI_DEMO_MODEL_DIR") or paths.demo_model_dir())
        runs_root = tmp / "runs"
        counter = [0]
        # The SSH server's children (the "hosts") inherit this environment: runs land under tmp.
        with environ(GAUDI_GUI_RUNS_DIR=str(runs_root), GAUDI_GUI_DEMO_MODEL_DIR=model), \
                ssh_server(tmp / "ssh", extra_aliases=(SECOND,)) as first:

            def app_once() -> float:
                counter[0] += 1
                job = _job(model, tmp / f"out-app-{counter[0]}", steps)
                job.launch.main_process_port = launch_mod.free_port()
                config = tmp / f"job-app-{counter[0]}.json"
                job.save(config)
                argv = [sys.executable, "-m", "gaudi_gui", "train", "--config", str(config), "--hosts",
                        f"{first},{SECOND}", "--device", "cpu", "--main-ip", "127.0.0.1"]
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
                folders: dict[int, str] = {}
                try:
                    out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    out, err = proc.communicate()
                    err += f"\n(timed out after {RUN_TIMEOUT_S:g} s)"
                for line in out.splitlines():
                    match = FOLDER_LINE.match(line.strip())
                    if match:
                        folders[int(match["rank"])] = match["folder"]
                if proc.returncode != 0 or 0 not in folders:
                    for folder in folders.values():  # leave nothing running on the "hosts"
                        subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "stop", "--now", folder],
                                       capture_output=True, timeout=60, check=False)
                    raise RuntimeError(f"app run {counter[0]} exited {proc.returncode}: {err[-800:]}")
                return _steady(Path(folders[0]) / "events.jsonl")

            def by_hand_once() -> float:
                counter[0] += 1
                job = _job(model, tmp / f"out-hand-{counter[0]}", steps)
                port = launch_mod.free_port()
                procs: list[subprocess.Popen[bytes]] = []
                folders: list[Path] = []
                try:
                    for rank, part in enumerate(host_jobs(job, 2, "127.0.0.1", port)):
                        # What prepare_run does on each host, minus the app: config.json as it runs,
                        # the generated accelerate config, the launch's own environment.
                        part.training_args = launch_mod.worker_training_args(part, "cpu")
                        run_ = RunStore(tmp / f"hand-{counter[0]}-{rank}").create(part)
                        launch = launch_mod.build(part, run_.folder, device="cpu")
                        launch_mod.write_generated_config(launch)
                        with open(run_.folder / "log.txt", "wb") as log:
                            procs.append(subprocess.Popen(launch.argv, env=launch.env(), stdout=log,
                                                          stderr=subprocess.STDOUT, start_new_session=True))
                        folders.append(run_.folder)
                    deadline = time.monotonic() + RUN_TIMEOUT_S
                    for proc in procs:
                        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                        if code != 0:
                            tail = (folders[procs.index(proc)] / "log.txt").read_text(errors="replace")
                            raise RuntimeError(f"by-hand run {counter[0]} exited {code}: {tail[-800:]}")
                finally:
                    for proc in procs:
                        _kill_group(proc)
                return _steady(folders[0] / "events.jsonl")

            try:
                result = interleaved(app_once, by_hand_once, repeats, warmup=0 if quick else 1)
            finally:
                _stop_leftovers(runs_root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    goal = f"ratio >= 0.98 ({steps} steps, batch {BATCH}, tiny model, CPU, 2 hosts x 1 rank)"
    return [row("multihost: steps/s, 2 hosts via the app vs 2 accelerate launches by hand", result,
                unit="steps/s", goal=goal)]


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(json.dumps(r))
