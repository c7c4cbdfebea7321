"""Dashboard open → first page (issue 27): "Open in TensorBoard" / "Open in trackio" on this machine.

app: ``gaudi-gui runs open RUN --tensorboard|--trackio --no-browser --json`` from its start until the
URL it prints answers HTTP 200 (what a person waits for after the click: the command's start, the run's
export, the dashboard's start, and for TensorBoard its first load listing the run). The run's earlier
export is removed before each repeat, so every open exports again (the up-to-date check would skip it).

baseline: the bare dashboard on the same data, started by hand as a user would (``python -m
tensorboard.main --logdir DIR --host 127.0.0.1 --port N`` with the same flags; ``trackio.show(project,
server_port=N, open_browser=False)`` in a fresh Python), until ``/`` answers 200.

Interleaved (app, baseline, ...) by ``bench.harness``; the run has 2,000 logged steps and a 1 Hz meter
of 2 cards over an hour (3,600 samples): a real run's size, not an empty one. Goal: app < 3 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import interleaved, row  # noqa: E402
from gaudi_gui.core import dashboard  # noqa: E402
from gaudi_gui.core.serve import pick_free_port  # noqa: E402

_TRACKIO = ("import sys, trackio; trackio.show(project='gaudi-gui', open_browser=False, share=False, "
            "host='127.0.0.1', server_port=int(sys.argv[1]), block_thread=True)")


def _make_run(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    t0 = 1_700_000_000.0
    with open(folder / "events.jsonl", "w") as fh:
        fh.write(json.dumps({"type": "training_started", "rank": 0, "time": t0, "max_steps": 2000}) + "\n")
        for step in range(1, 2001):
            fh.write(json.dumps({"type": "metrics", "rank": 0, "time": t0 + step, "step": step,
                                 "max_steps": 2000, "loss": 3.0 / (1 + step / 500), "learning_rate": 1e-4,
                                 "grad_norm": 1.0, "throughput": 2.0, "tokens_per_second": 4096.0}) + "\n")
    with open(folder / "meter.jsonl", "w") as fh:
        for k in range(3600):
            cards = [{"name": f"module {c}", "power_w": 300.0 + c, "utilization": 90.0,
                      "memory_used_mib": 90000.0, "temperature_c": 50.0} for c in (2, 3)]
            fh.write(json.dumps({"t": t0 + k, "source": "hl-smi", "cards": cards}) + "\n")
    (folder / "status.json").write_text(json.dumps({"state": "finished", "started_at": t0}))
    return folder


def _forget_export(folder: Path) -> None:
    for old in folder.glob("events.out.tfevents.*"):
        old.unlink()
    (folder / ".trackio-exported").unlink(missing_ok=True)


def _app(kind: str, root: Path, folder: Path) -> float:
    _forget_export(folder)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(root), "open",
                             folder.name, f"--{kind}", "--no-browser", "--json"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        message = json.loads(proc.stdout.readline() or "{}")
        if message.get("t") != "opened":
            raise RuntimeError(f"runs open failed: {message} {proc.stderr.read() if proc.stderr else ''}")
        while dashboard.fetch(message["url"])[0] != 200:
            time.sleep(0.02)
        return time.perf_counter() - started
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _bare(kind: str, root: Path) -> float:
    port = pick_free_port()
    if kind == "tensorboard":
        argv = dashboard.argv(kind, root, port)
        env = dict(os.environ)
    else:
        argv = [sys.executable, "-c", _TRACKIO, str(port)]
        env = {**os.environ, "TRACKIO_DIR": str(root / dashboard.TRACKIO_FOLDER), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    try:
        while dashboard.fetch(dashboard.base_url(port))[0] != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"the bare {kind} ended with {proc.returncode}")
            time.sleep(0.02)
        return time.perf_counter() - started
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats = 3 if quick else 5
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-dash-") as tmp:
        root = Path(tmp) / "runs"
        folder = _make_run(root, "20260101-000000-bench")
        for kind in dashboard.KINDS:
            if dashboard.missing(kind):
                print(f"[dashboard] {kind} is not installed here: skipped", file=sys.stderr)
                continue
            def app(k: str = kind) -> float:
                return _app(k, root, folder)

            def bare(k: str = kind) -> float:
                return _bare(k, root)

            result = interleaved(app, bare, repeats, warmup=1)
            rows.append(row(f"dashboard open → first page: {dashboard.LABELS[kind]}", result, unit="s",
                            goal="value < 3 s"))
            times = [s["app"] for s in result["samples"]]
            rows[-1]["app_spread"] = [round(min(times), 3), round(max(times), 3)]
    return rows


if __name__ == "__main__":
    for item in run(quick="--quick" in sys.argv):
        print(json.dumps(item))
