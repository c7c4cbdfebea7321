"""Evaluate speed: rows/s of the reference evaluation through the app (``gaudi-gui eval --run RUN --data
REFS``: the command, its checks, the worker child, events, results written to the run folder) against
the same work written by hand in one process (load the base, generate every row greedily through the
chat template as the run trained, score with rouge-score and sacrebleu, apply the LoRA adapter,
generate and score again).

Both sides are timed end to end from outside (process start to exit, model loads included) on the
same LoRA run of the tiny demo model (trained once here, a few steps), the same rows and the same
generation settings; rows/s counts each row once per model. The two sides alternate
(bench/harness.py), and the ratio is the median of the per-pair ratios."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_training import _ensure_model
from bench.harness import interleaved, row
from gaudi_gui.core import paths
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore

MAX_NEW_TOKENS = 32

#: What a user would write: one process, generate and the metrics libraries called directly.
BY_HAND = r'''
import json, sys
import sacrebleu, torch
from rouge_score import rouge_scorer
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

base, adapter, refs, new_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [json.loads(line) for line in open(refs)]
tok = AutoTokenizer.from_pretrained(adapter)  # the tokenizer training saved (its chat template)
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
scorer = rouge_scorer.RougeScorer(["rougeL"])


def evaluate():
    answers = []
    for r in rows:
        text = tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        set_seed(0)
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        answers.append(tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    golds = [r["reference"] for r in rows]
    rouge = [scorer.score(g, a)["rougeL"].fmeasure for a, g in zip(answers, golds)]
    bleu = [sacrebleu.sentence_bleu(a, [g]).score for a, g in zip(answers, golds)]
    return {"rougeL": sum(rouge) / len(rouge), "bleu": sacrebleu.corpus_bleu(answers, [golds]).score,
            "exact_match": sum(a.strip() == g.strip() for a, g in zip(answers, golds)) / len(rows)}


result = {"base": evaluate()}
model.load_adapter(adapter)
result["tuned"] = evaluate()
print(json.dumps(result))
'''


def _train(tmp: Path, model_dir: str) -> Path:
    from tests.helpers import ALPACA
    data = tmp / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ALPACA))
    job = JobConfig(model=model_dir, method="lora", name="bench-eval")
    job.dataset.source, job.dataset.kind, job.dataset.max_length = str(data), "prompt_completion", 64
    job.dataset.columns = {"prompt": "{instruction}", "completion": "output"}
    job.training_args = {"use_cpu": True, "max_steps": 6, "logging_steps": 1, "save_strategy": "no",
                         "per_device_train_batch_size": 4, "learning_rate": 5e-2,
                         "output_dir": str(tmp / "out")}
    run = RunStore(tmp / "runs").create(job)
    subprocess.run([sys.executable, "-m", "gaudi_gui.workers.train", "--config", str(run.config_path)],
                   check=True, capture_output=True, timeout=600)
    run.update_status(state="finished")
    return run.folder


def run(quick: bool = False) -> list[dict[str, Any]]:
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    tmp = Path(tempfile.mkdtemp(prefix="gaudi-gui-bench-eval-"))
    _ensure_model(tmp)
    model_dir = str(os.environ.get("GAUDI_GUI_DEMO_MODEL_DIR") or paths.demo_model_dir())
    folder = _train(tmp, model_dir)
    from tests.helpers import ALPACA
    count = 48 if quick else 160
    rows = [{"prompt": ALPACA[i % len(ALPACA)]["instruction"] + f" ({i})",
             "reference": ALPACA[i % len(ALPACA)]["output"]} for i in range(count)]
    refs = tmp / "refs.jsonl"
    refs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = tmp / "eval_by_hand.py"
    script.write_text(BY_HAND)
    adapter = str(tmp / "out" / "adapter")
    env = {**os.environ, "GAUDI_GUI_HOME": str(tmp / "home")}
    scores: dict[str, Any] = {}

    def app_once() -> float:
        started = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "gaudi_gui", "eval", "--run", str(folder), "--data",
                              str(refs), "--metrics", "exact_match,rouge,bleu", "--max-new-tokens",
                              str(MAX_NEW_TOKENS), "--json"], capture_output=True, text=True, timeout=900,
                             env=env, check=True)
        elapsed = time.perf_counter() - started
        scores["app"] = json.loads(res.stdout)["tuned"]["metrics"]
        return 2 * count / elapsed

    def by_hand_once() -> float:
        started = time.perf_counter()
        argv = [sys.executable, str(script), model_dir, adapter, str(refs), str(MAX_NEW_TOKENS)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, check=True)
        elapsed = time.perf_counter() - started
        scores["hand"] = json.loads(res.stdout.strip().splitlines()[-1])["tuned"]
        return 2 * count / elapsed

    result = interleaved(app_once, by_hand_once, 2 if quick else 5, warmup=0 if quick else 1)
    same = all(abs(scores["app"][k] - scores["hand"][k]) < 1e-9 for k in ("rougeL", "bleu", "exact_match"))
    if not same:
        print(f"[eval] the two sides scored differently: {scores}", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    return [row("eval rows/s via the app (references, base + LoRA tuned, tiny model, CPU)", result,
                unit="rows/s", goal=f"ratio >= 0.95 ({count} rows x 2 models, {MAX_NEW_TOKENS} new tokens, "
                                    f"end to end; same scores: {same})")]


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(json.dumps(r))
