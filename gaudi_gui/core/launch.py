"""The exact command and environment that start a training job under ``accelerate launch``.

Everything the UI previews is what runs: the same ``Launch`` object gives the argv for QProcess, the
environment, and a copyable shell command. Facts this relies on (see DESIGN.md): on CPU,
``--num_processes 2`` alone (or with ``--cpu``) starts one process; real gloo data parallel needs
``--multi_gpu --num_processes N`` plus ``ACCELERATE_USE_CPU=true``. accelerate silently reads a user's
default config unless ``--config_file`` is given, so one is always passed.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core import visibility
from gaudi_gui.core.jobconfig import JobConfig

WORKER_MODULE = "gaudi_gui.workers.train"
ACCELERATE_CONFIG_NAME = "accelerate_config.json"


@dataclass
class Launch:
    argv: list[str]
    #: Only the variables the launch sets on top of the inherited environment (what the preview shows).
    env_extra: dict[str, str] = field(default_factory=dict)
    accelerate_config: str = ""
    generated_config: dict[str, Any] | None = None

    @property
    def program(self) -> str:
        return self.argv[0]

    @property
    def args(self) -> list[str]:
        return self.argv[1:]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full child environment."""
        return visibility.child_env(self.env_extra, base)

    def shell_command(self) -> str:
        """One line to paste into a terminal: ``VAR=value ... accelerate launch ...``."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env_extra.items()))
        cmd = shlex.join(self.argv)
        return f"{prefix} {cmd}" if prefix else cmd

    def to_dict(self) -> dict[str, Any]:
        return {"argv": self.argv, "env": self.env_extra, "accelerate_config": self.accelerate_config,
                "shell": self.shell_command()}


def accelerate_program(python: str | None = None) -> list[str]:
    """The ``accelerate`` script next to the interpreter, else ``python -m accelerate.commands.launch``."""
    python = python or sys.executable
    script = Path(python).with_name("accelerate")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "launch"]
    return [python, "-m", "accelerate.commands.launch"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_accelerate_config(job: JobConfig, device: str) -> dict[str, Any]:
    """A complete accelerate config matching the job, so no user default is consulted."""
    n = max(1, job.launch.num_processes) * max(1, job.launch.num_machines)
    distributed = {"cpu": "MULTI_CPU", "hpu": "MULTI_HPU"}.get(device, "MULTI_GPU") if n > 1 else "NO"
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed,
        "mixed_precision": job.launch.mixed_precision,
        "use_cpu": device == "cpu",
        "num_processes": n,
        "num_machines": job.launch.num_machines,
        "machine_rank": job.launch.machine_rank,
        "main_training_function": "main",
        "debug": False,
    }


def build(job: JobConfig, run_dir: str | Path, *, device: str = "cpu",
          device_env: Mapping[str, str] | None = None, python: str | None = None,
          port: int | None = None) -> Launch:
    """The launch for ``job`` whose config will be ``<run_dir>/config.json``.

    ``device`` is the probed accelerator ('cpu', 'cuda', 'hpu'); ``device_env`` the selection's
    variables (``DeviceSelection.env()``: HABANA_VISIBLE_MODULES / CUDA_VISIBLE_DEVICES).
    """
    run_dir = Path(run_dir)
    python = python or sys.executable
    launch = job.launch
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    env.update(device_env or {})
    generated: dict[str, Any] | None = None
    if launch.accelerate_config:
        config_file = str(Path(launch.accelerate_config).expanduser())
    else:
        config_file = str(run_dir / ACCELERATE_CONFIG_NAME)
        generated = default_accelerate_config(job, device)
    argv = [*accelerate_program(python), "--config_file", config_file]
    nproc = max(1, launch.num_processes)
    total = nproc * max(1, launch.num_machines)
    if launch.accelerate_config:
        # The user's config names the distributed type (FSDP, DeepSpeed, multi-GPU...): a mode flag
        # here (--multi_gpu, --cpu) would silently override it, turning an FSDP job into DDP.
        argv += ["--num_processes", str(total)]
        if device == "cpu":
            env["ACCELERATE_USE_CPU"] = "true"
        elif device == "hpu":
            env["PT_ENABLE_INT64_SUPPORT"] = "1"
    elif device == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
        if total > 1:
            argv += ["--multi_gpu", "--num_processes", str(total)]
        else:
            argv += ["--cpu", "--num_processes", "1"]
    else:
        if total > 1:
            argv += ["--multi_gpu", "--num_processes", str(total)]
        else:
            argv += ["--num_processes", "1"]
        if device == "hpu":
            env["PT_ENABLE_INT64_SUPPORT"] = "1"
    if launch.num_machines > 1:
        argv += ["--num_machines", str(launch.num_machines), "--machine_rank", str(launch.machine_rank),
                 "--main_process_ip", launch.main_process_ip,
                 "--main_process_port", str(launch.main_process_port)]
    elif total > 1:
        # Two jobs (or a test and the app) on one machine must not fight over the default port 29500.
        argv += ["--main_process_port", str(port or free_port())]
    if launch.mixed_precision != "no":
        argv += ["--mixed_precision", launch.mixed_precision]
    argv += ["-m", WORKER_MODULE, "--config", str(run_dir / "config.json")]
    return Launch(argv=argv, env_extra=env, accelerate_config=config_file, generated_config=generated)


def supervised_argv(launch: Launch, log_path: str | Path) -> list[str]:
    """The launch wrapped so its output is also appended to ``log_path`` by ``tee``.

    The file is written by the child side, not by the app, so a run left running when the window
    closes (detached) keeps its full log, and a worker never dies of a broken pipe: GNU tee's
    ``--output-error=warn-nopipe`` keeps writing the file after the app's end of the pipe is gone.
    ``pipefail`` keeps the launcher's exit status as the wrapper's.
    """
    script = 'log="$1"; shift; set -o pipefail; "$@" 2>&1 | tee --output-error=warn-nopipe -a "$log"'
    return ["bash", "-c", script, "gaudi-gui-train", str(log_path), *launch.argv]


def write_generated_config(launch: Launch) -> None:
    """Write the generated accelerate config (no-op when the user chose a file)."""
    if launch.generated_config is None:
        return
    path = Path(launch.accelerate_config)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(launch.generated_config, indent=2))


#: The learning rate of a LoRA/QLoRA run whose job sets none.
LORA_LEARNING_RATE = 2e-4


def worker_training_args(job: JobConfig, device: str) -> dict[str, Any]:
    """Training arguments as the worker will use them: the job's, plus what the device implies."""
    args = dict(job.training_args)
    if job.method in ("lora", "qlora"):
        # TrainingArguments' 5e-5 is a full fine-tune's rate: LoRA's few parameters need about ten
        # times more (PEFT's and the QLoRA paper's 2e-4). At 5e-5 the demo LoRA run changed nothing
        # measurable (perplexity 8.61 -> 8.56, the same answers); a rate the user set is kept.
        args.setdefault("learning_rate", LORA_LEARNING_RATE)
    nproc = max(1, job.launch.num_processes) * max(1, job.launch.num_machines)
    if device == "cpu":
        args.setdefault("use_cpu", True)
        if nproc > 1:
            args.setdefault("ddp_backend", "gloo")
            # The causal LMs used here have no unused parameters; the check costs a graph traversal.
            args.setdefault("ddp_find_unused_parameters", False)
    elif device == "hpu" and nproc > 1:
        args.setdefault("ddp_backend", "hccl")
    return args
