"""``gaudi-gui eval --host``: the evaluation runs on the host through core.placement (under the guard),
its results land in the host's run folder, bad input is refused with the host's message and exit 2,
and nothing is left running on the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore
from tests import helpers
from tests.remote.conftest import SshHost


def test_eval_on_a_host_keeps_its_results_in_the_hosts_run_folder(ssh_host: SshHost, tiny_model_dir: Path,
                                                                    tmp_path: Path) -> None:
    alpaca = helpers.write_jsonl(tmp_path / "alpaca.jsonl", helpers.ALPACA)
    job = JobConfig(model=str(tiny_model_dir), method="lora", name="remote-eval")
    job.dataset.source, job.dataset.kind, job.dataset.max_length = str(alpaca), "prompt_completion", 64
    job.dataset.columns = {"prompt": "{instruction}", "completion": "output"}
    job.training_args = {"use_cpu": True, "max_steps": 2, "logging_steps": 1, "save_strategy": "no",
                         "per_device_train_batch_size": 4, "learning_rate": 5e-2,
                         "output_dir": str(tmp_path / "out")}
    # A finished LoRA run in the host's runs folder (trained by the worker directly, as test_sft does).
    run = RunStore(ssh_host.runs_dir).create(job)
    train = [sys.executable, "-m", "gaudi_gui.workers.train", "--config", str(run.config_path)]
    trained = subprocess.run(train, capture_output=True, text=True, timeout=300, check=False)
    assert trained.returncode == 0, trained.stderr[-2000:]
    run.update_status(state="finished")
    before = sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*"))

    gg_eval = [sys.executable, "-m", "gaudi_gui", "eval", "--host", ssh_host.dest, "--run", run.name]
    res = subprocess.run([*gg_eval, "--prompt", "Say bye.", "--max-new-tokens", "4", "--json"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ), check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["host"] == ssh_host.dest and Path(out["path"]).parent == run.folder / "eval"
    assert Path(out["path"]).is_file() and "base" in out and "tuned" in out
    # Nothing of the run's output was merged or changed.
    assert sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*")) == before

    bad = subprocess.run([*gg_eval, "--data", str(alpaca)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ), check=False)
    assert bad.returncode == 2, bad.stderr
    assert ("'prompt' is not a column of alpaca.jsonl (its columns: instruction, input, output)"
            in bad.stderr), bad.stderr
    assert "Traceback" not in bad.stderr
    assert ssh_host.wait_no_processes() == []


def test_a_detached_evaluation_on_a_host_survives_a_cut_and_keeps_its_result_there(
        ssh_host: SshHost, tiny_model_dir: Path, tmp_path: Path) -> None:
    """``eval --host DEST --detach`` (issue 26): the host's own supervisor and run folder; the connection
    is cut at once, the evaluation goes on there and its result lands in its run folder on the host."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(4)))
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "eval", "--host", ssh_host.dest, "--model",
                           str(tiny_model_dir), "--base", str(tiny_model_dir), "--prompts", str(prompts),
                           "--metrics", "exact_match", "--max-new-tokens", "8", "--detach", "--json"],
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    folder = Path(info["folder"])
    assert info["kind"] == "eval" and info["host"] == ssh_host.dest and folder.parent == ssh_host.runs_dir
    ssh_host.drop()
    while not (folder / "result.json").is_file():  # no upper bound: pytest-timeout has the last word
        status = json.loads((folder / "status.json").read_text())
        assert status["state"] in ("queued", "running"), status
        time.sleep(0.2)
    assert ssh_host.wait_no_processes(timeout=60) == []
    status = json.loads((folder / "status.json").read_text())
    assert (status["kind"], status["state"]) == ("eval", "finished"), status


def test_a_dropped_connection_mid_evaluation_no_longer_ends_it(ssh_host: SshHost, tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    """``eval --host DEST`` without ``--detach`` (issue 26: one door): the host's own detached job,
    followed here. The connection is cut once the host has answered a row: the evaluation goes on
    there, the follow reconnects, and the command ends with the results as if nothing happened
    (before: the guard ended the evaluation with the connection)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(24)))
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "eval", "--host", ssh_host.dest, "--model",
                             str(tiny_model_dir), "--base", str(tiny_model_dir), "--prompts", str(prompts),
                             "--metrics", "exact_match", "--max-new-tokens", "16", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        answered: list[Path] = []
        while not answered:  # no upper bound: pytest-timeout has the last word
            assert proc.poll() is None, proc.communicate()
            answered = [p for p in ssh_host.runs_dir.glob("*/events.jsonl") if '"answer"' in p.read_text()]
            time.sleep(0.1)
        ssh_host.drop()  # a network cut mid-evaluation
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "reconnecting" in err, err
    result = json.loads(out)
    folder = answered[0].parent
    assert result["host"] == ssh_host.dest and Path(result["path"]).is_file()
    assert json.loads((folder / "result.json").read_text())["path"] == result["path"]
    status = json.loads((folder / "status.json").read_text())
    assert (status["kind"], status["state"]) == ("eval", "finished"), status
    assert ssh_host.wait_no_processes(timeout=60) == []
