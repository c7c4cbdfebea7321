"""A training job as a Slurm batch job: the sbatch script, and what squeue / scontrol / sacct say of it.

The script runs the same ``accelerate launch`` as a local run (``core/launch.py``), once per node:
``srun`` starts one task per node, and each task runs accelerate's multi-node launch with
``--machine_rank $SLURM_NODEID --num_machines $SLURM_NNODES --main_process_ip $MAIN`` where ``MAIN`` is
the first node of the allocation (``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1``). The
run folder is on the file system every node shares: the console goes to its log.txt (``--output``),
each node's first rank appends its events to its events.jsonl, and each rank records itself in
``ranks/`` with its host name.

Stopping with a checkpoint. ``scancel --signal=TERM`` on the job's step signals every process of the
step, the accelerate launcher included, and the launcher then SIGKILLs its ranks 5 s later (DESIGN.md):
a real checkpoint does not fit in 5 s. So a stop signals the batch shell only (``scancel --batch
--signal=USR1``); the script traps it and runs one more step (``srun --overlap``, one task per node)
that sends SIGTERM to the ranks recorded on that node (``python -m gaudi_gui.core.slurm signal-ranks``,
pid and create time checked). The ranks agree on the step, save, and end; the job then ends by itself.
With a time limit, ``--signal=B:USR1@S`` asks Slurm for the same stop S seconds before the limit.

Qt-free and torch-free; every word of the script that is not a Slurm variable is ``shlex.quote``d.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core import launch as launch_mod
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.remote import LOCAL
from gaudi_gui.core.runstore import SLURM_INFO, Run

#: What the batch shell traps as "stop with a checkpoint" (``scancel --batch --signal=USR1 JOB``).
STOP_SIGNAL = "USR1"
SCRIPT_NAME = "slurm.sh"
#: launch.main_process_ip while the job is prepared: the script replaces it with the first node.
MAIN_PLACEHOLDER = "slurm-first-node"
SQUEUE_FORMAT = "%i|%T|%r|%N"
SACCT_FIELDS = "JobID,State,ExitCode,NodeList"

RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"})
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})

_TIME = re.compile(r"^(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}"
                   r"|UNLIMITED|INFINITE)$", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z0-9._@:+=,/-]+$")
_JOB_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")


@dataclass
class SlurmOptions:
    """What the job asks of Slurm, beyond the job itself."""

    nodes: int = 1
    partition: str = ""
    #: A Slurm time limit: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]].
    time: str = ""
    account: str = ""
    #: Cards (processes) per node; 0: the job's launch.num_processes.
    cards_per_node: int = 0
    #: A generic resource request as the cluster names it (``gpu:8``); default for CUDA ``gpu:N``.
    gres: str = ""
    job_name: str = ""
    #: The device the nodes have: cpu, cuda or hpu.
    device: str = "cpu"
    #: The Python that runs gaudi-gui on the nodes (default: this one, on the shared file system).
    python: str = ""
    #: With a time limit: ask for a checkpoint stop this many seconds before it.
    stop_before_limit_s: int = 120
    #: On Gaudi: every node checks its cards (``core.preflight node``) before the launch.
    preflight: bool = True

    def validate(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if not isinstance(self.nodes, int) or self.nodes < 1:
            problems.append(("nodes", "the number of nodes must be at least 1"))
        if not isinstance(self.cards_per_node, int) or self.cards_per_node < 0:
            problems.append(("cards_per_node", "cards per node must be 0 (the job's) or more"))
        if self.time and not _TIME.match(self.time):
            problems.append(("time", f"not a Slurm time limit: {self.time!r} "
                                     f"(minutes, HH:MM:SS or D-HH:MM:SS)"))
        for name in ("partition", "account", "gres", "job_name"):
            value = getattr(self, name)
            if value and not _NAME.match(value):
                label = name.replace("_", " ")
                problems.append((name, f"{label} {value!r} has characters Slurm does not take"))
        if self.device not in ("cpu", "cuda", "hpu"):
            problems.append(("device", f"unknown device {self.device!r}"))
        if self.stop_before_limit_s < 0:
            problems.append(("stop_before_limit_s", "must be 0 or more seconds"))
        return problems


def slurm_job(job: JobConfig, options: SlurmOptions) -> JobConfig:
    """``job`` as one job over ``options.nodes`` machines: launch.num_machines set, the main address a
    placeholder the script fills in at run time, processes per node from the cards per node."""
    out = JobConfig.from_dict(job.to_dict())
    out.launch.num_machines = options.nodes
    out.launch.machine_rank = 0
    out.launch.main_process_ip = MAIN_PLACEHOLDER
    if options.cards_per_node:
        out.launch.num_processes = options.cards_per_node
    return out


_MULTI_NODE = ("--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port")


def task_words(launch_argv: Sequence[str], port: int) -> list[str]:
    """The launch's words for one node's task, each shell-quoted, with the node's machine rank, the
    node count and the main address as Slurm variables of the task."""
    words: list[str] = []
    skip = False
    module_at = len(launch_argv)
    for i, word in enumerate(launch_argv):
        if word == "-m" and i > 0:
            module_at = i
            break
    for word in launch_argv[:module_at]:
        if skip:
            skip = False
            continue
        if word in _MULTI_NODE:
            skip = True
            continue
        words.append(shlex.quote(word))
    words += ["--num_machines", '"$SLURM_NNODES"', "--machine_rank", '"$SLURM_NODEID"',
              "--main_process_ip", '"$MAIN"', "--main_process_port", shlex.quote(str(port))]
    words += [shlex.quote(w) for w in launch_argv[module_at:]]
    return words


def default_gres(options: SlurmOptions) -> str:
    if options.gres:
        return options.gres
    if options.device == "cuda" and options.cards_per_node:
        return f"gpu:{options.cards_per_node}"
    # Gaudi clusters name their cards in gres.conf as they choose: --gres says how.
    return ""


def _sbatch(option: str, value: str) -> str:
    return f"#SBATCH --{option}={shlex.quote(value)}"


def _node_check(options: SlurmOptions, q_python: str) -> list[str]:
    """The start gate on Gaudi nodes, known only once the job runs: each node checks its cards (the
    ones HABANA_VISIBLE_MODULES names, else all) and a held, dead or (multi-node) unlinked card ends the
    job here with the doctor's reason instead of failing the launch minutes later."""
    if options.device != "hpu" or not options.preflight:
        return []
    multi = " --multi-node" if options.nodes > 1 else ""
    return [
        "# Each node checks its cards first (gaudi-gui's start gate; train --no-preflight leaves it out).",
        f'if ! srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 {q_python} -m '
        f"gaudi_gui.core.preflight node{multi}; then",
        '    echo "gaudi-gui: the card check failed on a node (above): the job ends before the launch"',
        "    exit 1",
        "fi",
    ]


def _script_launch(job: JobConfig, folder: str, options: SlurmOptions) -> launch_mod.Launch:
    """The launch each node's task runs (the batch script exports its variables)."""
    return launch_mod.build(job, folder, device=options.device, python=options.python or sys.executable,
                            port=job.launch.main_process_port)


#: What each node's task (``meter_node``) records of the variables it set for its launch, in its part.
NODE_ENV_NAME = "env.json"
#: The batch script's one step: each node's task, once per node.
STEP = 'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$TASK"'


def node_task(job: JobConfig, run_folder: str | Path, options: SlurmOptions) -> str:
    """The shell line each node's task runs (the script's ``$TASK``): the launch under the node's own
    meter (``meter-node``: that node's cards, into nodes/<node>/meter.jsonl)."""
    folder = str(run_folder)
    python = options.python or sys.executable
    launch = _script_launch(job, folder, options)
    return (f"exec {shlex.quote(python)} -m gaudi_gui.core.slurm meter-node {shlex.quote(folder)} --device "
            f"{shlex.quote(options.device)} -- " + " ".join(task_words(launch.argv,
                                                                        int(job.launch.main_process_port))))


def record_command(job: JobConfig, run_folder: str | Path, options: SlurmOptions, script: str | Path, *,
                   login: str = "") -> None:
    """A Slurm run's command.txt and command.json say what runs: the sbatch line that submitted the
    batch script (on ``login`` over ssh where one is named), its one srun step and each node's task;
    ``prepare_run`` wrote them for a launch in one place, which never runs (no node uses its paths)."""
    from gaudi_gui.core import atomic
    from gaudi_gui.core.runstore import FILE_MODE
    from gaudi_gui.core.secrets import recorded_env, redact

    folder = Path(run_folder)
    argv = sbatch_argv(script)
    task = node_task(job, folder, options)
    where = f" on {login} (over ssh)" if login and login != LOCAL else ""
    text = "\n".join([
        f"# A Slurm job: the batch script {script} goes to Slurm{where} with the last line; on the",
        "# nodes it exports its variables (env.json) and runs one step, each node's task once per node:",
        f"#   {STEP}",
        "# each node's task ($TASK):",
        f"#   {task}",
        " ".join(shlex.quote(a) for a in argv)]) + "\n"
    atomic.write_text(folder / "command.txt", redact(text), mode=FILE_MODE)
    exported = _script_launch(job, str(folder), options).env_extra
    atomic.write_json(folder / "command.json", {
        "argv": [redact(a) for a in argv], "env": recorded_env(exported, ())["set_by_gaudi_gui"],
        "slurm": {"script": str(script), "login": login or LOCAL, "step": STEP, "node_task": redact(task)}},
        mode=FILE_MODE)


def record_env(job: JobConfig, run_folder: str | Path, options: SlurmOptions) -> None:
    """A Slurm run's env.json says what its nodes use, not what a run in one place would: the
    variables the batch script exports (its launch's), and where each node records what it adds
    itself (``meter_node``: on Gaudi the bridge's compile meter, PT_HPU_METRICS_FILE in that node's
    own part, ``nodes/<node>/hpu-metrics/``; the run folder is shared, so never one path for all).
    ``prepare_run`` wrote env.json for its own launch (PT_HPU_METRICS_FILE in the run folder, which
    no node uses): it is rewritten here; its other keys (cards, inherited secret names) stay."""
    from gaudi_gui.core import atomic
    from gaudi_gui.core.runstore import FILE_MODE
    from gaudi_gui.core.secrets import recorded_env

    path = Path(run_folder) / "env.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    exported = _script_launch(job, str(run_folder), options).env_extra
    data["set_by_gaudi_gui"] = recorded_env(exported, ())["set_by_gaudi_gui"]
    data["per_node"] = {
        "recorded_in": f"{NODES_DIR}/<node>/{NODE_ENV_NAME}",
        "note": "each node's task (python -m gaudi_gui.core.slurm meter-node) adds its own variables to "
                "the exported ones and records them in its part" + (
                    ": PT_HPU_METRICS_FILE in nodes/<node>/hpu-metrics/ (the bridge's compile meter)"
                    if options.device == "hpu" else "")}
    atomic.write_json(path, data, mode=FILE_MODE)


def sbatch_script(job: JobConfig, run_folder: str | Path, options: SlurmOptions) -> str:
    """The batch script for ``job`` (as prepared: ``slurm_job``) whose run folder is ``run_folder``."""
    folder = str(run_folder)
    python = options.python or sys.executable
    if "\n" in folder or "\n" in python:
        raise ValueError("a run folder or Python path with a line break cannot go in a batch script")
    launch = _script_launch(job, folder, options)
    port = int(job.launch.main_process_port)
    name = options.job_name or f"gaudi-gui-{Path(folder).name}"[:64]
    lines = ["#!/bin/bash",
             _sbatch("job-name", name),
             _sbatch("nodes", str(options.nodes)),
             "#SBATCH --ntasks-per-node=1"]
    gres = default_gres(options)
    if gres:
        lines.append(_sbatch("gres", gres))
    if options.time:
        lines.append(_sbatch("time", options.time))
    if options.partition:
        lines.append(_sbatch("partition", options.partition))
    if options.account:
        lines.append(_sbatch("account", options.account))
    lines += [_sbatch("chdir", folder),
              _sbatch("output", str(Path(folder) / "log.txt")),
              "#SBATCH --open-mode=append"]
    if options.time and options.stop_before_limit_s:
        lines.append(f"#SBATCH --signal=B:{STOP_SIGNAL}@{int(options.stop_before_limit_s)}")
    q_python, q_folder = shlex.quote(python), shlex.quote(folder)
    stop_step = (f'srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 {q_python} -m '
                 f"gaudi_gui.core.slurm signal-ranks {q_folder}")
    # Each node's task runs under its own meter (``meter-node``): that node's cards, into
    # nodes/<node>/meter.jsonl; the batch shell sums the nodes' parts once the step has ended.
    task = node_task(job, folder, options)
    exports = [f"export {k}={shlex.quote(v)}" for k, v in sorted(launch.env_extra.items())]
    lines += [
        f"# gaudi-gui training job; run folder (on the file system every node shares): {folder}",
        f"# Stop with a checkpoint: scancel --batch --signal={STOP_SIGNAL} JOBID (the ranks save at the",
        "# end of their current step); plain scancel JOBID kills without one.",
        "set -u",
        "STOP=0",
        "stop_ranks() {",
        "    STOP=1",
        '    echo "gaudi-gui: $1: asking every node\'s ranks to save a checkpoint at the end of this step"',
        f"    {stop_step} || true",
        "}",
        f"trap 'stop_ranks SIG{STOP_SIGNAL}' {STOP_SIGNAL}",
        "trap 'stop_ranks SIGTERM' TERM",
        *exports,
        'MAIN=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        "export MAIN",
        f'echo "gaudi-gui: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST; main process $MAIN:{port}"',
        *_node_check(options, q_python),
        "# Each node's task: accelerate's multi-node launch, its machine rank from SLURM_NODEID.",
        "TASK=$(cat <<'GAUDI_GUI_TASK'",
        task,
        "GAUDI_GUI_TASK",
        ")",
        'if [ "$STOP" = 1 ]; then exit 0; fi',
        f"{STEP} &",
        "STEP=$!",
        "# A trapped signal interrupts wait: wait again until the step has really ended.",
        'while kill -0 "$STEP" 2>/dev/null; do wait "$STEP"; done',
        'wait "$STEP"',
        "CODE=$?",
        "# The job's meter: every node's part summed; a node that measured nothing is named, never 0.",
        f'{q_python} -m gaudi_gui.core.slurm combine-meter {q_folder} '
        '$(scontrol show hostnames "$SLURM_JOB_NODELIST") || true',
        'exit "$CODE"',
    ]
    return "\n".join(lines) + "\n"


# -- commands --------------------------------------------------------------------------------------------

def sbatch_argv(script: str | Path) -> list[str]:
    return ["sbatch", "--parsable", str(script)]


def squeue_argv(job_id: str) -> list[str]:
    return ["squeue", "--noheader", "--states=all", "--jobs", job_id, "--format", SQUEUE_FORMAT]


def scontrol_argv(job_id: str) -> list[str]:
    return ["scontrol", "--oneliner", "show", "job", job_id]


def sacct_argv(job_id: str) -> list[str]:
    return ["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", job_id, "--format", SACCT_FIELDS]


def scancel_argv(job_id: str, *, stop: bool) -> list[str]:
    """``stop``: the checkpoint stop (the batch shell's trap); else cancel (Slurm ends every process)."""
    if stop:
        return ["scancel", "--batch", f"--signal={STOP_SIGNAL}", job_id]
    return ["scancel", job_id]


# -- parsing ---------------------------------------------------------------------------------------------

@dataclass
class JobInfo:
    job_id: str
    #: Slurm's word: PENDING, RUNNING, COMPLETED, CANCELLED, ...
    state: str
    reason: str = ""
    nodes: str = ""
    #: The batch script's exit status; negative: killed by that signal; None: not known.
    exit_code: int | None = None

    @property
    def phase(self) -> str:
        """"pending", "running" or "ended"."""
        if self.state in FINAL_STATES:
            return "ended"
        if self.state in RUNNING_STATES:
            return "running"
        return "pending"


def parse_sbatch(text: str) -> str:
    """The job id ``sbatch --parsable`` printed ("123" or "123;cluster"); ValueError otherwise."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("sbatch printed no job id")
    job_id = lines[-1].split(";", 1)[0]
    if not _JOB_ID.match(job_id):
        raise ValueError(f"sbatch printed {lines[-1]!r}, not a job id")
    return job_id


def _state_word(text: str) -> str:
    # sacct: "CANCELLED by 0"; scontrol: "CANCELLED"; some versions add "+" to a truncated word.
    return text.strip().split(" ", 1)[0].rstrip("+").upper()


def _exit_code(text: str) -> int | None:
    code, _, sig = text.strip().partition(":")
    try:
        number, signum = int(code), int(sig or 0)
    except ValueError:
        return None
    return -signum if signum else number


def parse_squeue(text: str) -> dict[str, JobInfo]:
    """``squeue --noheader --format '%i|%T|%r|%N'`` lines, by job id."""
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0]:
            continue
        reason = parts[2] if len(parts) > 2 else ""
        out[parts[0]] = JobInfo(parts[0], _state_word(parts[1]), "" if reason == "None" else reason,
                                parts[3] if len(parts) > 3 else "")
    return out


def parse_sacct(text: str) -> dict[str, JobInfo]:
    """``sacct --noheader --parsable2 --allocations --format JobID,State,ExitCode,NodeList`` lines."""
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0] or "." in parts[0]:
            continue
        out[parts[0]] = JobInfo(parts[0], _state_word(parts[1]), "", parts[3] if len(parts) > 3 else "",
                                _exit_code(parts[2]))
    return out


def parse_scontrol(text: str) -> JobInfo | None:
    """``scontrol --oneliner show job ID``: Key=Value words (values without spaces, but Command= and
    the paths may hold some: read up to the next known key)."""
    values: dict[str, str] = {}
    for match in re.finditer(r"(?:^|\s)([A-Za-z/:]+)=(\S*)", text):
        values.setdefault(match.group(1), match.group(2))
    if "JobId" not in values or "JobState" not in values:
        return None
    reason = values.get("Reason", "")
    return JobInfo(values["JobId"], _state_word(values["JobState"]), "" if reason == "None" else reason,
                   "" if values.get("NodeList") == "(null)" else values.get("NodeList", ""),
                   _exit_code(values.get("ExitCode", "")))


Runner = Callable[[list[str]], tuple[int, str, str]]


@dataclass
class Query:
    """Where a job stands, asked of squeue first, then scontrol (the exit code), then sacct (a job the
    controller has forgotten). ``errors`` keeps what the commands said when none knew the job."""

    run: Runner
    errors: list[str] = field(default_factory=list)

    def __call__(self, job_id: str) -> JobInfo | None:
        self.errors = []
        code, out, err = self.run(squeue_argv(job_id))
        info = parse_squeue(out).get(job_id) if code == 0 else None
        if code != 0:
            self.errors.append(f"squeue: {err.strip() or code}")
        if info is not None and info.phase != "ended":
            return info
        code, out, err = self.run(scontrol_argv(job_id))
        detailed = parse_scontrol(out) if code == 0 else None
        if detailed is not None and (info is None or detailed.phase == "ended"):
            return detailed
        if code != 0:
            self.errors.append(f"scontrol: {err.strip() or code}")
        code, out, err = self.run(sacct_argv(job_id))
        accounted = parse_sacct(out).get(job_id) if code == 0 else None
        if accounted is not None:
            return accounted
        if code != 0:
            self.errors.append(f"sacct: {err.strip() or code}")
        return info


# -- the stop step on each node ------------------------------------------------------------------------------

def signal_ranks(folder: str | Path, signum: int = signal.SIGTERM, host: str | None = None) -> list[int]:
    """Signal the ranks of the run in ``folder`` that recorded themselves on this host (pid and create
    time checked): the pids signalled."""
    from gaudi_gui.core.proctree import ProcessRef
    from gaudi_gui.core.runstore import Run
    here = host or socket.gethostname()
    done = []
    for record in Run(folder).ranks():
        if record.get("host") != here:
            continue
        ref = ProcessRef.from_dict(record)
        if ref is not None and ref.is_alive() and ref.signal(signum):
            done.append(ref.pid)
    return done


# -- the run meter on each node ----------------------------------------------------------------------------

#: Each node's part of the meter: <run folder>/nodes/<node>/meter.jsonl and meter-summary.json.
#: core.meter_files.NODES_DIR too (the meter is not imported here: a node's commands start lean).
NODES_DIR = "nodes"


def node_name() -> str:
    """This node as Slurm names it (``SLURMD_NODENAME`` in a step; the host name elsewhere): what
    ``scontrol show hostnames`` lists, so the job's summary names a node that measured nothing."""
    return (os.environ.get("SLURMD_NODENAME") or socket.gethostname()).split(".")[0] or "node"


def meter_node(folder: str | Path, device: str, argv: Sequence[str]) -> int:
    """Run ``argv`` (this node's launch) under a run meter of this node's own cards (the launch's
    HABANA_VISIBLE_MODULES / CUDA_VISIBLE_DEVICES, else every card of the node), written to
    ``<folder>/nodes/<node>/``; returns the launch's exit status (128 + N when killed by signal N).
    The meter never stops the launch: a meter that cannot start is said, and the launch runs."""
    import subprocess

    from gaudi_gui.core import hpu_metrics, meter_words
    from gaudi_gui.core import meter as meter_mod

    node = node_name()
    part = Path(folder) / NODES_DIR / node
    env = dict(os.environ)
    if device == "hpu" and "PT_HPU_METRICS_FILE" not in env:
        # The bridge's compile meter of this node's ranks, in this node's part (per-rank names; the
        # run folder is shared, so each node has its own folder); one the user set is theirs and kept.
        env.update(hpu_metrics.launch_env(part))
        with contextlib.suppress(OSError):
            (part / hpu_metrics.FOLDER_NAME).mkdir(mode=0o700, parents=True, exist_ok=True)
    events_path = Path(folder) / "events.jsonl"
    meter: Any = None
    with contextlib.suppress(OSError):
        # What this node's launch gets beyond the batch script's exports (the run's env.json says
        # where to look): the compile meter's path in this node's part, or the one the user set.
        from gaudi_gui.core import atomic
        added = {k: v for k, v in env.items() if os.environ.get(k) != v}
        part.mkdir(parents=True, exist_ok=True)
        atomic.write_json(part / NODE_ENV_NAME, {
            "node": node, "set_by_gaudi_gui": added,
            "kept_from_the_job": {k: os.environ[k] for k in hpu_metrics.launch_env(part) if k in os.environ}},
            mode=0o600)
    try:
        part.mkdir(parents=True, exist_ok=True)
        # The steps come from the run's events (the folder every node shares: rank 0's "metrics",
        # this node's first rank's "step"); a compile warning goes there too, naming this node.
        meter = meter_mod.Meter(part, device=device, env=env, events_path=events_path, part=node)
        meter.start()
    except Exception as exc:  # an observer: whatever it meets, the launch goes on
        print(f"gaudi-gui: {node}: meter: cannot start: {exc}", flush=True)
        meter = None
    # scancel signals every process of the step, the launcher included: this wrapper outlives the
    # signal to write the node's summary once the launch has ended (a handler, not SIG_IGN, which
    # the launch would inherit).
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, lambda *_: None)
    try:
        proc = subprocess.Popen(list(argv), env=env)
    except OSError as exc:
        print(f"gaudi-gui: {node}: cannot start the launch: {exc}", flush=True)
        code = 127
    else:
        code = proc.wait()
        code = 128 - code if code < 0 else code
    if meter is not None:
        try:
            extra: dict[str, Any] = {"node": node}
            base = env.get("PT_HPU_METRICS_FILE") if device == "hpu" else None
            if base:
                from gaudi_gui.core.events import read_events
                compiled = hpu_metrics.run_summary(base, read_events(events_path))
                if compiled is not None:
                    extra["compile"] = compiled
            summary = meter.stop(extra=extra)
            print(f"gaudi-gui: {node}: meter: {meter_words.describe(summary)}", flush=True)
            if isinstance(summary.get("compile"), dict) and "compilations" in summary["compile"]:
                print(f"gaudi-gui: {node}: compile meter: {hpu_metrics.describe(summary['compile'])}",
                      flush=True)
            if summary.get("compile_warning"):
                from gaudi_gui.core.compile_rise import rise_text
                print(f"gaudi-gui: {rise_text(summary['compile_warning'])}", flush=True)
        except Exception as exc:
            print(f"gaudi-gui: {node}: meter: cannot finish: {exc}", flush=True)
    return code


def combine_meter(folder: str | Path, nodes: Sequence[str] = ()) -> dict[str, Any] | None:
    """The job's meter: each node's part (``<folder>/nodes/<node>/meter-summary.json``) summed with
    ``core.meter_account.combine`` into ``<folder>/meter-summary.json``. ``nodes``: the job's nodes (a node
    without a part is named in the note, never counted as 0); none given: the parts found. None when
    there is nothing to combine."""
    from gaudi_gui.core import atomic, meter_account, meter_files

    root = Path(folder) / NODES_DIR
    names = list(dict.fromkeys(n.split(".")[0] for n in nodes if n.strip()))
    if not names:
        with contextlib.suppress(OSError):
            names = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not names:
        return None
    combined = meter_account.combine([(name, meter_files.read_summary(root / name)) for name in names])
    combined["source"] = "slurm nodes"
    atomic.write_json(Path(folder) / meter_files.SUMMARY_NAME, combined)
    return combined


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["meter-node"] and "--" in words:
        # meter-node FOLDER [--device D] -- LAUNCH...: the launch's own words are never ours to parse.
        cut = words.index("--")
        mine = argparse.ArgumentParser(prog="python -m gaudi_gui.core.slurm meter-node")
        mine.add_argument("folder")
        mine.add_argument("--device", default="cpu", choices=("cpu", "cuda", "hpu"))
        ours = mine.parse_args(words[1:cut])
        return meter_node(ours.folder, ours.device, words[cut + 1:])
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.core.slurm")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("signal-ranks", help="SIGTERM the run's ranks on this node (the checkpoint stop)")
    p.add_argument("folder")
    sub.add_parser("meter-node", help="FOLDER [--device D] -- LAUNCH...: run this node's launch under a "
                   "meter of its own cards")
    c = sub.add_parser("combine-meter", help="sum the nodes' meters into the job's meter summary")
    c.add_argument("folder")
    c.add_argument("nodes", nargs="*")
    args = parser.parse_args(words)
    if args.action == "meter-node":
        parser.error("meter-node FOLDER [--device D] -- LAUNCH...")
    if args.action == "combine-meter":
        from gaudi_gui.core import meter_words
        combined = combine_meter(args.folder, args.nodes)
        said = meter_words.combined_line(combined) if combined else "no node was metered"
        print(f"gaudi-gui: meter: {said}", flush=True)
        return 0
    pids = signal_ranks(args.folder)
    where = socket.gethostname()
    if pids:
        print(f"gaudi-gui: {where}: SIGTERM sent to rank pid(s) {', '.join(map(str, pids))}", flush=True)
        return 0
    print(f"gaudi-gui: {where}: no running rank of this run here", flush=True)
    return 1


def read_info(run: Run) -> dict[str, Any]:
    """The run's slurm.json (job id, login host, options); ValueError (one line) when it is not a
    Slurm run or the file is unreadable."""
    path = run.folder / SLURM_INFO
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{run.folder} is not a Slurm run (no {SLURM_INFO})") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(info, dict) or not str(info.get("job_id") or "").strip():
        raise ValueError(f"{path} names no Slurm job")
    return info


def options_of(info: dict[str, Any]) -> SlurmOptions:
    """The sbatch options a run was submitted with (defaults for a slurm.json older than them)."""
    saved = info.get("options")
    if not isinstance(saved, dict):
        saved = {}
    known = {f.name for f in dataclasses.fields(SlurmOptions)}
    return SlurmOptions(**{k: v for k, v in saved.items() if k in known})


def write_info(run: Run, info: dict[str, Any]) -> None:
    """Write the run's slurm.json (private, as every file of a run folder)."""
    from gaudi_gui.core.runstore import _private_write
    _private_write(run.folder / SLURM_INFO, json.dumps(info, indent=2))


__all__ = [
    "FINAL_STATES",
    "MAIN_PLACEHOLDER",
    "NODES_DIR",
    "SCRIPT_NAME",
    "STEP",
    "STOP_SIGNAL",
    "JobInfo",
    "Query",
    "SlurmOptions",
    "combine_meter",
    "meter_node",
    "node_name",
    "node_task",
    "options_of",
    "parse_sacct",
    "parse_sbatch",
    "parse_scontrol",
    "parse_squeue",
    "read_info",
    "record_command",
    "record_env",
    "sacct_argv",
    "sbatch_argv",
    "sbatch_script",
    "scancel_argv",
    "scontrol_argv",
    "signal_ranks",
    "slurm_job",
    "squeue_argv",
    "task_words",
    "write_info",
]

if __name__ == "__main__":
    sys.exit(main())


@dataclass
class SlurmTarget:
    """Where and how a job goes to Slurm: the sbatch options and the login host's name (``local``:
    sbatch on this machine)."""

    options: SlurmOptions
    login: str = LOCAL

    def words(self, *, grace_s: float, resumed_from: str = "") -> list[str]:
        """``gaudi-gui train`` words for this target, as the agent's ``job.start`` takes them (the agent
        adds the job file, ``--detach``, ``--json`` and the runs folder)."""
        o = self.options
        argv = ["--slurm", "--device", o.device, "--grace", repr(float(grace_s)), "--nodes", str(o.nodes)]
        for flag, value in (("--partition", o.partition), ("--time", o.time), ("--account", o.account),
                            ("--gres", o.gres), ("--node-python", o.python)):
            if value:
                argv += [flag, value]
        if o.cards_per_node:
            argv += ["--cards-per-node", str(o.cards_per_node)]
        if self.login and self.login != LOCAL:
            argv += ["--login", self.login]
        if resumed_from:
            argv += ["--resumed-from", resumed_from]
        return argv

    def script(self, job: JobConfig, runs_root: str | Path) -> str:
        """The sbatch script as ``train --slurm --print-script`` shows it (the folder is ``<run>``)."""
        return sbatch_script(slurm_job(job, self.options), Path(runs_root) / "<run>", self.options)

    def problems(self, job: JobConfig) -> list[tuple[str, str]]:
        return self.options.validate() + slurm_job(job, self.options).validate()

    def to_record(self) -> dict[str, str]:
        """The options and the login host as strings (a placement's ``slurm`` part)."""
        return {**{f.name: str(getattr(self.options, f.name)) for f in dataclasses.fields(SlurmOptions)},
                "login": self.login}

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> SlurmTarget:
        """The target ``to_record`` wrote; a missing or damaged value takes its default (``validate``
        then says what is wrong with the rest)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(SlurmOptions):
            if f.name not in data:
                continue
            text = str(data[f.name])
            if isinstance(f.default, bool):
                values[f.name] = text.lower() in ("1", "true", "yes")
            elif isinstance(f.default, int):
                with contextlib.suppress(ValueError):
                    values[f.name] = int(text)
            else:
                values[f.name] = text
        return cls(SlurmOptions(**values), str(data.get("login") or LOCAL))
