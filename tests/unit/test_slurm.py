"""core/slurm.py without a cluster: the batch script, and what squeue / scontrol / sacct / sbatch print."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui.core import slurm
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import SLURM_INFO
from gaudi_gui.core.slurm import JobInfo, Query, SlurmOptions


def _script(tmp_path: Path, **options: object) -> str:
    opts = SlurmOptions(**{"device": "cpu", **options})  # type: ignore[arg-type]
    base = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2})
    job = slurm.slurm_job(base, opts)
    return slurm.sbatch_script(job, tmp_path / "run folder $(x)", opts)


def test_script_asks_for_the_nodes_and_runs_one_launch_per_node(tmp_path: Path) -> None:
    script = _script(tmp_path, nodes=2, partition="gaudi", account="ml", time="2:00:00", cards_per_node=8,
                     gres="gpu:8")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for want in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=gaudi",
                 "#SBATCH --account=ml", "#SBATCH --time=2:00:00", "#SBATCH --gres=gpu:8",
                 "#SBATCH --signal=B:USR1@120", "#SBATCH --open-mode=append"):
        assert want in lines, script
    folder = str(tmp_path / "run folder $(x)")
    assert f"#SBATCH --output={shlex.quote(folder + '/log.txt')}" in lines
    # Every #SBATCH line comes before the first command (sbatch stops reading them there).
    first_command = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH")) < first_command
    assert 'MAIN=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in lines
    task = lines[lines.index("TASK=$(cat <<'GAUDI_GUI_TASK'") + 1]
    words = shlex.split(task)
    # Each node's launch runs under that node's meter (core.slurm meter-node), its words after "--".
    assert words[:4] == ["exec", sys.executable, "-m", "gaudi_gui.core.slurm"] and words[4] == "meter-node"
    words = ["exec", *words[words.index("--") + 1:]]
    assert words[2] == "launch"
    at = words.index("--machine_rank")
    assert words[at + 1] == "$SLURM_NODEID" and '--machine_rank "$SLURM_NODEID"' in task
    assert words[words.index("--num_machines") + 1] == "$SLURM_NNODES"
    assert words[words.index("--main_process_ip") + 1] == "$MAIN"
    assert words[words.index("--num_processes") + 1] == "16"  # 2 nodes x 8 cards
    assert words.count("--machine_rank") == 1 and slurm.MAIN_PLACEHOLDER not in script
    assert words[-2:] == ["--config", folder + "/config.json"] and words[words.index("-m") + 1] == \
        "gaudi_gui.workers.train"
    assert "srun --nodes=\"$SLURM_JOB_NUM_NODES\" --ntasks-per-node=1" in script
    assert "trap 'stop_ranks SIGUSR1' USR1" in lines


def test_script_is_valid_bash_and_quotes_hostile_paths(tmp_path: Path) -> None:
    script = _script(tmp_path)
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "--time" not in script and "--partition" not in script and "--gres" not in script
    assert "--signal=B:" not in script  # no time limit: nothing to stop before
    with pytest.raises(ValueError):
        slurm.sbatch_script(JobConfig(), tmp_path / "a\nb", SlurmOptions())


def test_the_task_line_expands_only_the_slurm_variables(tmp_path: Path) -> None:
    script = _script(tmp_path)
    lines = script.splitlines()
    task = lines[lines.index("TASK=$(cat <<'GAUDI_GUI_TASK'") + 1]
    assert task.startswith("exec ")
    printed = "printf '%s\\n' " + task[len("exec "):]
    env = {"SLURM_NNODES": "3", "SLURM_NODEID": "1", "MAIN": "n0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", printed], capture_output=True, text=True, check=True,
                         env=env).stdout.splitlines()
    assert out[out.index("--machine_rank") + 1] == "1" and out[out.index("--main_process_ip") + 1] == "n0"
    assert str(tmp_path / "run folder $(x)" / "config.json") in out  # the $(x) stayed text


def test_options_are_checked() -> None:
    assert SlurmOptions(time="1-12:00:00", partition="a-b").validate() == []
    names = {n for n, _ in SlurmOptions(nodes=0, time="soon", partition="a b", account="x;y").validate()}
    assert names == {"nodes", "time", "partition", "account"}


def test_cuda_cards_become_a_gpu_gres() -> None:
    assert slurm.default_gres(SlurmOptions(device="cuda", cards_per_node=4)) == "gpu:4"
    assert slurm.default_gres(SlurmOptions(device="hpu", cards_per_node=8)) == ""
    assert slurm.default_gres(SlurmOptions(device="hpu", cards_per_node=8, gres="hpu:8")) == "hpu:8"


def test_parse_sbatch() -> None:
    assert slurm.parse_sbatch("123\n") == "123"
    assert slurm.parse_sbatch("456;cluster\n") == "456"
    for bad in ("", "sbatch: error: invalid partition", "12 34"):
        with pytest.raises(ValueError):
            slurm.parse_sbatch(bad)


def test_parse_squeue() -> None:
    jobs = slurm.parse_squeue("7|PENDING|Resources|\n8|RUNNING|None|n[1-2]\n9|COMPLETED|None|n1\n")
    assert jobs["7"] == JobInfo("7", "PENDING", "Resources", "") and jobs["7"].phase == "pending"
    assert jobs["8"].phase == "running" and jobs["8"].nodes == "n[1-2]" and jobs["8"].reason == ""
    assert jobs["9"].phase == "ended"
    assert slurm.parse_squeue("") == {}


def test_parse_sacct() -> None:
    text = "5|CANCELLED by 0|0:15|n1\n5.batch|CANCELLED|0:15|n1\n6|COMPLETED|0:0|n1\n7|FAILED|2:0|n1\n"
    jobs = slurm.parse_sacct(text)
    assert set(jobs) == {"5", "6", "7"}
    assert jobs["5"].state == "CANCELLED" and jobs["5"].exit_code == -15
    assert jobs["6"].exit_code == 0 and jobs["7"].exit_code == 2 and jobs["7"].phase == "ended"


def test_parse_scontrol() -> None:
    text = ("JobId=12 JobName=gaudi-gui-x UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
            "ExitCode=0:15 NodeList=n1 Command=/a b/slurm.sh WorkDir=/a b")
    info = slurm.parse_scontrol(text)
    assert info == JobInfo("12", "TIMEOUT", "TimeLimit", "n1", -15)
    assert slurm.parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None


def test_query_asks_squeue_then_the_controller_then_accounting() -> None:
    answers = {"squeue": (0, "3|RUNNING|None|n1\n", ""), "scontrol": (1, "", "Invalid job id"),
               "sacct": (1, "", "Slurm accounting storage is disabled")}
    calls: list[str] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv[0])
        return answers[argv[0]]

    query = Query(run)
    assert query("3") == JobInfo("3", "RUNNING", "", "n1") and calls == ["squeue"]
    answers["squeue"] = (0, "3|COMPLETED|None|n1\n", "")
    answers["scontrol"] = (0, "JobId=3 JobState=COMPLETED Reason=None ExitCode=0:0 NodeList=n1", "")
    assert query("3") == JobInfo("3", "COMPLETED", "", "n1", 0)
    answers["squeue"] = (1, "", "slurm_load_jobs error: Invalid job id specified")
    answers["scontrol"] = (1, "", "Invalid job id")
    answers["sacct"] = (0, "3|FAILED|1:0|n1\n", "")
    assert query("3") == JobInfo("3", "FAILED", "", "n1", 1)
    answers["sacct"] = (1, "", "Slurm accounting storage is disabled")
    assert query("3") is None and any("accounting storage" in e for e in query.errors)


def test_stop_signals_the_batch_shell_and_cancel_the_job() -> None:
    assert slurm.scancel_argv("9", stop=True) == ["scancel", "--batch", "--signal=USR1", "9"]
    assert slurm.scancel_argv("9", stop=False) == ["scancel", "9"]
    assert slurm.sbatch_argv("/r/slurm.sh") == ["sbatch", "--parsable", "/r/slurm.sh"]


def test_signal_ranks_only_signals_this_hosts_live_ranks(tmp_path: Path) -> None:
    import json
    import os
    import sys

    import psutil
    (tmp_path / "ranks").mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = psutil.Process(child.pid)
        for rank, host in ((0, "here"), (1, "elsewhere")):
            (tmp_path / "ranks" / f"rank-{rank}.json").write_text(json.dumps(
                {"rank": rank, "pid": child.pid, "create_time": me.create_time(), "host": host}))
        assert slurm.signal_ranks(tmp_path, host="nowhere") == []
        assert slurm.signal_ranks(tmp_path, host="here") == [child.pid]
        assert child.wait(timeout=10) == -15
    finally:
        if child.poll() is None:
            os.kill(child.pid, 9)
            child.wait()


def _attach(*args: str) -> subprocess.CompletedProcess[str]:
    import sys
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "attach", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_runs_attach_refuses_what_is_not_a_running_slurm_job(tmp_path: Path) -> None:
    """``runs attach`` on a run that is not a Slurm run, a broken slurm.json, a job that already ended,
    a bad --grace: a one-line reason and exit 2 (or the outcome and 0/1), never a traceback."""
    import json

    from gaudi_gui.core.runstore import RunStore

    store = RunStore(tmp_path / "runs")
    local = store.create(JobConfig(training_args={"output_dir": str(tmp_path / "out")}))
    done = _attach(str(local.folder))
    assert done.returncode == 2 and "is not a Slurm run" in done.stderr and "Traceback" not in done.stderr

    (local.folder / SLURM_INFO).write_text("{not json")
    done = _attach(str(local.folder))
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr

    info = {"job_id": "41", "login": "local", "options": {"partition": "p", "nodes": 2, "from_a_newer": 1}}
    (local.folder / SLURM_INFO).write_text(json.dumps(info))
    assert slurm.options_of(info) == SlurmOptions(partition="p", nodes=2)
    local.update_status(state="stopped", summary="Stopped at step 7 — checkpoint-7 saved")
    done = _attach(str(local.folder))
    assert done.returncode == 0 and "Slurm job 41 already ended: stopped" in done.stderr, done.stderr
    local.update_status(state="failed", summary="Failed: exit 1")
    assert _attach(str(local.folder)).returncode == 1

    done = _attach(str(local.folder), "--grace", "-1")
    assert done.returncode == 2 and "--grace" in done.stderr and "Traceback" not in done.stderr
    done = _attach(str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "no run" in done.stderr


def test_the_detached_supervisor_gets_every_option_that_shapes_the_job() -> None:
    """``train --slurm --detach``'s background command, parsed again, asks for the same job (a value that
    begins with '-' stays a value), with the resolved device and its announce file, never --detach."""
    from gaudi_gui.cli import build_parser
    from gaudi_gui.commands import flags, slurm_run

    given = ["train", "--config", "job.json", "--slurm", "--device", "cpu", "--nodes", "2",
             "--partition=-odd", "--time", "1:00:00", "--account", "ml", "--cards-per-node", "4", "--gres",
             "gpu:4", "--login", "gg-login", "--node-python", "/opt/py", "--grace", "45", "--runs-dir",
             "/runs", "--resumed-from", "/runs/old", "--no-preflight", "--detach", "--json"]
    parser = build_parser("train")
    args = parser.parse_args(given)
    argv = slurm_run.detached_argv(args, "cpu", "/in/job.json", "/in/job.run")
    assert argv[:3] == [sys.executable, "-m", "gaudi_gui"]
    assert "--detach" not in argv and "--json" not in argv and "--events" not in argv
    words = argv[3:]
    assert flags.refusal(build_parser("train"), words) is None
    again = parser.parse_args(words)
    for name in ("slurm", "device", "nodes", "partition", "time", "account", "cards_per_node", "gres",
                 "login", "node_python", "grace", "runs_dir", "resumed_from", "no_preflight"):
        assert getattr(again, name) == getattr(args, name), name
    assert again.config == "/in/job.json" and again.announce == "/in/job.run" and not again.detach
