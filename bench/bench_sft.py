"""Instruction fine-tuning speed: an SFT run (prompt_completion, the tiny demo model, CPU) started
through the app's launch path (``TrainingJob.start`` on this machine: run folder, generated accelerate config,
``accelerate launch -m gaudi_gui.workers.train``, events, the metrics and stop callbacks) against the
same SFTTrainer training written by hand as a plain script and run with ``accelerate launch``.

Both sides train the same rows with the same effective arguments (the app keeps TrainingArguments'
defaults where SFTConfig changes them, so the script sets those values explicitly) and measure steps/s
the same way: between the first and the last logged step, so start-up is not in the figure. The two
sides alternate (bench/harness.py), and the ratio is the median of the per-pair ratios."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_training import _ensure_model, _throughput, _wait
from bench.harness import interleaved, row
from gaudi_gui.core import paths
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore

MAX_LENGTH = 96
BATCH = 2

#: The SFTTrainer script a user would write: the rows as prompt/completion chat messages, SFTConfig
#: with the values the app's job resolves to, one JSON line per logged step.
BY_HAND = r'''
import json, sys, time
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer

model_dir, data, out, steps, metrics = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir)
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token
rows = load_dataset("json", data_files=data, split="train")
rows = rows.map(lambda r: {"prompt": [{"role": "user", "content": r["question"]}],
                           "completion": [{"role": "assistant", "content": r["answer"]}]},
                remove_columns=rows.column_names)


class Log(TrainerCallback):
    def on_train_begin(self, args, state, control, **kw):
        self.t0 = time.time()

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            with open(metrics, "a") as fh:
                fh.write(json.dumps({"step": state.global_step, "loss": float(logs["loss"]),
                                     "elapsed": time.time() - self.t0}) + "\n")


config = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH, logging_steps=1,
                   save_strategy="no", use_cpu=True, report_to="none", max_length=MAX_LENGTH,
                   learning_rate=5e-5, bf16=False, gradient_checkpointing=False, enable_jit_checkpoint=False)
SFTTrainer(model=model, args=config, train_dataset=rows, processing_class=tokenizer,
           callbacks=[Log()]).train()
'''.replace("BATCH", str(BATCH)).replace("MAX_LENGTH", str(MAX_LENGTH))


def _data(folder: Path, n: int = 64) -> Path:
    path = folder / "qa.jsonl"
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"question": f"What is {i} plus {i}?", "answer": f"{i} plus {i} is {2 * i}."})
                     + "\n")
    return path


def _job(model: str, data: Path, out: Path, steps: int) -> JobConfig:
    job = JobConfig(model=model, name="bench-sft",
                    training_args={"output_dir": str(out), "max_steps": steps,
                                   "per_device_train_batch_size": BATCH, "logging_steps": 1,
                                   "save_strategy": "no"})
    job.dataset.source, job.dataset.kind, job.dataset.max_length = str(data), "prompt_completion", MAX_LENGTH
    job.dataset.columns = {"prompt": "question", "completion": "answer"}
    return job


def run(quick: bool = False) -> list[dict[str, Any]]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    from PySide6.QtWidgets import QApplication

    from gaudi_gui.core.placement import Placement
    from gaudi_gui.services.training_job import TrainingJob

    app = QApplication.instance() or QApplication([])
    tmp = Path(tempfile.mkdtemp(prefix="gaudi-gui-bench-sft-"))
    _ensure_model(tmp)
    model_dir = str(os.environ.get("GAUDI_GUI_DEMO_MODEL_DIR") or paths.demo_model_dir())
    data = _data(tmp)
    script = tmp / "sft_by_hand.py"
    script.write_text(BY_HAND)
    # The tiny model trains ~80 steps/s on a CPU core: enough steps for a window of seconds.
    steps = 300 if quick else 600
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    counter = [0]
    problems: list[str] = []

    def app_once() -> float:
        counter[0] += 1
        job = TrainingJob(Placement.local(), RunStore(tmp / f"app-{counter[0]}"))
        done: list[Any] = []
        job.finished.connect(lambda *a: done.append(a))
        job.start(_job(paths.DEMO_MODEL_ID, data, tmp / f"out-app-{counter[0]}", steps), device="cpu")
        _wait(app, lambda: bool(done), 900)
        run_ = job.run
        assert run_ is not None, job.summary
        if not done or done[0][1] != "finished":
            problems.append(f"app run {counter[0]}: {done[0] if done else 'did not end'}")
        return _throughput(run_.events_path)

    def by_hand_once() -> float:
        counter[0] += 1
        metrics = tmp / f"hand-{counter[0]}.jsonl"
        argv = [accelerate, "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", str(script), model_dir, str(data),
                str(tmp / f"out-hand-{counter[0]}"), str(steps), str(metrics)]
        subprocess.run(argv, capture_output=True, timeout=900, check=True, cwd=tmp)
        return _throughput(metrics)

    result = interleaved(app_once, by_hand_once, 2 if quick else 5, warmup=0 if quick else 1)
    for problem in problems:
        print(f"[sft] {problem}", file=sys.stderr)
    rows = [row("SFT steps/s via the app (prompt_completion, tiny model, CPU)", result, unit="steps/s",
                goal=f"ratio >= 0.98 ({steps} steps, batch {BATCH}, max length {MAX_LENGTH})")]
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(json.dumps(r))
