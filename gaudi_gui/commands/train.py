"""``gaudi-gui train --config FILE``: the same launch the Training tab makes, from a terminal.

The run folder is written exactly as the tab writes it; the log streams live; Ctrl-C stops the
workers gracefully (checkpoint at the next step), then kills the process group after a grace period.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

from gaudi_gui.core import launch as launch_mod
from gaudi_gui.core import metrics as metrics_mod
from gaudi_gui.core import protocol
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError
from gaudi_gui.core.runstore import RunStore


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run a training job (the JSON the Training tab saves)")
    p.add_argument("--config", required=True, help="job config JSON")
    p.add_argument("--runs-dir", default="", help="where the run folder goes (default: data folder)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "hpu"),
                   help="accelerator to launch for (default: cpu)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds from Ctrl-C to SIGKILL")


def _stop(proc: subprocess.Popen[str], grace: float) -> None:
    import psutil
    try:
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if launch_mod.WORKER_MODULE in " ".join(c.cmdline())]
    except psutil.Error:
        workers = []
    for w in workers:
        with contextlib.suppress(psutil.Error):
            w.send_signal(signal.SIGTERM)
    if not workers:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        for w in workers:
            with contextlib.suppress(psutil.Error):
                w.kill()
        proc.wait()


def run(args: argparse.Namespace) -> int:
    try:
        job = JobConfig.load(args.config)
    except JobConfigError as exc:
        print(f"gaudi-gui train: {exc}", file=sys.stderr)
        return 2
    problems = job.validate()
    if problems:
        for field, problem in problems:
            print(f"gaudi-gui train: {field}: {problem}", file=sys.stderr)
        return 2
    effective = JobConfig.from_dict(job.to_dict())
    effective.training_args = launch_mod.worker_training_args(job, args.device)
    store = RunStore(args.runs_dir or None)
    run_ = store.create(effective)
    launch = launch_mod.build(effective, run_.folder, device=args.device)
    launch_mod.write_generated_config(launch)
    env = launch.env()
    run_.write_launch(launch.argv, launch.env_extra, launch.shell_command(), env)
    print(f"run folder: {run_.folder}", flush=True)
    argv = launch_mod.supervised_argv(launch, run_.log_path)
    started = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=str(run_.folder), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                            start_new_session=True)
    run_.update_status(state="running", pid=proc.pid, started_at=started)
    records: list[dict[str, Any]] = []
    error: dict[str, Any] = {}
    kinds: set[str] = set()
    interrupted = False
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            message: dict[str, Any] | None
            try:
                message = protocol.decode(line)
            except protocol.ProtocolError:
                message = None
            if message is None:
                print(line, flush=True)
                continue
            kind = str(message.get("type"))
            kinds.add(kind)
            if kind == "metrics":
                records.append(message)
            elif kind == "error" and not error:
                error = message
        proc.wait()
    except KeyboardInterrupt:
        interrupted = True
        print("\nstopping (checkpoint at the next step; Ctrl-C again is ignored)...", file=sys.stderr)
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            _stop(proc, args.grace)
    code = proc.returncode if proc.returncode is not None else -1
    if interrupted:
        state = "stopped" if "stopped" in kinds or code == 0 else "killed"
    else:
        state = "finished" if code == 0 else "failed"
    run_.update_status(state=state, ended_at=time.time(), exit_code=code,
                       final_loss=metrics_mod.final_loss(records) if records
                       else metrics_mod.final_loss(run_.metrics()),
                       error=str(error.get("message", "")), error_kind=str(error.get("kind", "")))
    if error:
        print(f"gaudi-gui train: training failed ({error.get('kind')}): {error.get('message')}",
              file=sys.stderr)
    elif state != "finished":
        print(f"gaudi-gui train: run {state} (exit code {code}); log: {run_.log_path}", file=sys.stderr)
    else:
        print(f"finished: final loss {metrics_mod.final_loss(records)}; run folder {run_.folder}")
    return 0 if state in ("finished", "stopped") else 1
