"""Instruction and chat fine-tuning end to end on the tiny model with a real chat template (Qwen2.5's,
as TRL ships it): an alpaca file as prompt_completion with LoRA and an eval fraction, a sharegpt file as
conversational with an eval file; the loss mask of both as the render preview shows it and as the
training run prepared it; eval loss and perplexity in events; the adapter loaded by the runner's worker
over its base; "Try in runner" and "Merge and save" clicked. (The text kind trains through the same
SFTTrainer path in test_train_job.py.)

Two runs are trained once per module, side by side, and every test reads them."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from gaudi_gui.core import generation, protocol
from gaudi_gui.core.generation import GenerationParams, LoadOptions
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.core.sft import runner_target
from gaudi_gui.ui.training_runs import RunsTable
from tests import helpers

# Its module fixture (real children) runs once: under xdist every test here goes to one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sft_runs")]

SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Hi, who are you?"}, {"from": "gpt", "value": "A model."}]},
    {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Sky?"},
                       {"from": "gpt", "value": "Blue."}, {"from": "human", "value": "Grass?"},
                       {"from": "gpt", "value": "Green."}]},
    {"conversations": [{"from": "human", "value": "Two plus two?"}, {"from": "gpt", "value": "Four."}]},
    {"conversations": [{"from": "human", "value": "Say yes."}, {"from": "gpt", "value": "Yes."}]},
]


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "GAUDI_GUI_HOME": str(home), "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


@dataclass
class Trained:
    root: Path
    model: Path
    store: RunStore
    pc: Run
    cv: Run
    jobs: dict[str, JobConfig]


@pytest.fixture(scope="module")
def trained(chat_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("sft")
    home = root / "home"
    home.mkdir()
    model = chat_model_dir
    alpaca = helpers.write_jsonl(root / "alpaca.jsonl", helpers.ALPACA)
    share = helpers.write_jsonl(root / "sharegpt.jsonl", SHAREGPT)
    common = {"use_cpu": True, "max_steps": 4, "logging_steps": 1, "save_strategy": "no",
              "per_device_train_batch_size": 2, "learning_rate": 1e-3}
    pc = JobConfig(model=str(model), method="lora", name="alpaca")
    pc.dataset.source, pc.dataset.kind, pc.dataset.max_length = str(alpaca), "prompt_completion", 128
    pc.dataset.columns = {"prompt": "{instruction}\n\n{input}", "completion": "output"}
    pc.dataset.eval = {"fraction": 0.25}
    pc.training_args = {**common, "output_dir": str(root / "out-pc"), "eval_strategy": "steps",
                        "eval_steps": 2}
    cv = JobConfig(model=str(model), method="full", name="sharegpt")
    cv.dataset.source, cv.dataset.kind, cv.dataset.max_length = str(share), "conversational", 128
    cv.dataset.columns = {"messages": "conversations"}
    cv.dataset.eval = {"source": str(share)}
    cv.training_args = {**common, "output_dir": str(root / "out-cv")}
    assert pc.validate() == [] and cv.validate() == []
    store = RunStore(root / "runs")
    runs = [store.create(pc), store.create(cv)]

    def train(run: Run) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gaudi_gui.workers.train", "--config",
                               str(run.config_path)], capture_output=True, text=True, timeout=240,
                              env=_env(home))

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(train, runs))
    for run, res in zip(runs, results, strict=True):
        assert res.returncode == 0, (run.name, res.stderr[-3000:])
    return Trained(root, model, store, runs[0], runs[1], {"pc": pc, "cv": cv})


def _preview(job: JobConfig, path: Path) -> dict[str, Any]:
    job.save(path)
    res = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.sft_data", "--config", str(path),
                          "--rows", "2"], capture_output=True, text=True, timeout=120,
                         env=_env(path.parent))
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def previews(trained: Trained) -> dict[str, dict[str, Any]]:
    with ThreadPoolExecutor(2) as pool:
        pc, cv = pool.map(lambda k: _preview(trained.jobs[k], trained.root / f"preview-{k}.json"),
                          ["pc", "cv"])
    return {"pc": pc, "cv": cv}


def test_alpaca_prompt_completion_lora_records_eval_loss_and_saves_the_adapter(trained: Trained) -> None:
    events = helpers.events(trained.pc)
    ready = next(e for e in events if e["type"] == "dataset_ready")
    assert ready["kind"] == "prompt_completion" and ready["rows"] == 6 and ready["eval_rows"] == 2
    assert 0 < ready["first_labelled"] < ready["first_tokens"]
    evals = [e for e in events if e["type"] == "metrics" and e.get("eval_loss") is not None]
    assert [e["step"] for e in evals] == [2, 4]
    for e in evals:
        assert math.isclose(e["eval_perplexity"], math.exp(e["eval_loss"]), rel_tol=1e-3)
    end = events[-1]
    assert end["type"] == "finished" and end["final_dir"].endswith("adapter")
    out = Path(trained.pc.job().output_dir)
    assert (out / "adapter" / "adapter_config.json").is_file() and not (out / "final").exists()
    assert runner_target(out) == out / "adapter"


def test_sharegpt_file_trains_with_an_eval_file(trained: Trained) -> None:
    events = helpers.events(trained.cv)
    ready = next(e for e in events if e["type"] == "dataset_ready")
    assert ready["kind"] == "conversational" and ready["rows"] == 4 and ready["eval_rows"] == 4
    assert 0 < ready["first_labelled"] < ready["first_tokens"]
    # No eval schedule: one evaluation of the trained model at the end.
    evals = [e for e in events if e.get("eval_loss") is not None]
    assert len(evals) == 1 and evals[0]["step"] == 4
    assert events[-1]["type"] == "finished"
    assert (Path(trained.cv.job().output_dir) / "final" / "config.json").is_file()


def test_loss_mask_labels_only_answers(trained: Trained, previews: dict[str, dict[str, Any]]) -> None:
    pc, cv = previews["pc"], previews["cv"]
    assert pc["ok"] and cv["ok"], (pc, cv)
    assert pc["loss"] == "completion tokens only" and cv["loss"] == "assistant tokens only"
    assert cv["training_template"]  # TRL's training version of Qwen2.5's template
    # The preview's first row is the training run's first row (same seeded split), same mask.
    for key, run in (("pc", trained.pc), ("cv", trained.cv)):
        ready = next(e for e in helpers.events(run) if e["type"] == "dataset_ready")
        first = previews[key]["rows"][0]
        assert (first["labelled"], first["tokens"]) == (ready["first_labelled"], ready["first_tokens"])
    completions = {r["output"] for r in helpers.ALPACA}
    for row in pc["rows"]:
        labelled = [t for t, on in row["segments"] if on]
        context = "".join(t for t, on in row["segments"] if not on)
        assert len(labelled) == 1 and labelled[0].removesuffix("<|im_end|>\n") in completions
        assert "<|im_start|>user\n" in context and "<|im_start|>assistant\n" in context
    answers = {m["value"] for c in SHAREGPT for m in c["conversations"] if m["from"] == "gpt"}
    asked = {m["value"] for c in SHAREGPT for m in c["conversations"] if m["from"] != "gpt"}
    for row in cv["rows"]:
        said = "".join(t for t, on in row["segments"] if on)
        assert any(a in said for a in answers)
        assert not any(q in said for q in asked)
        assert "<|im_start|>user" in "".join(t for t, on in row["segments"] if not on)


def test_bad_column_mapping_names_the_available_columns(trained: Trained, tmp_path: Path) -> None:
    job = JobConfig.from_dict(trained.jobs["pc"].to_dict())
    job.dataset.columns = {"prompt": "question", "completion": "output"}
    job.training_args = {**job.training_args, "output_dir": str(tmp_path / "out")}
    problems = dict(job.validate())
    assert "instruction, input, output" in problems["dataset.columns.prompt"]
    # The worker refuses it the same way, before loading anything.
    store = RunStore(tmp_path / "runs")
    run = store.create(job)
    res = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.train", "--config", str(run.config_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    error = next(e for e in helpers.events(run) if e["type"] == "error")
    assert "'question'" in error["message"] and "instruction, input, output" in error["message"]


def test_runner_worker_loads_base_plus_adapter_unmerged(trained: Trained) -> None:
    adapter = Path(trained.pc.job().output_dir) / "adapter"
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui.workers.generate"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(generation.load_command(LoadOptions(model=str(adapter))) + "\n")
        proc.stdin.write(generation.generate_command(
            GenerationParams(do_sample=False, max_new_tokens=4, min_new_tokens=4), prompt="Say") + "\n")
        proc.stdin.flush()
        seen: list[dict[str, Any]] = []
        # Shutdown only after the answer: a shutdown cancels what is still queued.
        for line in proc.stdout:
            message = protocol.decode(line)
            if message is not None:
                seen.append(message)
                if message["type"] in ("finished", "error", "exiting", "eof"):
                    break
        proc.stdin.write(generation.shutdown_command() + "\n")
        proc.stdin.close()
        assert proc.wait(60) == 0
        loaded = next(m for m in seen if m["type"] in ("loaded", "error"))
        assert loaded["type"] == "loaded", loaded
        assert loaded["adapter"] == str(adapter) and loaded["base"] == str(trained.model)
        done = next(m for m in seen if m["type"] in ("finished", "error") and m is not loaded)
        assert done["type"] == "finished" and done["stats"]["tokens"] == 4
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(20)


def test_try_in_runner_and_merge_and_save_clicked(qtbot, trained: Trained) -> None:
    table = RunsTable(trained.store)
    qtbot.addWidget(table)
    names = [table.table.item(r, 0).text() for r in range(table.table.rowCount())]
    table.select_row(names.index(trained.pc.name))
    with qtbot.waitSignal(table.load_in_runner_requested, timeout=2000) as asked:
        qtbot.mouseClick(table.buttons["Try in runner"], Qt.MouseButton.LeftButton)
    assert runner_target(asked.args[0].output_dir()).name == "adapter"
    with qtbot.waitSignal(table.merge_finished, timeout=120000) as merged:
        qtbot.mouseClick(table.buttons["Merge and save"], Qt.MouseButton.LeftButton)
        assert not table.buttons["Merge and save"].isEnabled()
    ok, where = merged.args
    assert ok, where
    assert (Path(where) / "config.json").is_file() and not (Path(where) / "adapter_config.json").exists()
    assert table.status.text().startswith("merged model saved in")
    assert runner_target(Path(where).parent) == Path(where)  # merged/ before the adapter now
    shutil.rmtree(where)
    # A full run has no adapter: said so, nothing started.
    table.select_row(names.index(trained.cv.name))
    qtbot.mouseClick(table.buttons["Merge and save"], Qt.MouseButton.LeftButton)
    assert "no LoRA adapter" in table.status.text() and not table.merger.is_running()


def test_cli_train_refuses_a_bad_mapping_in_one_line(tmp_path: Path) -> None:
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out")})
    data = helpers.write_jsonl(tmp_path / "alpaca.jsonl", helpers.ALPACA)
    job.dataset.source, job.dataset.kind = str(data), "prompt_completion"
    job.dataset.columns = {"prompt": "question", "completion": "output"}
    job.save(tmp_path / "job.json")
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
                          "--runs-dir", str(tmp_path / "runs"), "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, env=_env(tmp_path))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == ["gaudi-gui train: dataset.columns.prompt: the dataset has no column "
                                       "'question' for prompt; its columns: instruction, input, output"]
    assert not (tmp_path / "runs").exists()


def test_hub_split_as_the_eval_split(chat_model_dir: Path, tmp_path: Path) -> None:
    """A Hub dataset's own split as the eval split: a dataset repository laid out as on the Hub (here a
    local folder, read by datasets the same way, offline), its test split held out."""
    repo = tmp_path / "repo"
    repo.mkdir()
    helpers.write_jsonl(repo / "train.jsonl", helpers.ALPACA[:6])
    helpers.write_jsonl(repo / "test.jsonl", helpers.ALPACA[6:])
    job = JobConfig(model=str(chat_model_dir), training_args={"output_dir": str(tmp_path / "out")})
    job.dataset.source, job.dataset.format, job.dataset.max_length = str(repo), "hub", 128
    job.dataset.kind = "prompt_completion"
    job.dataset.columns = {"prompt": "instruction", "completion": "output"}
    job.dataset.eval = {"split": "test"}
    assert job.validate() == []
    wrong = JobConfig.from_dict(job.to_dict())
    wrong.dataset.eval = {"split": "tset"}
    with ThreadPoolExecutor(2) as pool:
        good, bad = pool.map(lambda j: _preview(j[0], tmp_path / j[1]),
                             [(job, "good.json"), (wrong, "bad.json")])
    assert good["ok"], good
    assert (good["train_rows"], good["eval_rows"]) == (6, 2)
    assert not bad["ok"] and "tset" in bad["message"] and "test" in bad["message"]
