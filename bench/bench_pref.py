"""Preference tuning speed (issue 41): a DPO run (the demo model on the built-in preference pairs, CPU)
started through the app's launch path (``TrainingJob.start`` on this machine: run folder, generated
accelerate config, ``accelerate launch -m gaudi_gui.workers.train``, events, the metrics and stop
callbacks) against the same ``DPOTrainer`` training written by hand as a plain script and run with
``accelerate launch``.

Both sides train the same rows with the same effective arguments and measure steps/s the same way:
between the first and the last logged step, so start-up is not in the figure. The two sides alternate
(bench/harness.py), and the ratio is the median of the per-pair ratios. The tiny demo model's steps
take ~30 ms, so what the app adds per step (an event line through the supervisor's pipe, the log's
tee, the follower, the window's reading) is a visible share of them; the same pair on the 86M model
of the runner bench (steps of ~1 s on this CPU, closer to a real one) says what a user pays. A last
row is the demo itself: the app's demo DPO job (``demo_job(objective="dpo")``), its
``rewards/margins`` at the first and the last of its 40 steps."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_training import _big_model, _ensure_model, _throughput, _wait
from bench.harness import interleaved, row, summarize
from gaudi_gui.core import paths
from gaudi_gui.core.jobconfig import JobConfig, demo_job
from gaudi_gui.core.runstore import RunStore

MAX_LENGTH = 48
BATCH = 8


def _calm(metrics_file: Path) -> float:
    """Steps/s over the faster half of the steps (1 / the mean of the shorter half of the per-step
    times): on a machine shared with other work, the steps another process slowed are left out, the
    same way on both sides (the whole-run figure moved 1.9-51 steps/s between neighbouring runs on
    the 2 busy cores this was written on)."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("type", "metrics") == "metrics" and r.get("loss") is not None]
    steps = sorted(b["elapsed"] - a["elapsed"] for a, b in itertools.pairwise(rows))
    fast = steps[: max(1, len(steps) // 2)]
    return len(fast) / max(1e-9, sum(fast))

#: The DPOTrainer script a user would write, with the values the app's job resolves to, one JSON line
#: per logged step.
BY_HAND = r'''
import json, sys, time
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import DPOConfig, DPOTrainer

model_dir, data, out, steps, metrics = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir)
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token
rows = load_dataset("json", data_files=data, split="train")


class Log(TrainerCallback):
    def on_train_begin(self, args, state, control, **kw):
        self.t0 = time.time()

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            with open(metrics, "a") as fh:
                fh.write(json.dumps({"step": state.global_step, "loss": float(logs["loss"]),
                                     "elapsed": time.time() - self.t0}) + "\n")


config = DPOConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH, logging_steps=1,
                   save_strategy="no", use_cpu=True, report_to="none", max_length=MAX_LENGTH,
                   learning_rate=1e-3, bf16=False, gradient_checkpointing=False, enable_jit_checkpoint=False)
DPOTrainer(model=model, args=config, train_dataset=rows, processing_class=tokenizer,
           callbacks=[Log()]).train()
'''.replace("BATCH", str(BATCH)).replace("MAX_LENGTH", str(MAX_LENGTH))


def _job(out: Path, steps: int, model: str = "") -> JobConfig:
    job = demo_job(objective="dpo")
    job.name = "bench-dpo"
    if model:
        job.model = model
    job.training_args.update({"output_dir": str(out), "max_steps": steps, "save_strategy": "no",
                              "per_device_train_batch_size": BATCH, "logging_steps": 1})
    job.dataset.max_length = MAX_LENGTH
    return job


def run(quick: bool = False) -> list[dict[str, Any]]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    from PySide6.QtWidgets import QApplication

    from gaudi_gui.core.placement import Placement
    from gaudi_gui.core.runstore import Run
    from gaudi_gui.services.training_job import TrainingJob

    app = QApplication.instance() or QApplication([])
    tmp = Path(tempfile.mkdtemp(prefix="gaudi-gui-bench-pref-"))
    _ensure_model(tmp)
    model_dir = str(os.environ.get("GAUDI_GUI_DEMO_MODEL_DIR") or paths.demo_model_dir())
    data = paths.demo_dataset_path("dpo")
    script = tmp / "dpo_by_hand.py"
    script.write_text(BY_HAND)
    steps = 100 if quick else 300
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    counter = [0]
    problems: list[str] = []

    def app_run(job: JobConfig) -> Run:
        counter[0] += 1
        training = TrainingJob(Placement.local(), RunStore(tmp / f"app-{counter[0]}"))
        done: list[Any] = []
        training.finished.connect(lambda *a: done.append(a))
        training.start(job, device="cpu")
        _wait(app, lambda: bool(done), 900)
        assert training.run is not None, training.summary
        if not done or done[0][1] != "finished":
            problems.append(f"app run {counter[0]}: {done[0] if done else 'did not end'}")
        return training.run

    calm: dict[str, list[float]] = {"app": [], "base": []}
    model = [model_dir]

    def app_once() -> float:
        events = app_run(_job(tmp / f"out-app-{counter[0] + 1}", steps,
                              "" if model[0] == model_dir else model[0])).events_path
        calm["app"].append(_calm(events))
        return _throughput(events)

    def by_hand_once() -> float:
        counter[0] += 1
        metrics = tmp / f"hand-{counter[0]}.jsonl"
        argv = [accelerate, "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", str(script), model[0], str(data),
                str(tmp / f"out-hand-{counter[0]}"), str(steps), str(metrics)]
        subprocess.run(argv, capture_output=True, timeout=900, check=True, cwd=tmp)
        calm["base"].append(_calm(metrics))
        return _throughput(metrics)

    result = interleaved(app_once, by_hand_once, 2 if quick else 6, warmup=0 if quick else 1)
    kept = len(result["samples"])  # the warm-up pair is not kept
    calm_result = summarize(calm["app"][-kept:], calm["base"][-kept:])
    print("[pref] steps/s per pair (app, by hand): " + ", ".join(
        f"({p['app']:.2f}, {p['base']:.2f})" for p in result["samples"]), file=sys.stderr)
    # The same pair on the 86M model: steps long enough that the app's share is what a user pays.
    model[0], params = _big_model(tmp)
    tiny_steps, steps = steps, 10 if quick else 30
    big = interleaved(app_once, by_hand_once, 2 if quick else 4)
    print("[pref] 86M steps/s per pair (app, by hand): " + ", ".join(
        f"({p['app']:.3f}, {p['base']:.3f})" for p in big["samples"]), file=sys.stderr)
    # The demo as a new user starts it: the demo DPO job, unchanged but its output folder.
    demo = demo_job(objective="dpo")
    demo.training_args.update({"output_dir": str(tmp / "out-demo"), "save_strategy": "no"})
    records = [r for r in app_run(demo).metrics() if r.get("rewards/margins") is not None]
    margins = [round(float(r["rewards/margins"]), 3) for r in records]
    print(f"[pref] demo DPO rewards/margins by step: {json.dumps(margins)}", file=sys.stderr)
    for problem in problems:
        print(f"[pref] {problem}", file=sys.stderr)
    rows = [row("DPO steps/s via the app (demo pairs, tiny model, CPU)", result, unit="steps/s",
                goal=f"ratio >= 0.98 ({tiny_steps} steps, batch {BATCH}, max length {MAX_LENGTH})"),
            row("DPO steps/s via the app, the faster half of the steps", calm_result, unit="steps/s",
                goal="ratio >= 0.98 (the same runs; steps other work slowed left out on both sides)"),
            row(f"DPO steps/s via the app ({params / 1e6:.0f}M model, CPU)", big, unit="steps/s",
                goal=f"ratio >= 0.98 ({steps} steps, batch {BATCH}, max length {MAX_LENGTH})"),
            {"name": "demo DPO rewards/margins, last 5 steps vs first 5 (40 steps, CPU)",
             "value": sum(margins[-5:]) / 5 if margins else None,
             "baseline": sum(margins[:5]) / 5 if margins else None, "ratio": None, "spread": None,
             "unit": "", "repeats": 1, "goal": "rising"}]
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(json.dumps(r))
