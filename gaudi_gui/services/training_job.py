"""Supervising training launches: one ``TrainingJob`` per run, plus the schema/validation children.

``TrainingJob`` starts the ``PreparedRun`` of ``gaudi_gui.core.prepare`` (``accelerate launch``
wrapped so ``tee`` appends the console to the run's log.txt) through ProcessRunner in a new session,
and follows the run's event file (``events.jsonl``) for everything structured: phases, metrics,
checkpoints, errors, the end. A run re-attached from an earlier session (or started by
``gaudi-gui train``) is followed from the same files, so it looks exactly like a live one.

Stop goes through ``core.stopper.Stopper``: SIGTERM to the recorded ranks only (never the launcher),
a "saving checkpoint… N s" line while they save, SIGKILL only after the grace period (a setting,
default 120 s) or a second Stop. The final state and its one-line summary come from
``core.outcome`` (what the events prove), never from the launcher's exit code alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import metrics as metrics_mod
from gaudi_gui.core import prepare as prepare_mod
from gaudi_gui.core.events import EventFollower, LogFollower
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.outcome import outcome_from_events
from gaudi_gui.core.proctree import ProcessRef
from gaudi_gui.core.runstore import Run, RunStatus, RunStore
from gaudi_gui.core.secrets import redact
from gaudi_gui.core.stopper import Stopper
from gaudi_gui.core.training_args import Schema, load_cached, save_cached
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner, describe_exit

#: How often the event file is read (also read at once whenever the console prints a line).
FOLLOW_MS = 250
#: Seconds between two writes of the run's step into its status file while it trains.
STEP_WRITE_S = 2.0
#: How long the end of a run waits for processes already sent SIGKILL to disappear.
DYING_WAIT_S = 30.0


class TrainingJob(QObject):
    """One training run: launched here, or re-attached from a previous session or the CLI."""

    #: The launcher is running; carries its pid.
    started = Signal(int)
    #: A console line (stdout and stderr merged), secrets redacted.
    log_line_received = Signal(str)
    #: The newest tqdm ``\\r`` rewrite of the unfinished console line.
    progress_line = Signal(str)
    #: A metrics record from the worker (step, max_steps, start_step, loss, learning_rate, ...).
    metrics_received = Signal(dict)
    #: Any other event from the worker (phase, training_started, checkpoint_saving/_saved, error...).
    event_received = Signal(dict)
    #: The run's state changed: queued / running / stopping / finished / failed / stopped / killed.
    status_changed = Signal(str)
    #: One human line about the run changed ("saving checkpoint… 4 s", "Stopped at step 40 — ...").
    summary_changed = Signal(str)
    #: The run ended: (exit code, final state, last console lines).
    finished = Signal(int, str, list)

    def __init__(self, store: RunStore | None = None, *, stop_grace_s: float = 120.0,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store or RunStore()
        self.stop_grace_s = stop_grace_s
        self.run: Run | None = None
        self.job: JobConfig | None = None
        self.prepared: prepare_mod.PreparedRun | None = None
        self.state = "idle"
        self.summary = ""
        self.error: dict[str, Any] | None = None
        self.progress = metrics_mod.Progress()
        self.records: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.leftover_pids: list[int] = []
        self.launcher: ProcessRef | None = None
        self.stopper: Stopper | None = None
        self.saving_since = 0.0
        self._ended = False
        self._dying_since = 0.0
        self._step_written_at = -STEP_WRITE_S
        # The launcher's runner, made by the first start (a job that follows a run elsewhere, or
        # one re-attached to its folder, never holds an idle QProcess).
        self._runner_obj: ProcessRunner | None = None
        self._follower: EventFollower | None = None
        self._follow = QTimer(self)
        self._follow.setInterval(FOLLOW_MS)
        self._follow.timeout.connect(self._poll)
        self._kill_timer = QTimer(self)
        self._kill_timer.setSingleShot(True)
        self._kill_timer.timeout.connect(self._grace_over)
        self._tick = QTimer(self)
        self._tick.setInterval(1000)
        self._tick.timeout.connect(self._on_tick)
        # Re-attached runs: the console log is followed from its file.
        self._attached = False
        self._log: LogFollower | None = None

    @property
    def _runner(self) -> ProcessRunner:
        if self._runner_obj is None:
            runner = self._runner_obj = ProcessRunner(self, tail_lines=60, parse_protocol=False)
            runner.started.connect(self._on_started)
            runner.line_received.connect(self._on_line)
            runner.progress_received.connect(self._on_progress)
            runner.finished.connect(self._on_finished)
        return self._runner_obj

    def _launcher_running(self) -> bool:
        return self._runner_obj is not None and self._runner_obj.is_running()

    # -- state ------------------------------------------------------------------------------------

    def is_running(self) -> bool:
        return (self._launcher_running() or self._attached or self._dying_since > 0) and not self._ended

    @property
    def attached(self) -> bool:
        return self._attached and not self._ended

    @property
    def pid(self) -> int:
        return self.launcher.pid if self.launcher else (self._runner_obj.pid if self._runner_obj else 0)

    @property
    def stopping(self) -> bool:
        return self.stopper is not None and self.is_running()

    def describe(self) -> str:
        name = self.run.name if self.run else "training"
        return f"training run {name} ({self.state}, step {self.progress.step}/{self.progress.max_steps})"

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.status_changed.emit(state)

    def _set_summary(self, text: str) -> None:
        if text != self.summary:
            self.summary = text
            self.summary_changed.emit(text)

    def _reset(self) -> None:
        self.records, self.events = [], []
        self.progress = metrics_mod.Progress()
        self.error = None
        self.leftover_pids = []
        self.stopper = None
        self.saving_since = 0.0
        self.launcher = None
        self._ended = False
        self._dying_since = 0.0
        self._step_written_at = -STEP_WRITE_S
        self.summary = ""

    # -- launching --------------------------------------------------------------------------------

    def start(self, job: JobConfig, *, device: str = "cpu",
              device_env: Mapping[str, str] | None = None, resumed_from: str = "") -> Run:
        """Create the run folder and start the launch; PrepareError (a ValueError) lists the
        problems, OSError when the disk refuses."""
        if self.is_running():
            raise RuntimeError("this job is already running")
        prepared = prepare_mod.prepare_run(job, device=device, device_env=device_env, store=self.store,
                                           origin="gui", resumed_from=resumed_from)
        self._reset()
        self.prepared, self.run, self.job = prepared, prepared.run, prepared.job
        self._follower = EventFollower(prepared.run.events_path)
        self._attached = False
        self._set_state("queued")
        self._set_summary("starting the launcher…")
        self._runner.start(prepared.argv[0], prepared.argv[1:], env=prepared.env,
                           cwd=str(prepared.run.folder), new_session=True)
        self._follow.start()
        return prepared.run

    def _on_started(self, pid: int) -> None:
        self.launcher = ProcessRef.of(pid)
        if self.run:
            self.run.update_status(state="running", pid=pid, started_at=time.time(),
                                   pid_create_time=self.launcher.create_time if self.launcher else 0.0)
        if self.stopper is not None:
            self.stopper.launcher_started(self.launcher)
        self._set_state("stopping" if self.stopper else "running")
        self.started.emit(pid)

    def _on_progress(self, _stream: str, text: str) -> None:
        # A real method, not a lambda: a lambda slot would return emit()'s True, and PySide6 on
        # Python 3.11 drops a reference to it each time until the interpreter aborts.
        self.progress_line.emit(redact(text))

    def _on_line(self, _stream: str, line: str) -> None:
        self.log_line_received.emit(redact(line))
        self._poll_events()

    # -- events -----------------------------------------------------------------------------------

    def _poll(self) -> None:
        self._poll_events()
        if self._attached:
            for line in self._read_log():
                self.log_line_received.emit(redact(line))
            self._check_attached_alive()

    def _poll_events(self) -> None:
        if self._follower is None:
            return
        for event in self._follower.read():
            self._take_event(event)

    def _take_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        kind = event.get("type")
        if kind == "metrics":
            record = metrics_mod.metric_record(event)
            if record is not None:
                self.records.append(record)
                self.progress.update(record)
                now = time.monotonic()
                if self.run and now - self._step_written_at >= STEP_WRITE_S:
                    # The status file's step (for `runs list` and the Runs table): at most one
                    # atomic rewrite every few seconds, not one per N steps (a fast model logs
                    # 100 steps/s, and each write is a file replace on the GUI thread).
                    self._step_written_at = now
                    with contextlib.suppress(OSError):
                        self.run.update_status(step=self.progress.step, max_steps=self.progress.max_steps)
                self.metrics_received.emit(record)
            return
        if kind == "training_started":
            self.progress.update(event)
            if isinstance(event.get("start_step"), int):
                self.progress.step = max(self.progress.step, event["start_step"])
            self._set_summary(f"training: step {self.progress.step} of {event.get('max_steps')} on "
                              f"{event.get('world_size')} process(es)")
        elif kind == "phase":
            self._set_summary(str(event.get("message") or event.get("phase")))
        elif kind == "checkpoint_saving":
            self.saving_since = time.time()
            self._tick.start()
            self._set_summary(f"saving checkpoint-{event.get('step')}… 0 s")
        elif kind == "checkpoint_saved":
            self.saving_since = 0.0
            if self.stopper is None:
                self._tick.stop()
            seconds = event.get("seconds")
            took = f" in {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
            self._set_summary(f"checkpoint-{event.get('step')} saved{took}"
                              + ("; the processes are ending" if self.stopper else ""))
        elif kind == "error" and self.error is None:
            self.error = event
            self._set_summary(f"error ({event.get('kind')}): {event.get('message')}")
        elif kind == "stop_requested" and self.stopper is None:
            # Someone else signalled the ranks (preemption, a terminal): still a stop.
            self._set_summary(f"stop requested ({event.get('signal')}): checkpoint at the end of this step")
        self.event_received.emit(event)

    def _on_tick(self) -> None:
        if self.saving_since:
            name = f"checkpoint-{self.progress.step}" if self.progress.step else "checkpoint"
            self._set_summary(f"saving {name}… {time.time() - self.saving_since:.0f} s")
        elif self.stopper is not None and self.is_running():
            left = max(0.0, self.stop_grace_s - self.stopper.elapsed())
            waited = self.stopper.elapsed()
            self._set_summary(f"stopping: waiting for the current step to end ({waited:.0f} s; "
                              f"killed in {left:.0f} s, or press Stop again)")

    # -- stopping ---------------------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> None:
        """Stop with a checkpoint; pressed again while stopping: kill now."""
        if not self.is_running() or self.run is None:
            return
        if self.stopper is not None:
            self.kill()
            return
        self.stopper = Stopper(self.run, self.launcher)
        what = self.stopper.request()
        grace = self.stop_grace_s if grace_s is None else grace_s
        self.log_line_received.emit(f"[gaudi-gui] stop: {what}; SIGKILL after {grace:g} s "
                                    f"(press Stop again to kill now)")
        self._set_state("stopping")
        if self.stopper.mode == "ranks":
            self._set_summary("stopping: checkpoint at the end of the current step…")
            self._kill_timer.start(int(max(0.0, grace) * 1000))
            self._tick.start()
        else:
            self._set_summary("stopping: the launch is ended (training had not begun)")

    def kill(self, reason: str = "request") -> None:
        """SIGKILL the run's processes now (no checkpoint)."""
        if not self.is_running() or self.run is None:
            return
        if self.stopper is None:
            self.stopper = Stopper(self.run, self.launcher)
            self.stopper.requested_at = time.time()
            self.stopper.mode = "ranks"
        self.log_line_received.emit("[gaudi-gui] killing the run's processes now")
        self.stopper.kill_now(reason)
        if self._runner_obj is not None:
            self._runner_obj.kill_tree()

    def _grace_over(self) -> None:
        self.log_line_received.emit(f"[gaudi-gui] the ranks did not end within {self.stop_grace_s:g} s "
                                    f"of the stop: killing them")
        self.kill("grace")

    # -- the end ----------------------------------------------------------------------------------

    def _on_finished(self, code: int, status: str) -> None:
        self._poll_events()
        description = describe_exit(code, status)
        if status == EXIT_FAILED_TO_START:
            self._end(code, {"state": "failed", "summary": f"Failed: the launcher {description}"},
                      self._runner.tail(30))
            return
        self._end(code, None, self._runner.tail(30))

    def _end(self, code: int | None, override: dict[str, Any] | None, tail: list[str]) -> None:
        if self._ended:
            return
        # A rank sent SIGKILL may still be dying (flushing a write to a slow disk): the run has not
        # ended, and its cards are not free, until it is gone. Wait for it (bounded), then end.
        dying = [r for r in self.stopper.kill_sent if r.is_alive()] if self.stopper else []
        now = time.time()
        if dying and (not self._dying_since or now - self._dying_since < DYING_WAIT_S):
            if not self._dying_since:
                for timer in (self._kill_timer, self._tick, self._follow):
                    timer.stop()  # nothing else may end the run meanwhile
            self._dying_since = self._dying_since or now
            QTimer.singleShot(200, self, lambda: self._end(code, override, tail))
            return
        self._ended = True
        for timer in (self._kill_timer, self._tick, self._follow):
            timer.stop()
        stopper = self.stopper
        leftovers = stopper.leftovers() if stopper else [
            r for r in (self.run.rank_refs() if self.run else []) if r.is_alive()]
        if leftovers:
            # A rank outliving its launcher must not hold the cards: end it, and say so.
            for ref in leftovers:
                ref.signal(9)
            self.leftover_pids = [r.pid for r in leftovers]
            self.log_line_received.emit(f"[gaudi-gui] WARNING: processes outlived the run and were "
                                        f"killed: {self.leftover_pids}")
        if override is not None:
            result = override
        else:
            result = outcome_from_events(self.events, self.run.status() if self.run else None,
                                         exit_code=code if not self._attached else None,
                                         stop_requested=stopper is not None,
                                         killed=bool(stopper and stopper.killed),
                                         kill_reason=stopper.kill_reason if stopper else "",
                                         nobody_watched=self._attached and not self.events,
                                         log_tail=tail)
            if stopper is not None and stopper.mode == "tree" and result.get("state") != "failed":
                result.update(state="stopped", summary="Stopped before training began — nothing to save")
        state = str(result.get("state", "failed"))
        if self.run:
            final = metrics_mod.final_loss(self.records)
            changes = {k: v for k, v in result.items() if k in RunStatus.__dataclass_fields__}
            changes.setdefault("final_loss", final)
            if code is not None and not self._attached:
                changes["exit_code"] = code
                changes["exit_description"] = describe_exit(code, "exited" if code >= 0 else "crashed")
            with contextlib.suppress(OSError):
                self.run.update_status(ended_at=time.time(), **changes)
        self._attached = False
        self._set_summary(str(result.get("summary", state)))
        self._set_state(state)
        self.finished.emit(-1 if code is None else code, state, tail)

    # -- re-attaching -----------------------------------------------------------------------------

    def detach(self) -> None:
        """Leave the launch running after the app exits (its console keeps going to log.txt)."""
        if self._runner_obj is not None:
            self._runner_obj.detach()
        for timer in (self._follow, self._kill_timer, self._tick):
            timer.stop()

    def attach(self, run: Run) -> bool:
        """Follow a run started by an earlier session or the CLI; False when its processes are gone
        (its status is then brought to what its events prove) or its pid was recycled."""
        status = run.reconcile()
        if status.state != "running":
            # "queued": another gaudi-gui is creating it right now; it is not ours to follow yet.
            return False
        self._reset()
        self.run = run
        self.launcher = status.launcher
        with contextlib.suppress(Exception):
            self.job = run.job()
        self._follower = EventFollower(run.events_path)
        for event in self._follower.read():
            self._take_event(event)
        self._log = LogFollower(run.log_path, offset=_size(run.log_path))
        self._attached = True
        self._follow.start()
        self._set_state("running")
        if not self.summary:
            self._set_summary(f"re-attached to {run.name}")
        return True

    def _check_attached_alive(self) -> None:
        assert self.run is not None
        if self.run.processes_alive():
            return
        self._poll_events()
        self._end(None, None, self.run.log_tail(30))

    def _read_log(self) -> list[str]:
        return self._log.read() if self._log is not None else []

    def shutdown(self) -> None:
        for timer in (self._follow, self._kill_timer, self._tick):
            timer.stop()


def _size(path: Any) -> int:
    try:
        return int(os.stat(path).st_size)
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

    def load(self, transformers_version: str = "", *, device: str = "cpu",
             device_env: Mapping[str, str] | None = None) -> None:
        """Cached schema for that version at once, else ask a child (with the device's env)."""
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
                                  env=prepare_mod.child_env(device, device_env))

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

    def validate(self, training_args: Mapping[str, Any], *, device: str = "cpu",
                 device_env: Mapping[str, str] | None = None, num_processes: int = 1) -> None:
        """Build TrainingArguments from the whole dict in a child that has the job's device env
        (the child blames fields by elimination; ``num_processes`` > 1 lets it accept a
        ddp_backend that no single process could initialise)."""
        if self._validate_runner.is_running():
            return
        fd, path = tempfile.mkstemp(prefix="gaudi-gui-validate-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump({"training_args": dict(training_args),
                       "env": prepare_mod.device_variables(device, device_env),
                       "num_processes": max(1, int(num_processes))}, fh)
        self._validate_file = path
        self._validate_lines = []
        self._validate_runner.start(sys.executable, ["-m", "gaudi_gui.workers.schema", "--validate", path],
                                    env=prepare_mod.child_env(device, device_env))

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
