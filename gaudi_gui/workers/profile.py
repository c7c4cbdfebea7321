"""``profile_steps``: N training steps recorded with torch.profiler in rank 0 (issue 40).

``torch.profiler.profile(activities, schedule=schedule(wait, warmup, active), on_trace_ready=
tensorboard_trace_handler(<run>/profile))`` with ``prof.step()`` in a TrainerCallback's ``on_step_end``
(the Trainer has no profiler flag). Activities: CPU always, CUDA where ``torch.cuda.is_available()``,
HPU where ``habana_frameworks`` imports. When the recorded steps end, the trace is written by
torch's handler and ``summary.json`` beside it (``core.profile`` reads both). The profiler is started
and stopped by the callback only: the steps before and after run without it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic
from gaudi_gui.core.profile import (
    FOLDER_NAME,
    PROFILE_SKIP_STEPS,
    PROFILE_WAIT,
    PROFILE_WARMUP,
    SUMMARY_NAME,
    TOP_OPERATORS,
)

#: Operator names that are collectives (all-reduce and friends, on every backend).
_COLLECTIVE_MARKS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "nccl", "hccl",
                     "gloo", "c10d::")
#: The Trainer's data loader spans (torch names them after the iterator).
_DATALOADER_MARK = "enumerate(DataLoader)"


def activities() -> tuple[list[Any], list[str]]:
    """The profiler activities of this process and their names: CPU, + CUDA, + HPU."""
    from torch.profiler import ProfilerActivity
    chosen = [ProfilerActivity.CPU]
    names = ["cpu"]
    import torch
    if torch.cuda.is_available():
        chosen.append(ProfilerActivity.CUDA)
        names.append("cuda")
    hpu = getattr(ProfilerActivity, "HPU", None)
    if hpu is not None and importlib.util.find_spec("habana_frameworks") is not None:
        with contextlib.suppress(Exception):
            import habana_frameworks.torch  # noqa: F401  (registers the HPU profiler)
            chosen.append(hpu)
            names.append("hpu")
    return chosen, names


def summarize(averages: Any, *, step_times: list[float], activity_names: list[str], t0: float,
              t1: float, steps_wanted: int, first_step: int) -> dict[str, Any]:
    """``summary.json`` from ``prof.key_averages()`` and the profiled steps' wall times."""
    rows = []
    host_us = device_us = 0.0
    dataloader_us = collective_us = 0.0
    for ev in averages:
        name = str(ev.key)
        self_cpu = float(getattr(ev, "self_cpu_time_total", 0.0) or 0.0)
        self_dev = float(getattr(ev, "self_device_time_total", 0.0) or 0.0)
        total_cpu = float(getattr(ev, "cpu_time_total", 0.0) or 0.0)
        total_dev = float(getattr(ev, "device_time_total", 0.0) or 0.0)
        if name.startswith("ProfilerStep"):
            continue  # the step spans themselves: every operator is inside them
        host_us += self_cpu
        device_us += self_dev
        if name.startswith(_DATALOADER_MARK):
            dataloader_us += total_cpu
        lowered = name.lower()
        if any(mark in lowered for mark in _COLLECTIVE_MARKS):
            # Self times: a c10d call and its backend's span nest, their totals would count twice.
            collective_us += self_cpu + self_dev
        rows.append({"name": name, "calls": int(getattr(ev, "count", 0) or 0),
                     "self_host_ms": round(self_cpu / 1000, 3), "host_total_ms": round(total_cpu / 1000, 3),
                     "self_device_ms": round(self_dev / 1000, 3),
                     "device_total_ms": round(total_dev / 1000, 3)})
    on_device = device_us > 0
    rows.sort(key=lambda r: (r["self_device_ms"] if on_device else 0.0, r["self_host_ms"]), reverse=True)
    step_ms = sum(step_times) * 1000
    return {
        "version": 1, "rank": int(os.environ.get("RANK", "0")), "activities": activity_names,
        "steps": len(step_times), "steps_wanted": steps_wanted, "first_step": first_step,
        "wait": PROFILE_WAIT, "warmup": PROFILE_WARMUP,
        "step_times_s": [round(s, 6) for s in step_times],
        "step_mean_s": round(sum(step_times) / len(step_times), 6) if step_times else None,
        "step_total_ms": round(step_ms, 3),
        "host_ms": round(host_us / 1000, 3), "device_ms": round(device_us / 1000, 3) if on_device else None,
        "dataloader_ms": round(dataloader_us / 1000, 3),
        "collective_ms": round(collective_us / 1000, 3),
        "t0": round(t0, 3), "t1": round(t1, 3),
        "top_operators": rows[:TOP_OPERATORS],
    }


def make_callback(steps: int, run_dir: Path, say: Callable[[str], None]) -> Any:
    """The TrainerCallback that profiles ``steps`` steps (rank 0's; the caller adds it there only)."""
    import torch
    from transformers import TrainerCallback

    out_dir = run_dir / FOLDER_NAME

    class ProfileCallback(TrainerCallback):
        def __init__(self) -> None:
            self.prof: Any = None
            self.names: list[str] = []
            self.seen = 0
            self.steps = steps
            self.first_step = 0
            self.marks: list[float] = []
            self.done = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            room = state.max_steps - state.global_step - PROFILE_SKIP_STEPS if state.max_steps > 0 else steps
            if room < 1:
                say(f"profile: not recorded: {state.max_steps - state.global_step} step(s) to train leave no "
                    f"room after the {PROFILE_SKIP_STEPS} warm-up steps")
                self.done = True
                return
            if room < steps:
                say(f"profile: {room} step(s) instead of {steps}: that is what this run has left after "
                    f"its warm-up")
                self.steps = room
            chosen, self.names = activities()
            out_dir.mkdir(parents=True, exist_ok=True)
            schedule = torch.profiler.schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=self.steps,
                                               repeat=1)
            handler = torch.profiler.tensorboard_trace_handler(
                str(out_dir), worker_name=f"rank{os.environ.get('RANK', '0')}")
            self.prof = torch.profiler.profile(activities=chosen, schedule=schedule, on_trace_ready=handler)
            self.prof.start()
            self.first_step = state.global_step + PROFILE_SKIP_STEPS + 1
            say(f"profile: recording steps {self.first_step}..{self.first_step + self.steps - 1} "
                f"({', '.join(self.names)}) into {out_dir}")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.prof is None or self.done:
                return
            self.seen += 1
            # The profiled steps' wall times: between the prof.step() that opens a recorded step and
            # the one that closes it, as its ProfilerStep span (device work synchronised by the
            # loss's .item() the Trainer logs each step, or by the next step's first wait).
            if self.seen >= PROFILE_SKIP_STEPS:
                self.marks.append(time.time())
            self.prof.step()
            if self.seen == PROFILE_SKIP_STEPS + self.steps:
                self.finish()

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.prof is not None and not self.done:
                self.finish()  # stopped early: what was recorded

        def finish(self) -> None:
            self.done = True
            prof, self.prof = self.prof, None
            try:
                prof.stop()
                marks = self.marks
                times = [b - a for a, b in itertools.pairwise(marks)]
                summary = summarize(prof.key_averages(), step_times=times, activity_names=self.names,
                                    t0=marks[0] if marks else time.time(),
                                    t1=marks[-1] if marks else time.time(), steps_wanted=self.steps,
                                    first_step=self.first_step)
                atomic.write_json(out_dir / SUMMARY_NAME, summary, indent=1, fsync=False)
                say(f"profile: {summary['steps']} step(s) recorded, mean {summary['step_mean_s']} s; trace "
                    f"and summary in {out_dir}")
            except Exception as exc:  # a profile must never end the training
                say(f"profile: could not write it: {type(exc).__name__}: {exc}")

    return ProfileCallback()


__all__ = ["activities", "make_callback", "summarize"]
