"""A preference run's reward metrics (TRL's ``rewards/*``, ``logps/*``, ``logits/*``) reach every reader
of a run's metrics under their TRL names: the worker's record keeps them (core.metrics.trainer_extras),
and the event file, the reducer the live view uses and the run store's reader pass them unchanged."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gaudi_gui.core.events import EventType, EventWriter, read_events
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.metrics import REWARD_KEYS, has_rewards, metric_record, trainer_extras
from gaudi_gui.core.progress import RunProgress
from gaudi_gui.core.runstore import RunStore

#: One logging step of TRL 1.16's DPOTrainer as ``on_log`` receives it (the keys and kinds of values
#: it logs), with an eval step's keys and what must not be kept.
DPO_LOGS: dict[str, Any] = {
            "loss": 0.6931, "grad_norm": 1.25, "learning_rate": 5e-5, "rewards/chosen": 0.0125,
            "rewards/rejected": -0.0075, "rewards/accuracies": 0.75, "rewards/margins": 0.02,
            "logps/chosen": -41.5, "logps/rejected": -44.25, "logits/chosen": -1.5,
            "logits/rejected": -1.625, "num_tokens": 512.0, "epoch": 0.5,
            "eval_rewards/margins": 0.03, "rewards/broken": float("nan"), "rewards/flag": True,
            "rewards/text": "0.1", "entropy": 3.5}


def test_trainer_extras_keep_the_preference_families_under_their_trl_names() -> None:
    kept = trainer_extras(DPO_LOGS)
    assert kept == {"rewards/chosen": 0.0125, "rewards/rejected": -0.0075, "rewards/accuracies": 0.75,
                    "rewards/margins": 0.02, "logps/chosen": -41.5, "logps/rejected": -44.25,
                    "logits/chosen": -1.5, "logits/rejected": -1.625, "eval_rewards/margins": 0.03}
    assert trainer_extras({"loss": 1.0, "learning_rate": 1e-4}) == {}  # an SFT step has none


def test_rewards_pass_the_event_file_the_reducer_and_the_run_store_unchanged(tmp_path: Path) -> None:
    run = RunStore(tmp_path / "runs").create(JobConfig(name="dpo"))
    with EventWriter(run.events_path) as events:
        for step in (1, 2):
            # As workers/train.py writes a record: its fixed keys, then the trainer's extras.
            events.write(EventType.METRICS, step=step, max_steps=2, loss=DPO_LOGS["loss"] / step,
                         learning_rate=5e-5, **trainer_extras({**DPO_LOGS, "rewards/margins": 0.02 * step}))
    live = RunProgress()
    records = [live.apply(e) for e in read_events(run.events_path)]
    stored = run.metrics()
    for got in (records, [metric_record(e) for e in read_events(run.events_path)], stored):
        assert [r["rewards/margins"] for r in got] == [0.02, 0.04]  # type: ignore[index]
        assert all(r is not None and all(math.isclose(r[k], DPO_LOGS[k]) for k in REWARD_KEYS[:2])
                   for r in got)
    assert has_rewards(stored) and not has_rewards([{"step": 1, "loss": 2.0}])
    assert not has_rewards([{"step": 1, "rewards/margins": True}])
