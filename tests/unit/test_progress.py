"""The events -> progress/outcome reducer (core.progress) and the typed event vocabulary (core.events)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gaudi_gui.core.events import EVENTS_VERSION, EventType, EventWriter, read_events
from gaudi_gui.core.metrics import metric_record
from gaudi_gui.core.outcome import outcome_from_events, outcome_of
from gaudi_gui.core.progress import RunProgress, note

RUN: list[dict[str, Any]] = [
    {"type": "phase", "phase": "loading", "message": "loading model and dataset"},
    {"type": "dataset_ready", "rows": 12},
    {"type": "training_started", "max_steps": 10, "world_size": 2, "start_step": 0},
    {"type": "metrics", "step": 2, "max_steps": 10, "start_step": 0, "loss": 3.0, "elapsed": 2.0},
    {"type": "checkpoint_saving", "step": 2},
    {"type": "checkpoint_saved", "step": 2, "path": "/o/checkpoint-2", "seconds": 1.25},
    {"type": "metrics", "step": 4, "max_steps": 10, "start_step": 0, "loss": 2.0, "elapsed": 4.0},
    {"type": "metrics", "step": 4, "max_steps": 10, "loss": None, "train_loss": 2.5, "summary": True},
    {"type": "stopped", "rank": 1, "global_step": 4},
    {"type": "stopped", "rank": 0, "global_step": 4, "checkpoint": "/o/checkpoint-4"},
]


def test_the_vocabulary_is_the_strings_on_disk(tmp_path: Path) -> None:
    assert EventType.METRICS == "metrics" and EventType("checkpoint_saved") is EventType.CHECKPOINT_SAVED
    path = tmp_path / "events.jsonl"
    with EventWriter(path, rank=1) as writer:
        writer.write(EventType.METRICS, step=3)
        writer.write("some_future_type")
    raw = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(raw[0])["type"] == "metrics" and json.loads(raw[0])["v"] == EVENTS_VERSION
    first, future = read_events(path)
    assert first["type"] == EventType.METRICS and first["rank"] == 1
    assert metric_record(first) == {"step": 3, "time": first["time"]}  # "type", "v", "rank" left out
    progress = RunProgress()
    assert progress.apply(future) is None and progress.seen == 1 and progress.step == 0  # ignored
    assert progress.version == EVENTS_VERSION
    assert RunProgress().apply_all([{"type": "phase"}]).version == 1  # an old run's line: version 1


def test_a_run_step_by_step() -> None:
    p = RunProgress()
    assert p.apply(RUN[0]) is None and p.phase == "loading"
    p.apply(RUN[1])
    p.apply(RUN[2])
    assert (p.phase, p.world_size, p.max_steps, p.step) == ("training", 2, 10, 0)
    record = p.apply(RUN[3])
    assert record is not None and record["loss"] == 3.0 and p.records == [record]
    assert (p.step, p.loss, p.fraction, p.eta) == (2, 3.0, 0.2, 8.0)
    p.apply(RUN[4])
    assert p.saving_step == 2 and p.saving_since > 0
    p.apply(RUN[5])
    assert (p.saving_step, p.saving_since, p.checkpoint, p.checkpoint_step, p.checkpoint_seconds) == \
        (0, 0.0, "/o/checkpoint-2", 2, 1.25)
    p.apply_all(RUN[6:8])
    assert p.loss == 2.0 and len(p.records) == 3  # the summary record has no loss: the last one stays
    assert p.end is None
    p.apply_all(RUN[8:])
    assert p.end is not None and p.end["rank"] == 0  # the lowest rank's end
    assert p.seen == len(RUN)


def test_the_step_never_goes_back_and_the_first_error_stays() -> None:
    p = RunProgress(step=40, max_steps=100)  # what status.json said
    p.apply({"type": "metrics", "step": 38, "max_steps": 100})
    assert p.step == 40
    p.apply({"type": "error", "kind": "oom", "message": "out of memory"})
    p.apply({"type": "error", "kind": "other", "message": "then this"})
    p.apply({"type": "stop_requested", "signal": "SIGTERM"})
    p.apply({"type": "stop_requested", "signal": "SIGINT"})
    assert p.error is not None and p.error["kind"] == "oom"
    assert p.stop is not None and p.stop["signal"] == "SIGTERM"
    p.apply({"type": "training_started", "start_step": 60, "max_steps": 100})  # a resumed launch
    assert (p.step, p.start_step) == (60, 60)


def test_the_outcome_is_judged_from_the_same_state() -> None:
    out = outcome_from_events(RUN, exit_code=0)
    assert out["state"] == "stopped" and out["step"] == 4 and out["checkpoint"] == "/o/checkpoint-4"
    assert out["summary"] == "Stopped at step 4 — checkpoint-4 saved; Resume continues there"
    assert out["final_loss"] == 2.0
    assert outcome_of(RunProgress().apply_all(RUN), exit_code=0) == out
    assert outcome_of(RunProgress(), exit_code=2)["state"] == "failed"  # no worker ever wrote
    killed = outcome_of(RunProgress().apply_all(RUN[:4]), nobody_watched=True)
    assert killed["state"] == "killed" and killed["step"] == 2


def test_notes_say_each_event_once() -> None:
    assert note(RUN[2], " on h1") == "training on h1: step 0 of 10 on 2 process(es)"
    assert note(RUN[0]) == "loading model and dataset"
    assert note(RUN[4]) == "saving checkpoint-2…"
    assert note(RUN[5]) == "checkpoint-2 saved in 1.2 s"
    assert note({"type": "error", "kind": "oom", "message": "no memory"}) == "error (oom): no memory"
    assert note(RUN[3]) == "step 2/10 loss 3.0"
    assert note(RUN[7]) == "" and note(RUN[1]) == "" and note({"type": "unknown"}) == ""
