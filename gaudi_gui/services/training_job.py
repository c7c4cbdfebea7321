"""Supervising training launches: one ``TrainingJob`` per run, plus the schema/validation children.

``TrainingJob`` starts ``accelerate launch`` (wrapped so ``tee`` appends everything to the run's
log.txt) through ProcessRunner in a new session, turns protocol events into signals, keeps the run's
status.json current, and stops the whole tree: SIGTERM to the training workers (they save a JIT
checkpoint at the next step and exit), SIGKILL of the group and every recorded descendant after the
grace period, then a check that nothing is left. It can also re-attach to a run left running by a
previous session, following its files and its pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import launch as launch_mod
from gaudi_gui.core import metrics as metrics_mod
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStatus, RunStore, is_pid_alive
from gaudi_gui.core.training_args import Schema, load_cached, save_cached
from gaudi_gui.services.process import EXIT_CRASHED, EXIT_FAILED_TO_START, ProcessRunner, describe_exit


def _versions() -> dict[str, str]:
    from importlib import metadata
    out = {"python": sys.version.split()[0]}
    for name in ("gaudi-gui", "torch", "transformers", "accelerate", "peft", "datasets", "bitsandbytes"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def _worker_pids(root_pid: int) -> list[psutil.Process]:
    """The training worker processes under ``root_pid`` (not the launcher, not tee)."""
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if launch_mod.WORKER_MODULE in " ".join(child.cmdline()):
                out.append(child)
    return out


class TrainingJob(QObject):
    """One training run: launched here, or re-attached from a previous session."""

    #: The launcher is running; carries its pid.
    started = Signal(int)
    #: A complete log line (stdout and stderr merged, protocol lines excluded).
    log_line_received = Signal(str)
    #: The newest tqdm ``\\r`` rewrite of the unfinished line.
    progress_line = Signal(str)
    #: A metrics record from the worker's callback (step, max_steps, loss, learning_rate, ...).
    metrics_received = Signal(dict)
    #: Any other protocol event from the worker (phase, training_started, checkpoint_saved, error...).
    event_received = Signal(dict)
    #: The run's state changed: queued / running / finished / failed / stopped / killed.
    status_changed = Signal(str)
    #: The run ended: (exit code, final state, last log lines).
    finished = Signal(int, str, list)

    def __init__(self, store: RunStore | None = None, *, stop_grace_s: float = 30.0,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store or RunStore()
        self.stop_grace_s = stop_grace_s
        self.run: Run | None = None
        self.job: JobConfig | None = None
        self.launch: launch_mod.Launch | None = None
        self.state = "idle"
        self.error: dict[str, Any] | None = None
        self.progress = metrics_mod.Progress()
        self.records: list[dict[str, Any]] = []
        self.leftover_pids: list[int] = []
        self._stop_requested = False
        self._escalated = False
        self._kinds: set[str] = set()
        self._runner = ProcessRunner(self, tail_lines=60)
        self._runner.started.connect(self._on_started)
        self._runner.line_received.connect(self._on_line)
        self._runner.progress_received.connect(self._on_progress)
        self._runner.message_received.connect(self._on_message)
        self._runner.finished.connect(self._on_finished)
        self._kill_timer = QTimer(self)
        self._kill_timer.setSingleShot(True)
        self._kill_timer.timeout.connect(self._escalate)
        # Re-attached runs: follow the files and the pid.
        self._attached_pid = 0
        self._follow = QTimer(self)
        self._follow.setInterval(500)
        self._follow.timeout.connect(self._poll_files)
        self._offsets = {"log": 0, "metrics": 0}
        self._partial = {"log": "", "metrics": ""}

    # -- state ------------------------------------------------------------------------------------

    def is_running(self) -> bool:
        return self._runner.is_running() or self._follow.isActive()

    @property
    def attached(self) -> bool:
        return self._follow.isActive()

    @property
    def pid(self) -> int:
        return self._runner.pid or self._attached_pid

    def describe(self) -> str:
        name = self.run.name if self.run else "training"
        return f"training run {name} ({self.state}, step {self.progress.step}/{self.progress.max_steps})"

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.status_changed.emit(state)

    # -- launching --------------------------------------------------------------------------------

    def start(self, job: JobConfig, *, device: str = "cpu",
              device_env: Mapping[str, str] | None = None) -> Run:
        """Create the run folder and start the launch; raises ValueError listing the problems."""
        if self.is_running():
            raise RuntimeError("this job is already running")
        problems = job.validate()
        if problems:
            raise ValueError("; ".join(f"{field}: {msg}" for field, msg in problems))
        effective = JobConfig.from_dict(job.to_dict())
        effective.training_args = launch_mod.worker_training_args(job, device)
        run = self.store.create(effective)
        launch = launch_mod.build(effective, run.folder, device=device, device_env=device_env)
        launch_mod.write_generated_config(launch)
        env = launch.env()
        run.write_launch(launch.argv, launch.env_extra, launch.shell_command(), env)
        run.write_versions(_versions())
        self.run, self.job, self.launch = run, effective, launch
        self.records = []
        self.progress = metrics_mod.Progress()
        self.error = None
        self.leftover_pids = []
        self._stop_requested = self._escalated = False
        self._kinds = set()
        run.update_status(state="queued", output_dir=effective.output_dir)
        self._set_state("queued")
        argv = launch_mod.supervised_argv(launch, run.log_path)
        self._runner.start(argv[0], argv[1:], env=env, cwd=str(run.folder), new_session=True)
        return run

    def _on_started(self, pid: int) -> None:
        if self.run:
            self.run.update_status(state="running", pid=pid, started_at=time.time())
        self._set_state("running")
        self.started.emit(pid)

    def _on_progress(self, _stream: str, text: str) -> None:
        # A real method, not a lambda: a lambda slot would return emit()'s True, and PySide6 on
        # Python 3.11 drops a reference to it each time until the interpreter aborts.
        self.progress_line.emit(text)

    def _on_line(self, _stream: str, line: str) -> None:
        self.log_line_received.emit(line)

    def _on_message(self, message: dict) -> None:
        kind = message.get("type")
        if kind == "metrics":
            self._take_metrics(message)
            return
        if kind == "training_started" and isinstance(message.get("max_steps"), int):
            self.progress.max_steps = message["max_steps"]
        self._kinds.add(str(kind))
        if kind == "error" and self.error is None:
            self.error = message
        self.event_received.emit(message)

    def _take_metrics(self, record: dict) -> None:
        record = {k: v for k, v in record.items() if k != "type"}
        self.records.append(record)
        self.progress.update(record)
        if self.run and isinstance(record.get("step"), int) and len(self.records) % 10 == 1:
            self.run.update_status(step=record["step"], max_steps=self.progress.max_steps)
        self.metrics_received.emit(record)

    # -- stopping ---------------------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop: SIGTERM the workers (checkpoint at the next step), SIGKILL all after grace."""
        if not self.is_running() or self._stop_requested:
            return
        self._stop_requested = True
        grace = self.stop_grace_s if grace_s is None else grace_s
        root = self.pid
        workers = _worker_pids(root)
        if workers:
            # Only the workers: the single-process launcher would die at once on SIGTERM and its
            # supervisor would then kill the worker before its checkpoint is written.
            for proc in workers:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGTERM)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(root, signal.SIGTERM)
        self.log_line_received.emit(f"[gaudi-gui] stop requested: SIGTERM sent to "
                                    f"{len(workers) or 'the process group of'} "
                                    f"{'worker(s)' if workers else root}; SIGKILL in {grace:g} s")
        self._kill_timer.start(int(grace * 1000))

    def kill(self) -> None:
        """Immediate SIGKILL of the whole tree."""
        if not self.is_running():
            return
        self._stop_requested = True
        self._escalate()

    def _escalate(self) -> None:
        self._escalated = True
        self.log_line_received.emit("[gaudi-gui] grace period over: killing the process tree")
        if self._runner.is_running():
            self._runner.kill_tree()
        elif self._attached_pid:
            for proc in _worker_pids(self._attached_pid):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._attached_pid, signal.SIGKILL)

    # -- the end ----------------------------------------------------------------------------------

    def _final_state(self, code: int, status: str) -> str:
        if status == EXIT_FAILED_TO_START:
            return "failed"
        if "finished" in self._kinds and code == 0:
            return "finished"
        if self._stop_requested:
            if "stopped" in self._kinds and not self._escalated:
                return "stopped"
            return "killed" if self._escalated or status == EXIT_CRASHED else "stopped"
        if status == EXIT_CRASHED or code in (137, -9):
            return "killed"
        return "failed" if code != 0 else "finished"

    def _on_finished(self, code: int, status: str) -> None:
        self._kill_timer.stop()
        self._end(code, status, describe_exit(code, status), self._runner.tail(30))

    def _end(self, code: int, status: str, description: str, tail: list[str]) -> None:
        self._kill_timer.stop()
        self._follow.stop()
        self.leftover_pids = [p for p in self._runner.alive_descendants()]
        state = self._final_state(code, status)
        if self.leftover_pids:
            self.log_line_received.emit(f"[gaudi-gui] WARNING: processes still alive after the run: "
                                        f"{self.leftover_pids}")
        if self.run:
            final = metrics_mod.final_loss(self.records) if self.records else \
                metrics_mod.final_loss(self.run.metrics())
            error = self.error or {}
            self.run.update_status(state=state, ended_at=time.time(), exit_code=code,
                                   exit_description=description, final_loss=final,
                                   step=self.progress.step, max_steps=self.progress.max_steps,
                                   error=str(error.get("message", "")), error_kind=str(error.get("kind", "")))
            self.run.close()
        self._set_state(state)
        self.finished.emit(code, state, tail)

    # -- re-attaching -----------------------------------------------------------------------------

    def detach(self) -> None:
        """Leave the launch running after the app exits (its log keeps going to log.txt)."""
        self._runner.detach()
        self._follow.stop()

    def attach(self, run: Run) -> bool:
        """Follow a run started by an earlier session; False when its process is gone."""
        status = run.status()
        if status.state not in ("queued", "running") or not is_pid_alive(status.pid):
            if status.state in ("queued", "running"):
                run.update_status(state="failed", ended_at=time.time(),
                                  exit_description="ended while the app was closed (exit code unknown)")
            return False
        self.run = run
        with contextlib.suppress(Exception):
            self.job = run.job()
        self._attached_pid = status.pid
        self.records = run.metrics()
        self.progress = metrics_mod.Progress()
        for rec in self.records:
            self.progress.update(rec)
        self._offsets = {"log": _size(run.log_path), "metrics": _size(run.metrics_path)}
        self._partial = {"log": "", "metrics": ""}
        self._stop_requested = self._escalated = False
        self._kinds = set()
        self._follow.start()
        self._set_state("running")
        return True

    def _poll_files(self) -> None:
        assert self.run is not None
        for line in self._read_new("log", self.run.log_path):
            message = None
            with contextlib.suppress(ValueError):
                from gaudi_gui.core import protocol
                message = protocol.decode(line)
            if message is None:
                self.log_line_received.emit(line)
            elif message.get("type") != "metrics":
                self._on_message(message)
        for line in self._read_new("metrics", self.run.metrics_path):
            record = metrics_mod.parse_line(line)
            if record is not None:
                self._take_metrics(record)
        if not is_pid_alive(self._attached_pid):
            status = self.run.status()
            code = status.exit_code if status.exit_code is not None else (
                0 if "finished" in self._kinds or "stopped" in self._kinds else -1)
            self._end(code, "exited", "ended while re-attached (exit code read from the log)",
                      self.run.log_tail(30))

    def _read_new(self, key: str, path: Path) -> list[str]:
        try:
            with open(path, "rb") as fh:
                fh.seek(self._offsets[key])
                data = fh.read()
        except OSError:
            return []
        self._offsets[key] += len(data)
        text = self._partial[key] + data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._partial[key] = lines.pop()
        return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines]

    def shutdown(self) -> None:
        self._follow.stop()
        self._kill_timer.stop()
        if self.run:
            self.run.close()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class SchemaLoader(QObject):
    """The TrainingArguments schema and job validation, computed in short-lived children."""

    #: The schema is available (from the cache or a fresh child).
    schema_loaded = Signal(object)
    #: The schema child failed; carries the reason.
    schema_failed = Signal(str)
    #: A validation finished: list of (field, message); empty means TrainingArguments builds.
    validated = Signal(list)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.schema: Schema | None = None
        self._schema_runner = ProcessRunner(self, parse_protocol=False, tail_lines=400)
        self._schema_runner.line_received.connect(self._on_schema_line)
        self._schema_runner.finished.connect(self._on_schema_finished)
        self._schema_lines: list[str] = []
        self._validate_runner = ProcessRunner(self, parse_protocol=False)
        self._validate_runner.line_received.connect(self._on_validate_line)
        self._validate_runner.finished.connect(self._on_validate_finished)
        self._validate_lines: list[str] = []
        self._validate_file = ""

    def is_running(self) -> bool:
        return self._schema_runner.is_running() or self._validate_runner.is_running()

    def load(self, transformers_version: str = "") -> None:
        """Cached schema for that version at once, else ask a child."""
        if transformers_version:
            cached = load_cached(transformers_version)
            if cached is not None:
                self.schema = cached
                self.schema_loaded.emit(cached)
                return
        if self._schema_runner.is_running():
            return
        self._schema_lines = []
        self._schema_runner.start(sys.executable, ["-m", "gaudi_gui.workers.schema"],
                                  env=launch_mod.visibility.child_env())

    def _on_schema_line(self, stream: str, line: str) -> None:
        if stream == "stdout":
            self._schema_lines.append(line)

    def _on_schema_finished(self, code: int, status: str) -> None:
        text = "\n".join(self._schema_lines)
        try:
            schema = Schema.from_dict(json.loads(text[text.find("{"):]))
        except (ValueError, KeyError, TypeError):
            tail = " | ".join(self._schema_runner.tail(3))
            self.schema_failed.emit(f"could not read TrainingArguments ({describe_exit(code, status)}): "
                                    f"{tail}")
            return
        with contextlib.suppress(OSError):
            save_cached(schema)
        self.schema = schema
        self.schema_loaded.emit(schema)

    def validate(self, training_args: Mapping[str, Any]) -> None:
        if self._validate_runner.is_running():
            return
        fd, path = tempfile.mkstemp(prefix="gaudi-gui-validate-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump({"training_args": dict(training_args)}, fh)
        self._validate_file = path
        self._validate_lines = []
        self._validate_runner.start(sys.executable, ["-m", "gaudi_gui.workers.schema", "--validate", path],
                                    env=launch_mod.visibility.child_env())

    def _on_validate_line(self, stream: str, line: str) -> None:
        if stream == "stdout":
            self._validate_lines.append(line)

    def _on_validate_finished(self, code: int, status: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._validate_file)
        for line in reversed(self._validate_lines):
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict) and "errors" in data:
                    self.validated.emit([(str(e.get("field", "")), str(e.get("message", "")))
                                         for e in data["errors"]])
                    return
        self.validated.emit([("", f"validation child failed ({describe_exit(code, status)}): "
                                  f"{' | '.join(self._validate_runner.tail(3))}")])

    def shutdown(self) -> None:
        for runner in (self._schema_runner, self._validate_runner):
            runner.kill_tree()


__all__ = ["RunStatus", "SchemaLoader", "TrainingJob"]
