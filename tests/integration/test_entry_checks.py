"""Bad input is refused where a job enters (issue 37, items 8 and 9): ``gaudi-gui train --config`` and
``queue add`` of every kind, with exit 2, one line per problem naming the field, and no traceback —
never minutes later in the launched ranks. The commands run as real children; the schema of the
training arguments is the installed transformers' (the cache the conftest fills from the real child)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import queue
from gaudi_gui.core.jobconfig import JobConfig
from tests.helpers import write_jsonl

QA = [{"question": f"Question {i}?", "answer": f"Answer {i}."} for i in range(48)]


def gg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ))


def job_path(tmp_path: Path, name: str = "job", *, model: str = "builtin:demo", dataset: str = "builtin:demo",
             kind: str = "text", **args: Any) -> Path:
    job = JobConfig(model=model, name=name)
    job.dataset.source = dataset
    if kind == "prompt_completion":
        job.dataset.kind, job.dataset.columns = kind, {"prompt": "question", "completion": "answer"}
    job.training_args = {"max_steps": 2, **args}
    path = tmp_path / f"{name}.json"
    job.save(path)
    return path


def refused(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout[-1000:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    for needle in needles:
        assert needle in res.stderr, res.stderr[-2000:]


def test_train_and_queue_add_refuse_a_bad_job_naming_the_field(tmp_path: Path) -> None:
    """max_steps "ten", an unknown training argument, a model folder that does not exist and an output
    folder that cannot be written: each named at its field by `train` and by `queue add`, nothing
    queued, no run folder made."""
    runs = tmp_path / "runs"
    ten = job_path(tmp_path, "ten", max_steps="ten")
    refused(gg("train", "--config", str(ten), "--runs-dir", str(runs), "--device", "cpu"),
            "max_steps: expected an integer, got 'ten'")
    unknown = job_path(tmp_path, "unknown", max_stepz=3)
    missing = job_path(tmp_path, "missing", model=str(tmp_path / "no-such-model"))
    # /sys refuses a new file even to root: the nearest existing parent of the folder is not writable.
    readonly = job_path(tmp_path, "readonly", output_dir="/sys/gaudi-gui-test-out/run")
    for command in (["train", "--runs-dir", str(runs), "--device", "cpu", "--config"],
                    ["queue", "add", "--device", "cpu", "--config"]):
        refused(gg(*command, str(unknown)), "max_stepz", "unknown argument")
        refused(gg(*command, str(missing)), "model: model folder not found:", str(tmp_path / "no-such-model"))
        refused(gg(*command, str(readonly)), "training_args.output_dir:", "/sys", "not writable")
    refused(gg("queue", "add", "--config", str(ten)), "max_steps: expected an integer, got 'ten'")
    assert not runs.exists() or not list(runs.iterdir())
    assert queue.read_state().entries == []


def test_queue_add_of_other_kinds_refuses_a_model_folder_that_is_not_there(tmp_path: Path) -> None:
    """Serve and eval jobs are checked by the one model rule too (a Hub id must be well formed)."""
    gone = str(tmp_path / "gone")
    refused(gg("queue", "add", "--kind", "serve", "--", "--model", gone), "model folder not found")
    refused(gg("queue", "add", "--kind", "serve", "--", "--model", "not a hub id!"),
            "neither a model folder nor a Hub id")
    refused(gg("queue", "add", "--kind", "eval", "--", "--model", "org/bad id", "--base", "builtin:demo",
               "--prompt", "Hi"), "neither a model folder nor a Hub id")
    assert queue.read_state().entries == []


@pytest.mark.parametrize(("content", "needles"), [
    (b"", ["is empty"]),
    (b"".join(json.dumps(r).encode() + b"\n" for r in QA[:5]) + b'{"question": "caf\xe9", "answer": "x"}\n',
     ["line 6", "not UTF-8"]),
    (b"".join(json.dumps(r).encode() + b"\n" for r in QA[:5]) + b'{"question": "cut", "ans',
     ["line 6", "not valid JSON", "cut off"]),
], ids=["empty", "not-utf8", "truncated"])
def test_an_unreadable_dataset_is_named_with_its_line_before_any_launch(
        tmp_path: Path, content: bytes, needles: list[str]) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(content)
    path = job_path(tmp_path, dataset=str(data), kind="prompt_completion")
    runs = tmp_path / "runs"
    refused(gg("train", "--config", str(path), "--runs-dir", str(runs), "--device", "cpu"),
            "dataset.source:", str(data), *needles)
    assert not runs.exists() or not list(runs.iterdir())


def test_rows_without_the_answer_column_are_counted_and_refused_past_the_threshold(tmp_path: Path) -> None:
    """16 of 48 rows with no answer: refused, with the count and the first such line. (2 of 48 are
    within the threshold: see tests/unit/test_dataset_scan.py; the worker drops and says them.)"""
    rows = [({"question": r["question"]} if i % 3 == 0 else r) for i, r in enumerate(QA)]
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    path = job_path(tmp_path, dataset=str(data), kind="prompt_completion")
    refused(gg("train", "--config", str(path), "--device", "cpu", "--runs-dir", str(tmp_path / "runs")),
            "16 of 48 rows", "line 1:", "'answer'")
    refused(gg("queue", "add", "--config", str(path)), "16 of 48 rows")
