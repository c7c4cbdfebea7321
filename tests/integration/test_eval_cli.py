"""``gaudi-gui eval`` end to end on a real LoRA SFT run of the tiny model (trained once for the module):
base vs tuned on a prompt file and a references JSONL, the metrics against rouge-score and sacrebleu
called directly on the same answers, perplexity, an lm-eval multiple-choice task from a local folder run
offline for both models, the results in the run folder (and nothing else in it changed), and each bad
input refused with one clear line and exit 2."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from gaudi_gui.core import evaluation as ev
from gaudi_gui.core import protocol
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from tests import helpers

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("eval_run")]

TASKS = Path(__file__).resolve().parents[1] / "data" / "lmeval_task"


@dataclass
class Trained:
    root: Path
    run: Run
    refs: Path
    prompts: Path


def train_lora_run(model: Path, root: Path) -> Run:
    """A few steps of LoRA SFT at a high learning rate: the tuned answers differ from the base's."""
    alpaca = helpers.write_jsonl(root / "alpaca.jsonl", helpers.ALPACA)
    job = JobConfig(model=str(model), method="lora", name="eval-lora")
    job.dataset.source, job.dataset.kind, job.dataset.max_length = str(alpaca), "prompt_completion", 64
    job.dataset.columns = {"prompt": "{instruction}", "completion": "output"}
    job.dataset.eval = {"fraction": 0.25}
    job.training_args = {"use_cpu": True, "max_steps": 6, "logging_steps": 1, "save_strategy": "no",
                         "per_device_train_batch_size": 4, "learning_rate": 5e-2,
                         "output_dir": str(root / "out")}
    run = RunStore(root / "runs").create(job)
    env = {**os.environ, "GAUDI_GUI_HOME": str(root / "home"), "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    res = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.train", "--config", str(run.config_path)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert helpers.events(run)[-1]["type"] == "finished"
    run.update_status(state="finished")  # what the supervisor (not started here) writes at the end
    return run


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("eval")
    run = train_lora_run(tiny_model_dir, root)
    refs = helpers.write_jsonl(root / "refs.jsonl", [{"question": r["instruction"], "answer": r["output"]}
                                                     for r in helpers.ALPACA[:4]])
    prompts = helpers.write_jsonl(root / "prompts.jsonl", [{"question": "Say bye."},
                                                           {"question": "Name an animal."}])
    return Trained(root, run, refs, prompts)


def gaudi_gui(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=timeout)


def _tree(folder: Path, skip: str = "") -> dict[str, str]:
    """Every file under ``folder`` (but ``skip``) with the hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not (skip and skip in p.parts)}


def test_base_vs_tuned_on_prompts_references_perplexity_and_an_offline_lm_eval_task(trained: Trained) -> None:
    run = trained.run
    out = Path(run.job().output_dir)
    before_run, before_out = _tree(run.folder), _tree(out)
    res = gaudi_gui("eval", "--run", str(run.folder), "--prompts", str(trained.prompts),
                    "--data", str(trained.refs), "--prompt-column", "question", "--reference-column",
                    "answer", "--metrics", "exact_match,rouge,bleu,perplexity", "--tasks",
                    "gaudi_gui_tiny_mc", "--include-path", str(TASKS), "--max-new-tokens", "8", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    result: dict[str, Any] = json.loads(res.stdout)
    assert set(result) >= {"base", "tuned", "path", "answers"}

    # The results are in the run folder, and nothing else of the run or its output changed.
    path = Path(result["path"])
    assert path.parent == run.folder / "eval" and path.is_file()
    assert json.loads(path.read_text())["tuned"] == result["tuned"]
    assert _tree(run.folder, skip="eval") == before_run and _tree(out) == before_out
    assert not (out / "merged").exists()

    rows = [json.loads(line) for line in Path(result["answers"]).read_text().splitlines()]
    assert [(r["source"], r["prompt"]) for r in rows] == [
        ("prompts", "Say bye."), ("prompts", "Name an animal."),
        *[("references", r["instruction"]) for r in helpers.ALPACA[:4]]]
    # Training changed the answers (greedy and seeded: the same prompts, different models).
    assert sum(r["base"] != r["tuned"] for r in rows) >= 3, rows
    for r in rows:
        for name in ("base", "tuned"):
            assert r[f"{name}_ttft_s"] > 0 and r[f"{name}_tokens_per_s"] > 0 and r[f"{name}_new_tokens"] > 0

    # The metrics are the libraries' own, on the same answers.
    refs = [r for r in rows if r["source"] == "references"]
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    for name in ("base", "tuned"):
        answers, golds = [r[name] for r in refs], [r["reference"] for r in refs]
        metrics = result[name]["metrics"]
        rouge = [scorer.score(g, a)["rougeL"].fmeasure for a, g in zip(answers, golds, strict=True)]
        assert math.isclose(metrics["rougeL"], sum(rouge) / len(rouge), abs_tol=1e-9)
        assert math.isclose(metrics["bleu"], sacrebleu.corpus_bleu(answers, [golds]).score, abs_tol=1e-9)
        assert metrics["exact_match"] == sum(a.strip() == g.strip() for a, g in zip(answers, golds,
                                                                                      strict=True)) / 4
        for r in refs:
            direct = sacrebleu.sentence_bleu(r[name], [r["reference"]]).score
            assert math.isclose(r[f"{name}_scores"]["bleu"], direct)
        assert metrics["perplexity"] > 1
        task = result[name]["tasks"]["gaudi_gui_tiny_mc"]
        assert task["metric"] == "acc" and 0 <= task["score"] <= 1 and task["stderr"] is not None
        assert task["sample_len"] == 6  # every row of the local JSONL
    assert result["base"]["metrics"]["perplexity"] != result["tuned"]["metrics"]["perplexity"]
    assert ev.latest_result(run)["path"] == str(path)  # type: ignore[index]
    assert "rougeL" in ev.latest_scores(run)


def test_events_stream_progress_and_the_result(trained: Trained) -> None:
    res = gaudi_gui("eval", "--run", str(trained.run.folder), "--prompt", "Say bye.", "--max-new-tokens",
                    "4", "--events")
    assert res.returncode == 0, res.stderr[-2000:]
    events = [protocol.decode(line) for line in res.stdout.splitlines()]
    kinds = [e["type"] for e in events if e]
    assert kinds[0] == "eval_started" and kinds[-1] == "result"
    progress = [(e["done"], e["total"]) for e in events if e and e["type"] == "progress"]
    assert progress[0] == (0, 2) and progress[-1] == (2, 2)


def test_perplexity_on_the_runs_eval_split_without_a_references_file(trained: Trained) -> None:
    res = gaudi_gui("eval", "--run", str(trained.run.folder), "--metrics", "perplexity", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(res.stdout)
    for name in ("base", "tuned"):
        assert result[name]["perplexity_on"] == "the run's eval split (2 rows)"
        assert result[name]["chat_template"] is True  # prompt/completion rows, a tokenizer with a template
    assert result["base"]["metrics"]["perplexity"] != result["tuned"]["metrics"]["perplexity"]


def test_a_model_and_an_adapter_without_a_run(trained: Trained, tmp_path: Path) -> None:
    adapter = Path(trained.run.job().output_dir) / "adapter"
    res = gaudi_gui("eval", "--model", trained.run.job().model, "--adapter", str(adapter), "--prompt",
                    "Say bye.", "--max-new-tokens", "4", "--output", str(tmp_path / "evals"), "--json",
                    "--chat", "on")  # without a run, nothing says how it trained: ask for the template
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(res.stdout)
    assert Path(result["path"]).parent == tmp_path / "evals"
    rows = [json.loads(line) for line in Path(result["answers"]).read_text().splitlines()]
    # The same answers as the run's own evaluation of the same prompt (same weights, greedy, seeded).
    again = gaudi_gui("eval", "--run", str(trained.run.folder), "--prompt", "Say bye.", "--max-new-tokens",
                      "4", "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    same = [json.loads(line) for line in Path(json.loads(again.stdout)["answers"]).read_text().splitlines()]
    assert [(r["base"], r["tuned"]) for r in rows] == [(r["base"], r["tuned"]) for r in same]


def test_bad_inputs_are_refused_with_one_line_and_exit_2(trained: Trained, tmp_path: Path) -> None:
    run = str(trained.run.folder)
    (tmp_path / "empty.jsonl").write_text("")
    cases = [
        (["--data", str(trained.refs)],
         "'prompt' is not a column of refs.jsonl (its columns: question, answer)"),
        (["--data", str(tmp_path / "empty.jsonl")], "empty.jsonl is empty"),
        (["--prompt", "hi", "--tasks", "no_such_task_here", "--include-path", str(TASKS)],
         "unknown lm-eval task(s): no_such_task_here"),
        (["--prompt", "hi", "--tasks", "gaudi_gui_needs_hub", "--include-path", str(TASKS)],
         "lm-eval task gaudi_gui_needs_hub needs the network"),
        (["--prompt", "hi", "--metrics", "bleu,accuracy"], "unknown metric(s) accuracy"),
    ]
    for extra, needle in cases:
        res = gaudi_gui("eval", "--run", run, *extra, timeout=120)
        assert res.returncode == 2, (extra, res.stderr)
        assert needle in res.stderr and "Traceback" not in res.stderr, (extra, res.stderr)
        assert res.stderr.strip().count("\n") == 0, res.stderr
    # A LoRA run that saved no adapter (stopped before its end, say).
    job = trained.run.job()
    job.training_args = {**job.training_args, "output_dir": str(tmp_path / "empty-out")}
    bare = RunStore(tmp_path / "runs").create(job)
    res = gaudi_gui("eval", "--run", str(bare.folder), "--prompt", "hi", timeout=60)
    assert res.returncode == 2 and "LORA run with no adapter" in res.stderr, res.stderr
    # Neither a run nor a model.
    res = gaudi_gui("eval", "--prompt", "hi", timeout=60)
    assert res.returncode == 2 and "give a run (--run) or a model (--model)" in res.stderr
    assert not (trained.run.folder / "eval").exists() or all(
        p.suffix in (".json", ".jsonl") for p in (trained.run.folder / "eval").iterdir())


def test_a_model_that_cannot_load_exits_1(trained: Trained, tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"')
    res = gaudi_gui("eval", "--model", str(broken), "--base", str(broken), "--prompt", "hi",
                    "--output", str(tmp_path / "evals"), timeout=120)
    assert res.returncode == 1, res.stderr
    assert "cannot load" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "evals").exists()
