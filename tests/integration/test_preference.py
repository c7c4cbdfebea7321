"""Preference tuning end to end (issue 41): real TRL trainers (DPOTrainer, ORPOTrainer, KTOTrainer) on
the demo model, each started from a job file through ``gaudi-gui train``; their reward metrics in the
run's metrics under TRL's names; DPO's margins rising over 40 steps on the built-in preference set;
Stop and Resume keeping the objective; a file without what the objective needs refused with exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gaudi_gui.core.jobconfig import JobConfig, align_job, demo_job
from gaudi_gui.core.runstore import Run, RunStore, checkpoint_complete
from tests.helpers import children_get_sigint, steps, wait_until, write_jsonl

pytestmark = pytest.mark.slow


def _train(config: Path, runs: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(config), "--runs-dir",
                           str(runs), "--device", "cpu"], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"})


def _job(tmp_path: Path, objective: str, max_steps: int) -> Path:
    """The demo job of ``objective``: the demo model on the built-in preference set."""
    job = demo_job(objective=objective)
    job.training_args.update({"max_steps": max_steps, "output_dir": str(tmp_path / f"out-{objective}"),
                              "save_strategy": "no", "use_cpu": True})
    job.dataset.max_length = 32
    path = tmp_path / f"{objective}.json"
    job.save(path)
    return path


_ADAPTER = """
import sys
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
get_peft_model(model, LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM")).save_pretrained(sys.argv[2])
"""


def _aligned(tmp_path: Path, model: Path) -> Path:
    """"Align with preferences…"'s job for a LoRA SFT run of the demo: DPO from its adapter."""
    adapter = tmp_path / "sft-out" / "adapter"
    subprocess.run([sys.executable, "-c", _ADAPTER, str(model), str(adapter)], check=True, timeout=120,
                   capture_output=True)
    sft_job = JobConfig(method="lora", name="sft", training_args={"output_dir": str(tmp_path / "sft-out")})
    job = align_job(sft_job, str(adapter), adapter=True, sft_only=("packing",))
    # The demo's SFT run: its alignment is the preference demo (the built-in pairs, 40 steps).
    assert (job.objective, job.method, job.model, job.dataset.source) == ("dpo", "lora", str(adapter),
                                                                          "builtin:demo")
    assert job.training_args["max_steps"] == 40 and "output_dir" not in job.training_args
    job.training_args.update({"max_steps": 3, "logging_steps": 1, "output_dir": str(tmp_path / "out-lora"),
                              "save_strategy": "no", "use_cpu": True, "per_device_train_batch_size": 2})
    job.dataset.max_length = 32
    path = tmp_path / "aligned.json"
    job.save(path)
    return path


def test_dpo_orpo_kto_train_from_a_job_file_and_dpo_margins_rise(tmp_path: Path, demo_model: Path) -> None:
    configs = {"dpo": _job(tmp_path, "dpo", 40), "orpo": _job(tmp_path, "orpo", 3),
               "kto": _job(tmp_path, "kto", 3), "dpo-adapter": _aligned(tmp_path, demo_model)}
    assert json.loads(configs["dpo"].read_text())["objective"] == "dpo"
    with ThreadPoolExecutor(4) as pool:  # real runs side by side: the suite's time, not 4x
        done = dict(zip(configs, pool.map(lambda o: _train(configs[o], tmp_path / f"runs-{o}"), configs),
                        strict=True))
    # LoRA on LoRA: the SFT adapter trains on, and TRL's reference is its frozen copy (the SFT model).
    lora = done.pop("dpo-adapter")
    assert lora.returncode == 0, lora.stderr[-3000:]
    (folder,) = [r.folder for r in RunStore(tmp_path / "runs-dpo-adapter").runs()]
    log = Run(folder).log_path.read_text()
    assert "starting from the adapter" in log and "the reference is that SFT model" in log
    assert (tmp_path / "out-lora" / "adapter" / "adapter_config.json").is_file()
    assert all("rewards/margins" in r for r in Run(folder).metrics() if r.get("loss") is not None)
    metrics = {}
    for objective, res in done.items():
        assert res.returncode == 0, f"{objective}: {res.stderr[-3000:]}"
        (folder,) = [r.folder for r in RunStore(tmp_path / f"runs-{objective}").runs()]
        run = Run(folder)
        assert run.user_job().objective == objective
        records = [r for r in run.metrics() if r.get("loss") is not None]
        # KTO's batches of unpaired rows may hold only desirable or only undesirable answers: TRL
        # logs the side it saw (and its KL estimate) at each step.
        need = ("kl",) if objective == "kto" else ("rewards/chosen", "rewards/margins")
        assert records and all(all(k in r for k in need) for r in records), records[:1]
        assert any("rewards/chosen" in r for r in records)
        metrics[objective] = records
        ready = next(e for e in run.events() if e["type"] == "dataset_ready")
        assert ready["kind"] == objective and ready["columns"] == ["prompt", "chosen", "rejected"]
        assert "took columns prompt, chosen, rejected (plain text)" in run.log_path.read_text()
    assert "rewards/accuracies" in metrics["dpo"][0] and "log_odds_ratio" in metrics["orpo"][0]
    assert len(metrics["orpo"]) == 3 and len(metrics["kto"]) == 3
    margins = [r["rewards/margins"] for r in metrics["dpo"]]
    assert len(margins) == 40
    first, last = sum(margins[:5]) / 5, sum(margins[-5:]) / 5
    # Chosen answers are right, rejected ones unrelated: the margin grows well past its start.
    assert last > first + 1.0 and last > 1.0, margins
    assert sum(r["rewards/accuracies"] for r in metrics["dpo"][-5:]) / 5 >= 0.9


@pytest.mark.usefixtures("demo_model")
def test_stop_and_resume_keep_the_objective(tmp_path: Path) -> None:
    config = _job(tmp_path, "dpo", 100000)
    job = JobConfig.load(config)
    job.training_args.update({"save_strategy": "steps", "save_steps": 100000})
    job.save(config)
    with children_get_sigint():
        cli = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "train", "--config", str(config),
                                "--runs-dir", str(tmp_path / "runs"), "--device", "cpu"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def reached() -> bool:
            folders = list((tmp_path / "runs").glob("*/status.json"))
            return bool(folders) and steps(folders[0].parent) >= 2
        assert wait_until(reached, 240), "no two steps in 240 s"
        cli.send_signal(signal.SIGINT)
        _out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err[-3000:]
    (folder,) = [r.folder for r in RunStore(tmp_path / "runs").runs()]
    run = Run(folder)
    status = run.status()
    assert status.state == "stopped" and checkpoint_complete(status.checkpoint), status
    # Resume as the Runs list does: the run's own job, from its checkpoint.
    again = run.user_job()
    assert again.objective == "dpo"
    again.resume_from_checkpoint = status.checkpoint
    again.training_args["max_steps"] = status.step + 2
    path = tmp_path / "resume.json"
    again.save(path)
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(path), "--runs-dir",
                          str(tmp_path / "runs"), "--device", "cpu", "--resumed-from", str(folder)],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    (resumed,) = [r for r in RunStore(tmp_path / "runs").runs() if r.folder != folder]
    assert resumed.user_job().objective == "dpo"
    finished = next(e for e in resumed.events() if e["type"] == "finished")
    assert finished["objective"] == "dpo" and finished["global_step"] == status.step + 2
    after = [r for r in resumed.metrics() if r.get("loss") is not None]
    assert [r["step"] for r in after] == [status.step + 1, status.step + 2]
    assert all("rewards/margins" in r for r in after)


def test_a_file_without_what_the_objective_needs_is_refused_with_exit_2(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Q?", "chosen": "A."}] * 3)
    job = JobConfig(objective="dpo", training_args={"output_dir": str(tmp_path / "out")})
    job.dataset.source = str(data)
    job.save(tmp_path / "dpo.json")
    res = _train(tmp_path / "dpo.json", tmp_path / "runs", 120)
    assert res.returncode == 2, res.stderr
    assert "DPO needs a 'rejected' column; this file has prompt, chosen" in res.stderr
    job.objective = "kto"
    job.save(tmp_path / "kto.json")
    res = _train(tmp_path / "kto.json", tmp_path / "runs", 120)
    assert res.returncode == 2 and "KTO needs a 'rejected' column" in res.stderr, res.stderr
    bad = tmp_path / "ppo.json"
    bad.write_text(json.dumps({**job.to_dict(), "objective": "ppo"}))
    res = _train(bad, tmp_path / "runs", 120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"gaudi-gui train: {bad}: unknown objective 'ppo': choose one of sft, dpo, orpo, kto"]
    assert "Traceback" not in res.stderr and not (tmp_path / "runs").exists()
