"""One folder per training launch, written while it runs so nothing is lost if the app dies.

``<runs_dir>/<YYYYmmdd-HHMMSS>-<name>/`` holds config.json (the job as it ran), command.txt and
command.json, env.json, versions.json, log.txt (appended as lines arrive), metrics.jsonl (written by
the worker's callback), and status.json (state, pid, times, exit code, final loss).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from gaudi_gui.core import paths
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError

STATES = ("queued", "running", "finished", "failed", "stopped", "killed")
FINAL_STATES = ("finished", "failed", "stopped", "killed")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class RunStatus:
    state: str = "queued"
    pid: int = 0
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

    @property
    def duration(self) -> float:
        if not self.started_at:
            return 0.0
        end = self.ended_at or time.time()
        return max(0.0, end - self.started_at)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunStatus:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "run"


class Run:
    """A run folder; cheap to construct, reads files on demand."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._log: IO[str] | None = None

    def __repr__(self) -> str:
        return f"Run({str(self.folder)!r})"

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def config_path(self) -> Path:
        return self.folder / "config.json"

    @property
    def log_path(self) -> Path:
        return self.folder / "log.txt"

    @property
    def metrics_path(self) -> Path:
        return self.folder / "metrics.jsonl"

    @property
    def status_path(self) -> Path:
        return self.folder / "status.json"

    def exists(self) -> bool:
        return self.config_path.is_file()

    # -- writing ----------------------------------------------------------------------------------

    def write_launch(self, argv: list[str], env_extra: Mapping[str, str], shell: str,
                     full_env: Mapping[str, str] | None = None) -> None:
        (self.folder / "command.txt").write_text(shell + "\n", encoding="utf-8")
        _write_json(self.folder / "command.json", {"argv": argv, "env": dict(env_extra)})
        _write_json(self.folder / "env.json", dict(full_env if full_env is not None else env_extra))

    def write_versions(self, versions: Mapping[str, Any]) -> None:
        _write_json(self.folder / "versions.json", dict(versions))

    def status(self) -> RunStatus:
        try:
            return RunStatus.from_dict(json.loads(self.status_path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return RunStatus(state="failed", error="status.json missing or unreadable")

    def write_status(self, status: RunStatus) -> None:
        _write_json(self.status_path, asdict(status))

    def update_status(self, **changes: Any) -> RunStatus:
        status = self.status()
        for key, value in changes.items():
            setattr(status, key, value)
        self.write_status(status)
        return status

    def append_log(self, lines: Iterable[str]) -> None:
        if self._log is None:
            self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - kept open while streaming
        for line in lines:
            self._log.write(line + "\n")
        self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    # -- reading ----------------------------------------------------------------------------------

    def job(self) -> JobConfig:
        return JobConfig.load(self.config_path)

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

    def metrics(self) -> list[dict[str, Any]]:
        from gaudi_gui.core.metrics import read_metrics
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


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The ``checkpoint-N`` folder with the highest N that holds a trainer state."""
    folder = Path(output_dir)
    best: tuple[int, Path] | None = None
    try:
        entries = list(folder.iterdir())
    except OSError:
        return None
    for entry in entries:
        match = _CHECKPOINT.match(entry.name)
        if match and entry.is_dir() and (entry / "trainer_state.json").is_file():
            step = int(match.group(1))
            if best is None or step > best[0]:
                best = (step, entry)
    return best[1] if best else None


class RunStore:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else paths.runs_dir()

    def create(self, job: JobConfig) -> Run:
        """A new folder with config.json and a 'queued' status."""
        self.root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = f"{stamp}-{_slug(job.name or Path(job.model).name or 'run')}"
        folder = self.root / base
        counter = 1
        while True:
            try:
                folder.mkdir()
                break
            except FileExistsError:
                counter += 1
                folder = self.root / f"{base}-{counter}"
        run = Run(folder)
        job.save(run.config_path)
        run.write_status(RunStatus(state="queued", output_dir=job.output_dir))
        return run

    def runs(self) -> list[Run]:
        """Every run folder, newest first."""
        try:
            folders = [p for p in self.root.iterdir() if (p / "config.json").is_file()]
        except OSError:
            return []
        return [Run(p) for p in sorted(folders, key=lambda p: p.name, reverse=True)]

    def clone(self, run: Run) -> JobConfig:
        """The run's job, ready to edit and launch again (resume cleared)."""
        job = run.job()
        job.resume_from_checkpoint = ""
        return job

    def delete(self, run: Run) -> None:
        shutil.rmtree(run.folder, ignore_errors=True)


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


__all__ = ["FINAL_STATES", "STATES", "Run", "RunStatus", "RunStore", "field", "is_pid_alive",
           "latest_checkpoint"]
