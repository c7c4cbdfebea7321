"""One run preparation for the Training tab and ``gaudi-gui train``: job in, ready launch out.

``prepare_run`` validates the job, works out what the launcher adds for the device (use_cpu,
ddp_backend...), takes credentials out of the job (they come from the environment or the HF token
store), creates the run folder (job.json as the user made it, config.json as it runs), writes the
accelerate config, the command and the recorded environment, and returns the argv and the full child
environment. Both front ends then only start ``PreparedRun.argv`` and follow the run folder.

Every child that touches a model or TrainingArguments (the launch, the probe, the schema and
validation children) gets ``child_env(device, device_env)``: the device's variables
(``PT_ENABLE_INT64_SUPPORT=1`` on Gaudi) and the card selection. Qt-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gaudi_gui.core import environment, hpu_metrics, jobcheck, outputs, visibility
from gaudi_gui.core import launch as launch_mod
from gaudi_gui.core.hlsmi import find_hl_smi
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.core.secrets import redact, strip_secret_args

DEVICES = ("cpu", "cuda", "hpu")


class PrepareError(ValueError):
    """The job cannot be launched; ``problems`` lists (field, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in problems))
        self.problems = problems


@dataclass
class PreparedRun:
    run: Run
    #: The job as it runs (what the launcher added for the device included).
    job: JobConfig
    #: The job as the user made it (what Clone gives back).
    user_job: JobConfig
    launch: launch_mod.Launch
    #: The argv to start: the launch, wrapped so tee appends the console to log.txt.
    argv: list[str]
    env: dict[str, str]
    device: str


def device_variables(device: str, device_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables every child for ``device`` gets: the card selection, and on Gaudi
    ``PT_ENABLE_INT64_SUPPORT=1`` (many models' index ops need 64-bit integers there)."""
    env = {str(k): str(v) for k, v in (device_env or {}).items()}
    if device == "hpu":
        env.setdefault("PT_ENABLE_INT64_SUPPORT", "1")
    return env


def child_env(device: str, device_env: Mapping[str, str] | None = None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full environment of a worker child for ``device``."""
    return visibility.child_env(device_variables(device, device_env), base)


def probe_device(timeout: float = 120.0, env: Mapping[str, str] | None = None) -> str:
    """hpu > cuda > cpu, as the probe decides (what ``--device auto`` means). A CPU-only install
    (no habana_frameworks, a torch built for no accelerator) is the cpu without a child; otherwise the
    probe child answers for the device alone (``--device``: torch and transformers' Gaudi check, not
    every package the full probe imports)."""
    probe_env = dict(env if env is not None else os.environ)
    same_path = probe_env.get("PYTHONPATH", "") == os.environ.get("PYTHONPATH", "")
    if same_path and environment.cpu_only_install():
        return "cpu"
    if find_hl_smi(env=probe_env):
        # A Gaudi host: the probe imports habana_frameworks, which wants this set like every child.
        probe_env.setdefault("PT_ENABLE_INT64_SUPPORT", "1")
    try:
        done = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.probe", "--device"],
                              capture_output=True, text=True, timeout=timeout, env=probe_env,
                              errors="replace", check=False)
        info = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return "cpu"
    device = info.get("device") if isinstance(info, dict) else None
    return device if device in DEVICES else "cpu"


def prepare_run(job: JobConfig, *, device: str, device_env: Mapping[str, str] | None = None,
                store: RunStore | None = None, origin: str = "gui", resumed_from: str = "",
                python: str | None = None, base_env: Mapping[str, str] | None = None,
                cards: Sequence[int] | None = None, compile_meter_here: bool = True) -> PreparedRun:
    """Validate ``job`` and create its run folder; PrepareError lists what is wrong, OSError when
    the disk refuses (nothing is left behind then).

    ``cards`` (``gaudi-gui train --cards``): the card ids this run may use, turned into
    HABANA_VISIBLE_MODULES (hpu) or CUDA_VISIBLE_DEVICES (cuda) over whatever ``device_env`` says,
    and ignored on cpu; either way env.json records them under "cards".

    ``compile_meter_here``: on Gaudi, the bridge's compile meter goes to the run folder's
    ``hpu-metrics/``. False for a launch that runs elsewhere and sets its own (a Slurm job: each node's
    ``meter-node`` writes into its part, nodes/<node>/hpu-metrics/): no such variables, no folder."""
    if device not in DEVICES:
        raise PrepareError([("device", f"unknown device {device!r}; one of {', '.join(DEVICES)}")])
    job, resumed_from = resolve_resume(job, resumed_from)
    problems = jobcheck.check(job, resumed_from=resumed_from)
    if problems:
        raise PrepareError(problems)
    clean_args, _removed = strip_secret_args(job.training_args)
    user_job = JobConfig.from_dict({**job.to_dict(), "training_args": clean_args})
    effective = JobConfig.from_dict(user_job.to_dict())
    effective.training_args = launch_mod.worker_training_args(user_job, device)
    store = store or RunStore()
    run = store.create(effective, user_job=user_job, default_output=outputs.default_output_dir)
    try:
        with contextlib.suppress(OSError):  # an unwritable folder: the worker says so, as "output_dir"
            outputs.claim(effective.output_dir, run, replace=effective.overwrite_output)
        variables = device_variables(device, {**(device_env or {}),
                                              **visibility.device_env(device, cards or ())})
        if device == "hpu" and compile_meter_here:
            # The bridge's compile meter, per rank, in the run's own folder (core/hpu_metrics); a
            # PT_HPU_METRICS_FILE the user set is theirs and is kept.
            inherited = os.environ if base_env is None else base_env
            if "PT_HPU_METRICS_FILE" not in variables and "PT_HPU_METRICS_FILE" not in inherited:
                variables.update(hpu_metrics.launch_env(run.folder))
                (run.folder / hpu_metrics.FOLDER_NAME).mkdir(mode=0o700, exist_ok=True)
        launch = launch_mod.build(effective, run.folder, device=device, device_env=variables, python=python)
        launch_mod.write_generated_config(launch)
        env = visibility.child_env(launch.env_extra, base_env)
        recorded = None if cards is None else {"requested": visibility.format_ids(cards), "device": device,
                                               "applied": device != "cpu" and bool(cards)}
        run.write_launch(launch.argv, launch.env_extra, launch.shell_command(), env, cards=recorded)
        run.write_versions(versions())
        run.update_status(origin=origin, resumed_from=resumed_from)
        # tee appends to it: create it private first (tee would make it 0644 under a usual umask).
        os.close(os.open(run.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600))
    except BaseException:
        shutil.rmtree(run.folder, ignore_errors=True)
        raise
    argv = launch_mod.supervised_argv(launch, run.log_path)
    return PreparedRun(run=run, job=effective, user_job=user_job, launch=launch, argv=argv, env=env,
                       device=device)


def resolve_resume(job: JobConfig, resumed_from: str) -> tuple[JobConfig, str]:
    """``job`` with ``resume_from_checkpoint="latest"`` made explicit: the resumed run's *own* last
    complete checkpoint (core/outputs.own_checkpoint), in that run's output folder. Without
    ``resumed_from``, "latest" resumes the run that owns the output folder. PrepareError when the
    run has no checkpoint of its own. Returns the job (a copy when changed) and the resumed run."""
    if job.resume_from_checkpoint != "latest":
        if job.resume_from_checkpoint and not resumed_from:
            # A checkpoint named by its path resumes the run that wrote it (the owner of its folder):
            # that run's lineage may write on in that folder.
            resumed_from = outputs.owner_of(Path(job.resume_from_checkpoint).expanduser().parent)
        return job, resumed_from
    if not resumed_from and job.output_dir.strip():
        resumed_from = outputs.owner_of(job.output_dir)
    if not resumed_from:
        return job, resumed_from  # a folder of an earlier version's run: the Trainer's "latest"
    parent = Run(resumed_from)
    checkpoint = outputs.own_checkpoint(parent)
    if checkpoint is None:
        raise PrepareError([("resume_from_checkpoint", f"{parent.name} has no complete checkpoint of "
                                                       f"its own to resume from")])
    resolved = JobConfig.from_dict(job.to_dict())
    resolved.resume_from_checkpoint = str(checkpoint)
    resolved.training_args["output_dir"] = str(checkpoint.parent)
    return resolved, resumed_from


def preview_command(job: JobConfig, *, device: str, device_env: Mapping[str, str] | None,
                    runs_root: Path) -> str:
    """The shell command Start would run for ``job`` now (credentials redacted)."""
    clean_args, _ = strip_secret_args(job.training_args)
    shown = JobConfig.from_dict({**job.to_dict(), "training_args": clean_args})
    launch = launch_mod.build(shown, runs_root / "<run>", device=device,
                              device_env=device_variables(device, device_env), port=29500)
    return redact(launch.shell_command())


def versions() -> dict[str, str]:
    from importlib import metadata
    out = {"python": sys.version.split()[0]}
    for name in ("gaudi-gui", "torch", "transformers", "accelerate", "peft", "datasets", "bitsandbytes",
                 "trl", "deepspeed", "optimum-habana"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


__all__ = ["DEVICES", "PrepareError", "PreparedRun", "child_env", "device_variables",
           "prepare_run", "preview_command", "probe_device", "resolve_resume", "versions"]
