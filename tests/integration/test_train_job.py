"""Real ``accelerate launch`` on CPU with the tiny model: a TrainingJob on this machine, through the
same ``train --detach`` supervisor a host runs, followed by ``runs follow``."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.runstore import RunStore, latest_checkpoint
from gaudi_gui.services.training_job import TrainingJob

pytestmark = pytest.mark.usefixtures("demo_model")


def make_job(tmp_path: Path, **args: object) -> JobConfig:
    job = JobConfig()
    job.dataset.max_length = 32
    job.training_args = {"output_dir": str(tmp_path / "out"), "max_steps": 6,
                         "per_device_train_batch_size": 2, "logging_steps": 1, "save_steps": 3,
                         **args}
    return job


def run_to_end(qtbot, job: JobConfig, tmp_path: Path, timeout: int = 120000) -> TrainingJob:
    tj = TrainingJob(Placement.local(), RunStore(tmp_path / "runs"), stop_grace_s=20)
    lines: list[str] = []
    tj.log_line_received.connect(lines.append)
    tj.lines = lines  # type: ignore[attr-defined]
    with qtbot.waitSignal(tj.finished, timeout=timeout) as blocker:
        tj.start(job, device="cpu")
    tj.result = blocker.args  # type: ignore[attr-defined]
    return tj


def test_one_process_checkpoint_and_metrics(qtbot, tmp_path: Path) -> None:
    got: list[dict] = []
    job = make_job(tmp_path)
    tj = TrainingJob(Placement.local(), RunStore(tmp_path / "runs"))
    tj.metrics_received.connect(got.append)
    with qtbot.waitSignal(tj.finished, timeout=120000) as blocker:
        tj.start(job, device="cpu")
    code, state, _tail = blocker.args
    run = tj.run
    assert run is not None
    assert (code, state) == (0, "finished"), tj.run.log_tail(30)  # type: ignore[union-attr]
    steps = [r["step"] for r in got if r.get("loss") is not None]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert all(r["max_steps"] == 6 for r in got)
    assert latest_checkpoint(tmp_path / "out").name == "checkpoint-6"  # type: ignore[union-attr]
    assert (tmp_path / "out" / "final" / "config.json").is_file()
    status = run.status()
    assert status.state == "finished" and status.exit_code == 0 and status.final_loss is not None
    assert len(run.metrics()) >= 6
    assert "[rank 0/1] done" in run.log_path.read_text()
    for name in ("command.txt", "command.json", "env.json", "versions.json", "accelerate_config.json"):
        assert (run.folder / name).is_file(), name
    argv = json.loads((run.folder / "command.json").read_text())["argv"]
    assert "--config_file" in argv and "--cpu" in argv


def test_two_processes_gloo(qtbot, tmp_path: Path) -> None:
    job = make_job(tmp_path)
    job.launch.num_processes = 2
    tj = run_to_end(qtbot, job, tmp_path)
    code, state, _ = tj.result  # type: ignore[attr-defined]
    log = tj.run.log_path.read_text()  # type: ignore[union-attr]
    assert (code, state) == (0, "finished"), log[-3000:]
    assert "[rank 0/2] done" in log and "[rank 1/2] done" in log
    events = tj.run.events()  # type: ignore[union-attr]
    assert next(e for e in events if e["type"] == "training_started")["world_size"] == 2
    assert next(e for e in events if e["type"] == "finished")["world_size"] == 2
    assert [r["rank"] for r in tj.run.ranks()] == [0, 1]  # type: ignore[union-attr]
    assert "@gaudi-gui" not in log  # the console is a log; events live in events.jsonl


def test_stop_mid_run_then_resume(qtbot, tmp_path: Path) -> None:
    # Slow the steps down with a large max_steps; stop after the first metrics arrive.
    job = make_job(tmp_path, max_steps=2000, save_steps=100000)
    tj = TrainingJob(Placement.local(), RunStore(tmp_path / "runs"), stop_grace_s=30)
    with qtbot.waitSignal(tj.metrics_received, timeout=120000):
        tj.start(job, device="cpu")
    root = tj.pid
    with qtbot.waitSignal(tj.finished, timeout=60000) as blocker:
        tj.stop()
    _code, state, _ = blocker.args
    assert state == "stopped", tj.run.log_tail(30)  # type: ignore[union-attr]
    assert "outlived" not in tj.summary
    assert not psutil.pid_exists(root) or psutil.Process(root).status() == psutil.STATUS_ZOMBIE
    ckpt = latest_checkpoint(tmp_path / "out")
    assert ckpt is not None
    stopped_at = int(ckpt.name.split("-")[1])
    assert 0 < stopped_at < 2000
    # Resume from the latest checkpoint, to a few steps further.
    job2 = make_job(tmp_path, max_steps=stopped_at + 3, save_steps=100000)
    job2.resume_from_checkpoint = "latest"
    got: list[dict] = []
    tj2 = TrainingJob(Placement.local(), RunStore(tmp_path / "runs"))
    tj2.metrics_received.connect(got.append)
    with qtbot.waitSignal(tj2.finished, timeout=120000) as blocker:
        tj2.start(job2, device="cpu")
    assert blocker.args[1] == "finished", tj2.run.log_tail(30)  # type: ignore[union-attr]
    steps = [r["step"] for r in got if r.get("loss") is not None]
    assert steps and steps[0] == stopped_at + 1


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_lora_and_qlora(qtbot, tmp_path: Path, method: str) -> None:
    # bitsandbytes is a dependency on Linux and runs 4-bit on a CPU: a QLoRA that cannot run here is
    # a failure to see, never a skip that hides it.
    job = make_job(tmp_path, max_steps=4, save_steps=100000)
    job.method = method
    tj = run_to_end(qtbot, job, tmp_path)
    code, state, _ = tj.result  # type: ignore[attr-defined]
    log = tj.run.log_path.read_text()  # type: ignore[union-attr]
    if method == "qlora" and code != 0 and "bitsandbytes" in log.lower():
        pytest.fail("bitsandbytes cannot run 4-bit on this CPU: " + log.strip().splitlines()[-1]
                    + "\n" + log[-3000:])
    assert (code, state) == (0, "finished"), log[-3000:]
    assert f"{method}: " in log and "trainable parameters" in log
    # The adapter is saved as an adapter (with its tokenizer); "Merge and save" makes a full model.
    assert (tmp_path / "out" / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "out" / "adapter" / "tokenizer_config.json").is_file()
    assert not (tmp_path / "out" / "final").exists()


def test_missing_column_is_refused_before_launch(qtbot, tmp_path: Path) -> None:
    from gaudi_gui.core.prepare import PrepareError
    data = tmp_path / "data.jsonl"
    data.write_text('{"body": "hello there"}\n{"body": "more text"}\n')
    job = make_job(tmp_path)
    job.dataset.source = str(data)
    tj = TrainingJob(Placement.local(), RunStore(tmp_path / "runs"))
    with pytest.raises(PrepareError) as refused:
        tj.start(job, device="cpu")
    assert "text" in str(refused.value)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_value_that_is_not_text_is_refused_where_the_job_enters(qtbot, tmp_path: Path) -> None:
    """One row in three with no text: refused by the job's check where it enters (issue 37, items 8
    and 9: past 10 % of the rows), exit 2, the file and the line named, no run launched."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello there friend"}\n{"text": null}\n{"text": "more text here"}\n')
    job = make_job(tmp_path)
    job.dataset.source = str(data)
    tj = run_to_end(qtbot, job, tmp_path)
    code, state, lines = tj.result  # type: ignore[attr-defined]
    assert (code, state) == (2, "failed")
    said = "\n".join(lines)
    assert "dataset.source" in said and str(data) in said and "1 of 3 rows" in said and "line 2" in said
    assert tj.run is None


def test_unwritable_output_dir_is_refused_where_the_job_enters(qtbot, tmp_path: Path) -> None:
    # A regular file in the path makes the folder impossible to create, even for root (chmod is not).
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    job = make_job(tmp_path, output_dir=str(blocker / "out"))
    tj = run_to_end(qtbot, job, tmp_path)
    code, state, lines = tj.result  # type: ignore[attr-defined]
    assert (code, state) == (2, "failed")
    said = "\n".join(lines)
    assert "training_args.output_dir" in said and "is a file, not a folder" in said
    assert tj.run is None
