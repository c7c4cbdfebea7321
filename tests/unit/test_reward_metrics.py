"""A preference run's reward metrics (TRL's ``rewards/*`` keys, as the worker puts them in a metrics
record) reach every reader of a run's metrics unchanged: the event file, the reducer the live view uses
and the run store's reader (Reopen, Compare); ``has_rewards`` tells a preference run's records from an
SFT run's."""

from __future__ import annotations

import math
from pathlib import Path

from gaudi_gui.core.events import EventType, EventWriter, read_events
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.metrics import REWARD_SERIES, has_rewards, metric_record
from gaudi_gui.core.progress import RunProgress
from gaudi_gui.core.runstore import RunStore

#: TRL 1.16 DPOTrainer's rewards of one logging step (what ``on_log`` received on the demo model).
REWARDS = {"rewards/chosen": 0.001207, "rewards/rejected": -1.812e-06, "rewards/accuracies": 0.75,
           "rewards/margins": 0.001209, "logps/chosen": -41.658, "logps/rejected": -34.408}


def test_rewards_pass_the_event_file_the_reducer_and_the_run_store_unchanged(tmp_path: Path) -> None:
    run = RunStore(tmp_path / "runs").create(JobConfig(name="dpo"))
    with EventWriter(run.events_path) as events:
        for step in (1, 2):
            events.write(EventType.METRICS, step=step, max_steps=2, loss=0.69 / step, learning_rate=5e-7,
                         **{**REWARDS, "rewards/margins": REWARDS["rewards/margins"] * step})
        events.write(EventType.METRICS, step=2, max_steps=2, loss=None, train_loss=0.6, summary=True)
    live = RunProgress()
    applied = [live.apply(e) for e in read_events(run.events_path)]
    for got in (applied, [metric_record(e) for e in read_events(run.events_path)], run.metrics()):
        rows = [r for r in got if r is not None and "rewards/margins" in r]
        assert [r["step"] for r in rows] == [1, 2]
        assert [r["rewards/margins"] for r in rows] == [0.001209, 0.002418]
        assert all(math.isclose(r[k], REWARDS[k]) for r in rows for k in REWARD_SERIES[:2])
        assert all(r["logps/chosen"] == -41.658 for r in rows)
        assert has_rewards([r for r in got if r is not None])
    assert not has_rewards([{"step": 1, "loss": 2.0}, {"step": 2, "loss": None, "train_loss": 1.9}])
    assert not has_rewards([{"step": 1, "rewards/margins": True}, {"step": 1, "rewards/chosen": "0.1"},
                            {"step": 2, "rewards/chosen": float("nan")}])
