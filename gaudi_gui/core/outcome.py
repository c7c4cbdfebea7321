"""How a run ended, told from its events: one state and one human sentence.

The state comes from what the worker proved (its end event, its last checkpoint), not from the
launcher's exit code alone: a shell that exits 143 after a clean stop is "stopped", a worker killed
by SIGTERM from outside (preemption) saves and is "stopped", never "finished" at step 620 of 100000,
and a run that ended without an end event was killed. Qt-free; the Training tab, the CLI and a
reader that finds a run nobody watched all use it.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gaudi_gui.core.events import EventType
from gaudi_gui.core.progress import RunProgress


def _signal_name(code: int) -> str:
    number = -code if code < 0 else code - 128
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _is_signal_death(code: int | None) -> bool:
    return code is not None and (code < 0 or code in (128 + 9, 128 + 15, 128 + 2, 128 + 1, 128 + 6))


# What launchers print when a rank died of a signal (accelerate's subprocess, torchrun's agent).
_DIED = re.compile(r"died with <Signals\.(SIG[A-Z]+)|exitcode\s*:\s*-(\d+)|Signal (\d+) \((SIG[A-Z]+)\)")


def _signal_in_log(lines: Sequence[str]) -> str:
    for line in reversed(lines):
        match = _DIED.search(line)
        if match:
            if match.group(1):
                return match.group(1)
            if match.group(2):
                return _signal_name(-int(match.group(2)))
            return match.group(4)
    return ""


def outcome_from_events(events: Iterable[Mapping[str, Any]], status: Any = None, *,
                        exit_code: int | None = None, stop_requested: bool = False,
                        killed: bool = False, nobody_watched: bool = False,
                        log_tail: Sequence[str] = (), kill_reason: str = "") -> dict[str, Any]:
    """The final fields of a run's status: state, summary, step, max_steps, checkpoint, error...

    ``killed``: the supervisor had to SIGKILL (grace period over, or "kill now"). ``nobody_watched``:
    the supervisor is gone and the exit code is unknown.
    """
    progress = RunProgress(step=int(getattr(status, "step", 0) or 0),
                           max_steps=int(getattr(status, "max_steps", 0) or 0)).apply_all(events)
    return outcome_of(progress, exit_code=exit_code, stop_requested=stop_requested, killed=killed,
                      nobody_watched=nobody_watched, log_tail=log_tail, kill_reason=kill_reason)


def outcome_of(progress: RunProgress, *, exit_code: int | None = None, stop_requested: bool = False,
               killed: bool = False, nobody_watched: bool = False, log_tail: Sequence[str] = (),
               kill_reason: str = "") -> dict[str, Any]:
    """``outcome_from_events`` of the events ``progress`` has taken."""
    step, max_steps, checkpoint = progress.step, progress.max_steps, progress.checkpoint
    end, error, final_loss = progress.end, progress.error, progress.loss
    out: dict[str, Any] = {}
    if end is not None:
        if isinstance(end.get("global_step"), int):
            step = end["global_step"]
        if isinstance(end.get("max_steps"), int) and end["max_steps"] > 0:
            max_steps = end["max_steps"]
        if end.get("checkpoint"):
            checkpoint = str(end["checkpoint"])
        if isinstance(end.get("final_loss"), (int, float)):
            final_loss = float(end["final_loss"])
    stop_seen, saw_worker = progress.stop is not None, progress.seen > 0
    ckpt_name = Path(checkpoint).name if checkpoint else ""
    ckpt_at_stop = bool(checkpoint) and ckpt_name == f"checkpoint-{step}"

    if error is not None and (end is None or end.get("type") != EventType.FINISHED):
        state = "failed"
        message = str(error.get("message", "")) or "the worker reported an error"
        summary = f"Failed at step {step}: {message}" if step else f"Failed: {message}"
        out.update(error=message, error_kind=str(error.get("kind", "other")))
    elif end is not None and end.get("type") == EventType.FINISHED and (not killed or end.get("final_dir")):
        state = "finished"
        loss = f"; final loss {final_loss:.4f}" if final_loss is not None else ""
        where = f"; model saved in {end.get('final_dir')}" if end.get("final_dir") else ""
        summary = f"Finished {step} steps{loss}{where}"
    elif end is not None and end.get("type") == EventType.STOPPED and (not killed or ckpt_at_stop):
        state = "stopped"
        if ckpt_at_stop:
            summary = f"Stopped at step {step} — {ckpt_name} saved; Resume continues there"
        elif end.get("before_training"):
            summary = "Stopped before training began — nothing to save"
        elif checkpoint:
            summary = (f"Stopped at step {step} — no checkpoint at this step; Resume continues from "
                       f"{ckpt_name}")
        else:
            summary = f"Stopped at step {step} — no checkpoint saved"
    elif (killed or stop_requested or stop_seen or _is_signal_death(exit_code) or nobody_watched
          or saw_worker):
        # The worker always ends through an end or error event unless something killed it.
        state = "killed"
        if killed:
            by_grace = kill_reason == "grace" or (stop_requested and not kill_reason)
            why = "the grace period ran out" if by_grace else "killed on request"
        elif nobody_watched:
            why = "ended without reporting how (its supervisor was gone)"
        elif exit_code is not None and _is_signal_death(exit_code):
            why = f"killed by {_signal_name(exit_code)}"
        elif _signal_in_log(log_tail):
            why = f"a training process was killed by {_signal_in_log(log_tail)}"
        else:
            why = "a training process ended abruptly without reporting (killed, or crashed)"
        keep = f"; Resume continues from {ckpt_name}" if checkpoint else "; no checkpoint"
        summary = f"Killed at step {step} — {why}{keep}"
    else:
        state = "failed"
        summary = (f"Failed: the launcher exited with code {exit_code} before the training worker "
                   f"started — see the log")
    out.update(state=state, summary=summary, step=step, max_steps=max_steps, checkpoint=checkpoint)
    if final_loss is not None:
        out["final_loss"] = final_loss
    if exit_code is not None:
        out["exit_code"] = exit_code
    return out


__all__ = ["outcome_from_events", "outcome_of"]
