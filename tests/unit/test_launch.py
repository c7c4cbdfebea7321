from __future__ import annotations

import shlex
import sys
from pathlib import Path

from gaudi_gui.core import launch
from gaudi_gui.core.jobconfig import JobConfig


def job(n: int = 1) -> JobConfig:
    j = JobConfig(training_args={"output_dir": "o"})
    j.launch.num_processes = n
    return j


def test_cpu_single_process(tmp_path: Path) -> None:
    lc = launch.build(job(), tmp_path, device="cpu")
    assert lc.argv[:2] == launch.accelerate_program()
    assert lc.argv[lc.argv.index("--config_file") + 1] == str(tmp_path / "accelerate_config.json")
    assert "--cpu" in lc.argv and "--multi_gpu" not in lc.argv
    assert lc.argv[-4:] == ["-m", "gaudi_gui.workers.train", "--config", str(tmp_path / "config.json")]
    assert lc.env_extra["ACCELERATE_USE_CPU"] == "true"
    launch.write_generated_config(lc)
    assert (tmp_path / "accelerate_config.json").is_file()


def test_cpu_two_processes_is_real_multi_process(tmp_path: Path) -> None:
    lc = launch.build(job(2), tmp_path, device="cpu", port=12345)
    a = lc.argv
    assert "--multi_gpu" in a and a[a.index("--num_processes") + 1] == "2" and "--cpu" not in a
    assert a[a.index("--main_process_port") + 1] == "12345"
    assert launch.worker_training_args(job(2), "cpu")["ddp_backend"] == "gloo"


def test_gaudi_env_and_multi_node(tmp_path: Path) -> None:
    j = job(8)
    j.launch.num_machines, j.launch.machine_rank, j.launch.main_process_ip = 2, 1, "10.0.0.1"
    lc = launch.build(j, tmp_path, device="hpu", device_env={"HABANA_VISIBLE_MODULES": "0,1"})
    assert lc.env_extra["PT_ENABLE_INT64_SUPPORT"] == "1"
    assert lc.env_extra["HABANA_VISIBLE_MODULES"] == "0,1"
    a = lc.argv
    assert a[a.index("--num_processes") + 1] == "16"
    assert a[a.index("--machine_rank") + 1] == "1" and "10.0.0.1" in a
    assert launch.worker_training_args(j, "hpu")["ddp_backend"] == "hccl"


def test_user_config_file_and_shell_command(tmp_path: Path) -> None:
    j = job()
    j.launch.accelerate_config = str(tmp_path / "my config.yaml")
    lc = launch.build(j, tmp_path / "run dir", device="cpu")
    assert lc.generated_config is None
    shell = lc.shell_command()
    assert shell.startswith("ACCELERATE_USE_CPU=true PYTHONUNBUFFERED=1 ")
    words = shlex.split(shell)
    assert words[2:] == lc.argv and str(tmp_path / "my config.yaml") in words


def test_fallback_to_python_module(tmp_path: Path) -> None:
    assert launch.accelerate_program(str(tmp_path / "python")) == [str(tmp_path / "python"), "-m",
                                                                   "accelerate.commands.launch"]
    assert launch.accelerate_program(sys.executable)[0].endswith("accelerate")


def test_a_users_accelerate_config_keeps_its_distributed_type(tmp_path) -> None:
    """--multi_gpu or --cpu on the command line would override an FSDP / DeepSpeed config file."""
    from gaudi_gui.core import launch as launch_mod
    from gaudi_gui.core.jobconfig import JobConfig
    job = JobConfig()
    job.launch.num_processes = 2
    job.launch.accelerate_config = str(tmp_path / "fsdp.yaml")
    for device in ("cpu", "cuda", "hpu"):
        argv = launch_mod.build(job, tmp_path, device=device, port=29501).argv
        assert "--multi_gpu" not in argv and "--cpu" not in argv
        assert argv[argv.index("--num_processes") + 1] == "2"
        assert argv[argv.index("--config_file") + 1] == str(tmp_path / "fsdp.yaml")


def test_lora_without_a_learning_rate_gets_loras_and_a_set_one_is_kept() -> None:
    """Issue 25, item 17: at TrainingArguments' 5e-5 the demo LoRA run changed nothing measurable."""
    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.launch import LORA_LEARNING_RATE, worker_training_args

    assert LORA_LEARNING_RATE == 2e-4
    assert worker_training_args(JobConfig(method="lora"), "cpu")["learning_rate"] == LORA_LEARNING_RATE
    assert worker_training_args(JobConfig(method="qlora"), "cpu")["learning_rate"] == 2e-4
    assert "learning_rate" not in worker_training_args(JobConfig(method="full"), "cpu")
    set_rate = JobConfig(method="lora", training_args={"learning_rate": 1e-5})
    assert worker_training_args(set_rate, "cpu")["learning_rate"] == 1e-5
