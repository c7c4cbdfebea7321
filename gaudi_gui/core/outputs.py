"""Whose files an output folder holds, and which checkpoint is a run's own.

Two runs writing into one output folder lose data: the Trainer writes ``checkpoint-N`` and ``final``
(or ``adapter``) over what is there, and ``resume_from_checkpoint="latest"`` takes the newest
checkpoint in the folder, whoever wrote it (a run stopped at 110/400 "resumed" from another run's
checkpoint-400, at "step 401/400"). So:

- each run gets its own output folder by default (``default_output_dir``: ``outputs/<run name>``
  beside the runs folder) when the job names none;
- a run that starts records itself as the folder's owner (``OWNER_FILE`` in the output folder);
- a new run into a folder that holds another run's checkpoints, final model or adapter is refused
  (``conflict``) unless it resumes that run's lineage or the user asked to overwrite
  (``JobConfig.overwrite_output``, the form's "overwrite" box, ``train --overwrite-output``);
- Resume continues a run from *its own* last complete checkpoint (``own_checkpoint``): the one it
  stopped with, else the newest of its recorded saves, else (runs of earlier versions, which shared
  folders) the newest complete checkpoint written while it ran.

Qt-free and torch-free.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from gaudi_gui.core import atomic, jsonfile, paths
from gaudi_gui.core.events import EventType
from gaudi_gui.core.runstore import Run, checkpoint_complete, complete_checkpoints, latest_checkpoint

#: The owner record a run leaves in its output folder: {"run": "<run folder>", "name": "<run name>"}.
OWNER_FILE = ".gaudi-gui-run.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: What a training run leaves in its output folder (besides checkpoint-N folders).
_RESULTS = ("final", "adapter", "merged", "model.safetensors", "adapter_model.safetensors",
            "pytorch_model.bin", "trainer_state.json")
#: How many writers an output folder's record keeps (a long chain of resumes, the parts of a job).
MAX_OWNERS = 64
#: How many links of "resumed from" are followed (a loop in damaged files must end).
_MAX_CHAIN = 50
#: Seconds of slack around a legacy run's lifetime when its checkpoints are told apart by time.
_SLACK_S = 120.0


def default_output_dir(run_name: str) -> Path:
    """Where a run whose job names no output folder writes: ``<data>/outputs/<run name>``."""
    return paths.data_dir() / "outputs" / run_name


def holdings(folder: str | Path) -> list[str]:
    """What of a training run ``folder`` holds, for a message: ["checkpoint-10 … checkpoint-60 (6)",
    "final"]; empty for a missing or empty folder."""
    folder = Path(folder).expanduser()
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    steps = sorted(int(m.group(1)) for m in (_CHECKPOINT.match(n) for n in names) if m)
    out: list[str] = []
    if len(steps) == 1:
        out.append(f"checkpoint-{steps[0]}")
    elif steps:
        out.append(f"checkpoint-{steps[0]} … checkpoint-{steps[-1]} ({len(steps)})")
    out += [n for n in _RESULTS if n in names]
    return out


def owners_of(folder: str | Path) -> list[str]:
    """The run folders recorded as writers of output ``folder``, oldest first: a run, the runs that
    resumed it, and the parts of one multi-node run (several machines' runs of one job share an
    output folder on a shared file system). Empty when none is recorded."""
    try:
        data = jsonfile.read(Path(folder).expanduser() / OWNER_FILE)
    except jsonfile.FileProblem:
        return []
    if not isinstance(data, dict):
        return []
    runs = data.get("runs")
    if isinstance(runs, list):
        return [r for r in runs if isinstance(r, str)]
    run = data.get("run")  # the first form of the record: one run
    return [run] if isinstance(run, str) else []


def owner_of(folder: str | Path) -> str:
    """The newest run recorded as a writer of output ``folder``; "" when none is recorded."""
    owners = owners_of(folder)
    return owners[-1] if owners else ""


def claim(folder: str | Path, run: Run, *, replace: bool = False) -> None:
    """Record ``run`` as a writer of output ``folder`` (made if missing): added to the runs already
    recorded (its lineage, or the other parts of its multi-node job), or alone with ``replace`` (the
    user said overwrite). Under the record's lock: the parts of one job start together and claim
    together, and two read-modify-writes that cross lose one part (whose Resume is then refused)."""
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    with atomic.locked(folder / OWNER_FILE):
        runs = [] if replace else owners_of(folder)
        runs = [r for r in runs if r != str(run.folder)] + [str(run.folder)]
        atomic.write_json(folder / OWNER_FILE, {"runs": runs[-MAX_OWNERS:], "run": str(run.folder),
                                                "name": run.name}, fsync=False)


def lineage(run_folder: str) -> list[str]:
    """``run_folder`` and the runs it resumed, newest first (resolved paths)."""
    out: list[str] = []
    current = run_folder
    while current and len(out) < _MAX_CHAIN:
        resolved = _resolved(current)
        if resolved in out:
            break
        out.append(resolved)
        current = Run(resolved).status().resumed_from
    return out


def _resolved(path: str) -> str:
    with contextlib.suppress(OSError, RuntimeError):
        return str(Path(path).expanduser().resolve())
    return path


@dataclass(frozen=True)
class Conflict:
    """An output folder that holds another run's files."""

    folder: str
    #: The owning run's folder ("" when the files carry no owner record).
    owner: str
    holds: tuple[str, ...]

    @property
    def message(self) -> str:
        what = ", ".join(self.holds) or "files of a training run"
        gone = "" if Path(self.owner).is_dir() else " (its run folder is gone)"
        whose = f"run {Path(self.owner).name}{gone}" if self.owner else "an earlier run"
        return (f"{self.folder} holds {whose}'s {what}: a new run would write over them. Leave the "
                f"output folder empty (each run gets its own), choose another, or tick 'overwrite'")


def conflict(output_dir: str, *, resumed_from: str = "") -> Conflict | None:
    """Why a run (resuming ``resumed_from``) must not write into ``output_dir``; None
    when the folder is new, empty, or holds only that run's lineage's files."""
    if not output_dir.strip():
        return None
    folder = Path(output_dir).expanduser()
    owners = owners_of(folder)
    held = holdings(folder)
    if not owners and not held:
        return None
    if not owners and resumed_from:
        # A folder of an earlier version's runs (no owner record): the resumed run's own checkpoint
        # was picked by own_checkpoint, which is what matters for a resume.
        return None
    if owners:
        if not held:
            return None  # claimed, nothing written yet (a run starting, or another part of its job)
        mine = set(lineage(resumed_from)) if resumed_from else set()
        # Resuming any writer of the folder, or an earlier link of a writer's chain, is its lineage.
        if mine and any(_resolved(o) in mine or mine & set(lineage(o)) for o in owners):
            return None
    return Conflict(str(folder), owners[-1] if owners else "", tuple(held))


def own_checkpoint(run: Run) -> Path | None:
    """The newest complete checkpoint ``run`` itself wrote (see the module's note); None when it has
    none. Never another run's checkpoint that shares its output folder."""
    status = run.status()
    if status.checkpoint and checkpoint_complete(status.checkpoint):
        return Path(status.checkpoint)
    saved: list[tuple[int, Path]] = []
    for event in run.events():
        if event.get("type") == EventType.CHECKPOINT_SAVED and isinstance(event.get("path"), str):
            step = event.get("step")
            saved.append((step if isinstance(step, int) else 0, Path(event["path"])))
    for _step, path in sorted(saved, key=lambda s: s[0], reverse=True):
        if checkpoint_complete(path):
            return path
    if saved:
        return None  # its recorded checkpoints are gone or incomplete: nothing of its own is left
    out = run.output_dir()
    if out is None:
        return None
    owners = {_resolved(o) for o in owners_of(out)}
    if owners and _resolved(str(run.folder)) not in owners:
        return _written_during(out, status.started_at, status.ended_at)
    if owners:
        return latest_checkpoint(out)
    # An earlier version's run (no owner record, no save events): only checkpoints written while it
    # ran, up to the step it reached, are its own.
    return _written_during(out, status.started_at, status.ended_at, upto=status.step or None)


def _written_during(folder: Path, start: float, end: float, upto: int | None = None) -> Path | None:
    """The newest complete checkpoint of ``folder`` written between ``start`` and ``end`` (with some
    slack), at most step ``upto``."""
    if not start:
        return None
    best: tuple[int, Path] | None = None
    for step, entry in complete_checkpoints(folder):
        try:
            written = (entry / "trainer_state.json").stat().st_mtime
        except OSError:
            continue
        if written < start - _SLACK_S or (end and written > end + _SLACK_S):
            continue
        if upto is not None and step > upto:
            continue
        if best is None or step > best[0]:
            best = (step, entry)
    return best[1] if best else None


__all__ = ["MAX_OWNERS", "OWNER_FILE", "Conflict", "claim", "conflict", "default_output_dir", "holdings",
           "lineage", "own_checkpoint", "owner_of", "owners_of"]
