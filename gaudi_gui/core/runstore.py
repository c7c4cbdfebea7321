"""One folder per training launch, written while it runs so nothing is lost if the app dies.

``<runs_dir>/<YYYYmmdd-HHMMSS>-<name>/`` holds job.json (the job as the user made it), config.json
(the job as it ran: what the launcher added for the device), command.txt and command.json, env.json
(the variables the app set, and the names only of inherited secrets), versions.json, log.txt (the
console, appended by ``tee`` on the child side), events.jsonl (the worker's events: phases, metrics,
checkpoints, the end), ranks/rank-N.json (each rank's pid and create time) and status.json (state,
launcher pid and create time, times, exit code, final loss). Folders are 0700 and files 0600: a run
folder is the user's business.

status.json has one writer, the run's supervisor (supervisor.json records it). A status.json that
says "running" is checked against the supervisor and the recorded processes: a run whose supervisor
and processes are gone is told from its event file (``Run.reconcile``, which never writes), so a run
whose supervisor was killed is reported truthfully by every reader instead of "running" forever.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic, jsonfile, paths
from gaudi_gui.core import events as events_mod
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError
from gaudi_gui.core.proctree import ProcessRef

STATES = ("queued", "running", "finished", "failed", "stopped", "killed")
FINAL_STATES = ("finished", "failed", "stopped", "killed")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: transformers' JIT checkpoint writes this while a save is under way and removes it at the end.
INCOMPLETE_SENTINEL = "checkpoint-is-incomplete.txt"
#: What a run submitted to Slurm holds in its folder (job id, login host, sbatch options; core/slurm.py).
SLURM_INFO = "slurm.json"
#: A detached supervisor's record in its run folder (pid and create time: what ``runs stop`` signals).
SUPERVISOR_INFO = "supervisor.json"
FOLDER_MODE = 0o700
FILE_MODE = 0o600


@dataclass
class RunStatus:
    state: str = "queued"
    pid: int = 0
    #: The launcher's create time (psutil): a pid without it is never signalled.
    pid_create_time: float = 0.0
    started_at: float = 0.0
    ended_at: float = 0.0
    exit_code: int | None = None
    exit_description: str = ""
    final_loss: float | None = None
    step: int = 0
    max_steps: int = 0
    error: str = ""
    error_kind: str = ""
    output_dir: str = ""
    #: The checkpoint the run stopped with (its folder), when it saved one.
    checkpoint: str = ""
    #: The run folder this run resumed from.
    resumed_from: str = ""
    #: Who launched it: "gui" or "cli".
    origin: str = ""
    #: One human sentence for the final state ("Stopped at step 401 — checkpoint-401 saved; ...").
    summary: str = ""
    #: The job's kind (core.kinds: train, serve, eval, download; earlier versions' spellings are read
    #: as these).
    kind: str = "train"

    @property
    def duration(self) -> float:
        if not self.started_at:
            return 0.0
        end = self.ended_at or time.time()
        return max(0.0, end - self.started_at)

    @property
    def launcher(self) -> ProcessRef | None:
        if self.pid <= 0 or self.pid_create_time <= 0:
            return None
        return ProcessRef(self.pid, self.pid_create_time)

    @classmethod
    def from_dict(cls, data: Any) -> RunStatus:
        """A status from JSON. A value of the wrong type (or a document that is no object, or names no
        known state) makes it a damaged run that says which field, as a truncated file does: a default
        in its place would show a finished run as "queued". Values of the right type that cannot be
        (a time far in the future, a NaN loss from a diverged run) read as unknown."""
        status, problem = cls.checked(data)
        from gaudi_gui.core.kinds import canonical
        status.kind = canonical(status.kind) or status.kind
        if problem:
            status.state, status.error, status.error_kind = "failed", problem, "damaged"
            status.summary = f"Damaged run: {problem}"
        return status

    @classmethod
    def checked(cls, data: Any, name: str = "status.json") -> tuple[RunStatus, str]:
        """The status ``data`` holds and what is wrong with its shape ("" when nothing): each field's
        type checked once, here, where the file is read. Fields of the right type are kept."""
        out = cls()
        if not isinstance(data, Mapping):
            return out, f"{name} holds {_json_type(data)}, not an object"
        problems: list[str] = []
        now = time.time()
        for f in fields(cls):
            if f.name not in data or (data[f.name] is None and f.name != "state"):
                continue  # absent (older versions wrote fewer fields): the default
            value, default = data[f.name], getattr(out, f.name)
            if f.name in ("exit_code", "final_loss") or isinstance(default, (int, float)):
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if f.name in ("exit_code",) or isinstance(default, int):
                    if not number or not isinstance(value, int):
                        problems.append(f"{name}: {f.name} is {_json_type(value)}, not an integer")
                    elif f.name == "exit_code" or 0 <= value < 1 << 62:
                        setattr(out, f.name, value)
                elif not number:
                    problems.append(f"{name}: {f.name} is {_json_type(value)}, not a number")
                elif f.name == "final_loss":
                    out.final_loss = float(value) if math.isfinite(value) else None
                elif math.isfinite(value) and 0 <= value < now + 86400 * 365:
                    # Times: a non-negative moment not far in the future (a clock can drift).
                    setattr(out, f.name, float(value))
            elif not isinstance(value, str):
                problems.append(f"{name}: {f.name} is {_json_type(value)}, not a string")
            else:
                setattr(out, f.name, value)
        if "state" not in data:
            problems.insert(0, f"{name} has no state")
        elif isinstance(data["state"], str) and data["state"] not in STATES:
            problems.insert(0, f"{name}: state {data['state']!r} is not one of {', '.join(STATES)}")
        if problems:
            out.state = "failed"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return out, problems[0] + more if problems else ""


def _json_type(value: Any) -> str:
    """How a JSON value is named in a sentence ("a list", "a string", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "an object" if isinstance(value, Mapping) else f"a {type(value).__name__}"


def _private_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (0600) in one atomic replace (core/atomic.py)."""
    atomic.write_text(path, text, mode=FILE_MODE, fsync=False)


def _write_json(path: Path, data: Any) -> None:
    _private_write(path, json.dumps(data, indent=2, default=str))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "run"


class Run:
    """A run folder; cheap to construct, reads files on demand."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def __repr__(self) -> str:
        return f"Run({str(self.folder)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.folder == self.folder

    def __hash__(self) -> int:
        return hash(self.folder)

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def config_path(self) -> Path:
        return self.folder / "config.json"

    @property
    def job_path(self) -> Path:
        return self.folder / "job.json"

    @property
    def log_path(self) -> Path:
        return self.folder / "log.txt"

    @property
    def events_path(self) -> Path:
        return self.folder / events_mod.EVENTS_NAME

    @property
    def metrics_path(self) -> Path:
        """Runs of earlier versions wrote their metrics here; new runs use events.jsonl."""
        return self.folder / "metrics.jsonl"

    @property
    def status_path(self) -> Path:
        return self.folder / "status.json"

    @property
    def ranks_dir(self) -> Path:
        return self.folder / "ranks"

    def exists(self) -> bool:
        """A training run's folder (config.json) or another kind's (spec.json, core.jobkind)."""
        return self.config_path.is_file() or (self.folder / "spec.json").is_file()

    @property
    def kind(self) -> str:
        """train, serve, eval or download (core.kinds), as its status records it."""
        return self.status().kind

    # -- writing ----------------------------------------------------------------------------------

    def write_launch(self, argv: list[str], env_extra: Mapping[str, str], shell: str,
                     full_env: Mapping[str, str] | None = None, *,
                     cards: Mapping[str, Any] | None = None) -> None:
        """command.txt, command.json and env.json; ``cards`` (what ``train --cards`` asked for, and
        whether the device applied it) goes into env.json as "cards"."""
        from gaudi_gui.core.secrets import recorded_env, redact
        _private_write(self.folder / "command.txt", redact(shell) + "\n")
        _write_json(self.folder / "command.json", {"argv": [redact(a) for a in argv],
                                                   "env": recorded_env(env_extra, ())["set_by_gaudi_gui"]})
        recorded: dict[str, Any] = recorded_env(env_extra, full_env or {})
        if cards is not None:
            recorded["cards"] = dict(cards)
        _write_json(self.folder / "env.json", recorded)

    def write_versions(self, versions: Mapping[str, Any]) -> None:
        _write_json(self.folder / "versions.json", dict(versions))

    def status(self) -> RunStatus:
        """The recorded status; a damaged status.json reads as a failed run whose summary says what
        is wrong with the file ("status.json is truncated"), never as an exception."""
        try:
            data = jsonfile.read(self.status_path)
        except jsonfile.FileProblem as exc:
            return RunStatus(state="failed", error=str(exc), error_kind="damaged",
                             summary=f"Damaged run: {exc}")
        return RunStatus.from_dict(data)

    def problems(self) -> list[str]:
        """What is wrong with this folder's files, one sentence each ("config.json is not UTF-8
        (byte 0xff at 12)", "status.json is truncated", "events.jsonl is missing"); empty for a sound
        run. Every reader of the history shows these as the run's own problem."""
        out: list[str] = []
        if not self.config_path.is_file():  # another kind's folder (core.jobkind): no job files
            try:
                problem = RunStatus.checked(jsonfile.read(self.status_path), self.status_path.name)[1]
            except jsonfile.FileProblem as exc:
                return [str(exc)]
            return [problem] if problem else out
        for path in (self.config_path, self.job_path):
            if path == self.job_path and not path.exists():
                continue  # runs of earlier versions have no job.json
            try:
                JobConfig.from_dict(jsonfile.read(path))
            except jsonfile.FileProblem as exc:
                out.append(str(exc))
            except JobConfigError as exc:
                out.append(f"{path.name}: {exc}")
        try:
            status, problem = RunStatus.checked(jsonfile.read(self.status_path), self.status_path.name)
        except jsonfile.FileProblem as exc:
            out.append(str(exc))
        else:
            if problem:
                return [*out, problem]  # its state and step say nothing about the events then
            # A finished run, or one that got to a step, had a worker writing events: their file
            # gone is damage (a run stopped while starting may rightly have none).
            started = status.state == "finished" or (status.step > 0 and status.state in FINAL_STATES)
            legacy = self.metrics_path.is_file()  # runs of earlier versions wrote metrics.jsonl only
            if started and not legacy and not self.events_path.is_file() \
                    and not (self.folder / SLURM_INFO).is_file():
                out.append(f"{self.events_path.name} is missing")
        return out

    def write_status(self, status: RunStatus) -> None:
        _write_json(self.status_path, asdict(status))

    def update_status(self, **changes: Any) -> RunStatus:
        status = self.status()
        for key, value in changes.items():
            setattr(status, key, value)
        self.write_status(status)
        return status

    # -- processes --------------------------------------------------------------------------------

    def ranks(self) -> list[dict[str, Any]]:
        """Each rank's record ({rank, pid, create_time, host, ...}), as the ranks wrote them."""
        out = []
        try:
            files = sorted(self.ranks_dir.glob("rank-*.json"))
        except OSError:
            return []
        for path in files:
            with contextlib.suppress(OSError, ValueError, RecursionError):
                data = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(data, dict) and ProcessRef.from_dict(data) is not None:
                    out.append(data)
        return out

    def rank_refs(self) -> list[ProcessRef]:
        return [ref for ref in (ProcessRef.from_dict(r) for r in self.ranks()) if ref is not None]

    def write_supervisor(self, **extra: Any) -> ProcessRef | None:
        """Record this process as the run's supervisor (what ``runs stop`` signals, and what tells a
        reader that somebody still owns the status); its ref."""
        me = ProcessRef.of(os.getpid())
        _write_json(self.folder / SUPERVISOR_INFO, {"pid": os.getpid(),
                                                    "create_time": me.create_time if me else 0.0, **extra})
        return me

    def supervisor(self) -> ProcessRef | None:
        """The run's supervisor while it lives (the only writer of its status); None when gone."""
        try:
            data = json.loads((self.folder / SUPERVISOR_INFO).read_text(encoding="utf-8"))
            ref = ProcessRef(int(data["pid"]), float(data["create_time"]))
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None
        return ref if ref.is_alive() else None

    def processes_alive(self) -> bool:
        """Is any recorded process of this run (launcher or rank) still the one recorded?"""
        launcher = self.status().launcher
        refs = ([launcher] if launcher else []) + self.rank_refs()
        return any(ref.is_alive() for ref in refs)

    # -- reading ----------------------------------------------------------------------------------

    def job(self) -> JobConfig:
        return JobConfig.load(self.config_path)

    def user_job(self) -> JobConfig:
        """The job as the user made it (runs of earlier versions: the job as it ran)."""
        return JobConfig.load(self.job_path if self.job_path.is_file() else self.config_path)

    def log_tail(self, count: int = 40) -> list[str]:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 256 * 1024))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            return []
        return text.splitlines()[-count:]

    def events(self) -> list[dict[str, Any]]:
        return events_mod.read_events(self.events_path)

    def metrics(self) -> list[dict[str, Any]]:
        from gaudi_gui.core.metrics import metric_record, read_metrics
        if self.events_path.is_file():
            return [r for r in (metric_record(e) for e in self.events()) if r is not None]
        return read_metrics(self.metrics_path)

    def output_dir(self) -> Path | None:
        out = self.status().output_dir
        if not out:
            try:
                out = self.job().output_dir
            except JobConfigError:
                return None
        return Path(out) if out else None

    def latest_checkpoint(self) -> Path | None:
        out = self.output_dir()
        return latest_checkpoint(out) if out else None

    def reconcile(self) -> RunStatus:
        """The status as it truly is: a "queued"/"running" run whose supervisor and processes are all
        gone is told in the state its event file proves (a supervisor that died must not leave a run
        "running" forever). Never written back: the supervisor is the only writer of status.json
        (two writers of one file lose updates and, measured, show readers empty files)."""
        status = self.status()
        if status.state not in ("queued", "running"):
            return status
        if self.supervisor() is not None or self.processes_alive():
            return status  # its supervisor writes how it ends
        if (self.folder / SLURM_INFO).is_file():
            # A Slurm job's processes are on the cluster's nodes, not here: only the queue (squeue,
            # sacct) knows whether it still runs, and the command following it writes its end.
            return status
        if status.state == "queued" and not status.pid and time.time() - _mtime(self.status_path) < 60:
            return status  # being started right now
        from gaudi_gui.core.outcome import outcome_from_events
        result = outcome_from_events(self.events(), status, nobody_watched=True) \
            if status.kind == "train" else {"state": "killed", "summary": "Ended: its supervisor died"}
        for key, value in result.items():
            setattr(status, key, value)
        if not status.ended_at:
            status.ended_at = max(_mtime(self.events_path), _mtime(self.log_path)) or time.time()
        return status


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def checkpoint_complete(folder: str | Path) -> bool:
    """A checkpoint the Trainer finished writing: trainer_state.json (written last) parses, and no
    in-progress sentinel remains."""
    folder = Path(folder)
    if (folder / INCOMPLETE_SENTINEL).exists():
        return False
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(state, dict) and "global_step" in state


def complete_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """The complete ``checkpoint-N`` folders of ``output_dir`` as (N, folder), in no set order."""
    try:
        entries = list(Path(output_dir).iterdir())
    except OSError:
        return []
    out = []
    for entry in entries:
        match = _CHECKPOINT.match(entry.name)
        if match and entry.is_dir() and checkpoint_complete(entry):
            out.append((int(match.group(1)), entry))
    return out


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete ``checkpoint-N`` folder with the highest N (an incomplete one is never offered)."""
    found = complete_checkpoints(output_dir)
    return max(found, key=lambda item: item[0])[1] if found else None


class RunStore:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else paths.runs_dir()

    def create(self, job: JobConfig, user_job: JobConfig | None = None, *,
               default_output: Callable[[str], Path] | None = None) -> Run:
        """A new private folder with config.json (``job``, as it will run), job.json (``user_job``,
        as the user made it; ``job`` when not given) and a 'queued' status. A job that names no
        output folder gets ``default_output(run name)`` in config.json (job.json keeps it empty, so a
        clone gets a folder of its own again). OSError when the disk refuses; nothing is left behind
        then."""
        folder = new_folder(self.root, job.name or Path(job.model).name or "run")
        run = Run(folder)
        user_job = user_job or copy.deepcopy(job)
        if default_output is not None and not job.output_dir.strip():
            job.training_args["output_dir"] = str(default_output(run.name))
        try:
            os.chmod(folder, FOLDER_MODE)
            (run.ranks_dir).mkdir(mode=FOLDER_MODE)
            _write_json(run.job_path, user_job.to_dict())
            _write_json(run.config_path, job.to_dict())
            run.write_status(RunStatus(state="queued", output_dir=job.output_dir))
        except OSError:
            # A full disk: leave no half-made run behind for the history to trip over.
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return run

    def runs(self) -> list[Run]:
        """Every run folder, newest first."""
        try:
            folders = [p for p in self.root.iterdir() if Run(p).exists()]
        except OSError:
            return []
        return [Run(p) for p in sorted(folders, key=lambda p: p.name, reverse=True)]

    def clone(self, run: Run) -> JobConfig:
        """The run's job as the user made it, ready to edit and launch again (resume cleared): not
        what the launcher added for the device (use_cpu, ddp_backend...)."""
        job = run.user_job()
        job.resume_from_checkpoint = ""
        return job

    def delete(self, run: Run) -> None:
        shutil.rmtree(run.folder, ignore_errors=True)


def new_folder(root: Path, name: str) -> Path:
    """A new private run folder ``<root>/<YYYYmmdd-HHMMSS>-<name>`` (a counter when taken)."""
    root.mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(name)}"
    folder, counter = root / base, 1
    while True:
        try:
            folder.mkdir(mode=FOLDER_MODE)
            os.chmod(folder, FOLDER_MODE)
            return folder
        except FileExistsError:
            counter += 1
            folder = root / f"{base}-{counter}"


def is_pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (finished, not yet reaped) does not count as running.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
    return True


__all__ = ["FINAL_STATES", "SLURM_INFO", "STATES", "Run", "RunStatus", "RunStore", "checkpoint_complete",
           "complete_checkpoints",
           "field", "is_pid_alive", "latest_checkpoint"]
