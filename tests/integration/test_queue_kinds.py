"""Every job kind in the queue (issue 29): serve, eval, calibrate and download jobs queued with ``queue add
--kind K -- WORDS`` start through their own detached supervisors (``core.jobkind`` run folders, started by
the agent), an evaluation waits for the cards of a training job and runs after it, a download against
the fake Hub (tests/fake_hub.py) uses no cards. Real children, the demo model on the CPU (no hl-smi: the queue
bookkeeps card ids among its own jobs), nothing reaches the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import jobkind, queue
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.serve import pick_free_port
from tests.fake_hub import FakeHub, FakeRepo

# The queue's entries, the autouse fixture of the queue's environment, the agent's word on the queue.
from tests.integration.test_queue import entries, queue_env, queue_idle  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def gg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ), cwd=ROOT)


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    """Poll ``condition`` until it is truthy (no time bound: pytest-timeout has the last word)."""
    while True:
        value = condition()
        if value:
            return value
        ended_badly = [e for e in queue.read_state().entries
                       if e.state == "ended" and e.outcome not in ("finished", "stopped")]
        if ended_badly:
            pytest.fail(f"waiting for {what}: {[(e.id, e.outcome, e.summary) for e in ended_badly]}")
        time.sleep(0.1)


def add(*args: str) -> str:
    res = gg("queue", "add", "--json", *args)
    assert res.returncode == 0, res.stderr
    return str(json.loads(res.stdout)["entry"])


def test_a_queued_evaluation_runs_after_the_training_job_on_its_cards(demo_model: Path,
                                                                      tmp_path: Path) -> None:
    job = JobConfig(name="tune")
    job.training_args = {"max_steps": 2, "logging_steps": 1, "per_device_train_batch_size": 2,
                         "save_strategy": "no"}
    job.save(tmp_path / "tune.json")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The learning rate\n")
    train = add("--config", str(tmp_path / "tune.json"), "--device", "cpu", "--cards", "0,")
    evaluation = add("--kind", "eval", "--cards", "0,", "--", "--model", str(demo_model), "--base",
                     str(demo_model), "--prompts", str(prompts), "--max-new-tokens", "4", "--metrics",
                     "exact_match")
    listed = json.loads(gg("queue", "list", "--json").stdout)
    kinds = {e["id"]: e["kind"] for e in listed["entries"]}
    assert kinds == {train: "train", evaluation: "eval"}
    wait_for(lambda: entries()[train].state == "started", "the training job to start")
    waiting = entries()[evaluation]
    assert waiting.state in ("queued", "waiting"), waiting
    wait_for(lambda: entries()[evaluation].state == "waiting", "the evaluation to wait")
    assert "in use by queued job q1 (tune)" in entries()[evaluation].why
    done = wait_for(lambda: all(entries()[i].state == "ended" for i in (train, evaluation)) and entries(),
                    "both jobs to end")
    a, b = done[train], done[evaluation]
    assert (a.outcome, b.outcome) == ("finished", "finished"), (a.summary, b.summary)
    run_a, run_b = Run(a.run_folder), Run(b.run_folder)
    assert run_b.kind == "eval" and run_b.status().state == "finished"
    assert run_b.status().started_at >= run_a.status().ended_at
    assert b.cards_used == [0]
    result = json.loads((run_b.folder / jobkind.RESULT_NAME).read_text())
    assert Path(result["path"]).is_file()
    # The evaluation's command is its own: eval's words, run under its own supervisor.
    argv = json.loads((run_b.folder / jobkind.SPEC_NAME).read_text())["argv"]
    assert argv[3] == "eval" and "--events" in argv
    wait_for(queue_idle, "the queue to keep the agent up no more")


def test_a_queued_download_runs_without_cards_and_bad_words_are_refused(fake_hub: FakeHub) -> None:
    fake_hub.repos["org/small"] = FakeRepo(files={"config.json": b'{"a": 1}',
                                                  "model.safetensors": b"x" * 4096})
    refused = gg("queue", "add", "--kind", "download", "--cards", "2", "--", "org/small")
    assert refused.returncode == 2 and refused.stderr.strip() == \
        "gaudi-gui queue add: --cards: a download uses no cards"
    bad = gg("queue", "add", "--kind", "download", "--", "not a repo id")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    detached = gg("queue", "add", "--kind", "download", "--", "org/small", "--detach")
    assert detached.returncode == 2 and "--detach: not in a queued download job's words" in detached.stderr
    entry_id = add("--kind", "download", "--", "org/small")
    done = wait_for(lambda: entries()[entry_id].state == "ended" and entries()[entry_id], "the download")
    assert done.outcome == "finished", done.summary
    run = Run(done.run_folder)
    assert run.kind == "download" and run.status().summary.startswith("Downloaded: ")
    assert done.cards_used == [] and done.kind == "download"
    assert fake_hub.file_gets() == 2
    listed = gg("queue", "list")
    line = next(ln for ln in listed.stdout.splitlines() if entry_id in ln)
    assert line.split()[1:4] == [entry_id, "download", "download-small"] and "ended: finished" in line


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_a_queued_serve_starts_answers_and_stops_like_any_run(demo_model: Path) -> None:
    port = pick_free_port()
    entry_id = add("--kind", "serve", "--", "--model", "builtin:demo", "--device", "cpu", "--port",
                   str(port))
    started = wait_for(lambda: entries()[entry_id].state == "started" and entries()[entry_id],
                       "the server to start")
    run = Run(started.run_folder)
    assert run.kind == "serve"
    url = wait_for(lambda: jobkind.endpoint(run).get("url"), "the endpoint")
    assert _answers(url)
    assert gg("runs", "stop", run.name).returncode == 0
    done = wait_for(lambda: entries()[entry_id].state == "ended" and entries()[entry_id], "the end")
    assert done.outcome == "stopped", done.summary


def test_a_queued_calibration_runs_and_its_cards_come_from_the_queue(demo_model: Path) -> None:
    """``queue add --kind calibrate`` (issue 39): checked as ``calibrate`` checks its options, its cards
    given by the queue (not in its words); queued on the CPU, it measures and keeps its manifest."""
    refused = gg("queue", "add", "--kind", "calibrate", "--", "--model", "builtin:demo", "--cards", "1")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "gaudi-gui queue add: calibrate --cards: give the cards to queue add (--cards N|IDS): the queue "
        "starts it on them")
    bad = gg("queue", "add", "--kind", "calibrate", "--", "--model", "builtin:demo", "--rows", "0")
    assert bad.returncode == 2 and bad.stderr.strip() == \
        "gaudi-gui queue add: calibrate: --rows: 0 is not between 1 and 100000"
    entry_id = add("--kind", "calibrate", "--", "--model", "builtin:demo", "--prompt", "the cat sat",
                   "--prompt", "on the mat", "--device", "cpu")
    done = wait_for(lambda: entries()[entry_id].state == "ended" and entries()[entry_id], "the calibration")
    assert done.outcome == "finished", done.summary
    run = Run(done.run_folder)
    assert run.kind == "calibrate" and (run.folder / "manifest.json").is_file()
    assert run.status().summary.startswith("Finished: 2 rows measured")
