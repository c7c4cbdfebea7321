"""The queue per machine with real parts (issue 29, 38): the command line as a client of the agent that
keeps the queue, real detached training runs of the demo model on the CPU started by the agent, and the
fake hl-smi replaying a recorded server whose process list can show a foreign process holding cards.

``GAUDI_GUI_QUEUE_RECHECK_S`` is set to an hour in these tests: the queue's periodic look at the cards
never fires, so every start here was caused by what the test changed (a run of the queue ending, a
holder process ending, a request) — that is what "starts within seconds of the cards freeing" rests
on, with no time bound a slow machine could break."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import agentwire, queue
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run

pytestmark = pytest.mark.usefixtures("demo_model")

DATA = Path(__file__).resolve().parents[1] / "data" / "hlsmi"
WAIT_S = 180.0


def gg(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ), input=stdin)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll ``condition`` until it is truthy (no fixed sleep: the condition is the synchronisation);
    the timeout only ends a test that would otherwise hang, naming what it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {what}; queue: {listing()}")
        time.sleep(0.1)


def listing() -> str:
    state = queue.read_state()
    return "; ".join(f"{e.id} {e.state} {e.outcome} {e.why}" for e in state.entries)


def entries() -> dict[str, queue.Entry]:
    return {e.id: e for e in queue.read_state().entries}


def job_file(tmp_path: Path, name: str, **args: Any) -> Path:
    job = JobConfig(name=name)
    job.training_args = {"max_steps": 2, "logging_steps": 1, "per_device_train_batch_size": 2,
                         "save_strategy": "no", **args}
    path = tmp_path / f"{name}.json"
    job.save(path)
    return path


def add(path: Path, *extra: str) -> str:
    res = gg("queue", "add", "--config", str(path), "--device", "cpu", "--json", *extra)
    assert res.returncode == 0, res.stderr
    return str(json.loads(res.stdout)["entry"])


@pytest.fixture(autouse=True)
def queue_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The agent a command starts inherits it (the test's agent ends with the test: conftest).
    monkeypatch.setenv("GAUDI_GUI_QUEUE_RECHECK_S", "3600")
    yield


def queue_idle() -> bool:
    """The agent's queue keeps it up no more (nothing waits to start): it would end when idle."""
    with agentwire.Connection.open(start=False, client="test") as conn:
        return not [b for b in conn.request("status")["busy"] if b.startswith("queue:")]


@pytest.fixture
def idle_server(fake_hl_smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The fake hl-smi's 8 cards; the summary table (its Compute Processes) is a file the test can
    rewrite: returned."""
    table = tmp_path / "table.txt"
    table.write_text((DATA / "table-hl225-1.12.1.txt").read_text())
    monkeypatch.setenv("FAKE_HLSMI_TABLE", str(table))
    return table


def ended(ids: list[str]) -> dict[str, queue.Entry] | None:
    got = entries()
    return got if all(got.get(i) and got[i].state == "ended" for i in ids) else None


def test_two_jobs_on_the_same_cards_run_one_after_the_other(idle_server: Path, tmp_path: Path) -> None:
    first = add(job_file(tmp_path, "first"), "--cards", "2,3")
    second = add(job_file(tmp_path, "second"), "--cards", "2,3")
    wait_for(lambda: entries()[first].state == "started", "the first job to start")
    waiting = entries()[second]
    assert waiting.state == "waiting" and "in use by queued job q1 (first)" in waiting.why
    listed = gg("queue", "list")
    assert "waiting for modules 2 and 3" in listed.stdout and "started on modules 2 and 3" in listed.stdout
    b = wait_for(lambda: entries()[second].state == "started" and entries()[second],
                 "the second job to start")
    a = entries()[first]
    assert a.state == "ended" and a.outcome == "finished", a.summary
    # Its start is what this test is about: the rest of its run is not (ended now, like any run).
    assert gg("runs", "stop", b.run_folder, "--now").returncode == 0
    done = wait_for(lambda: ended([first, second]), "both jobs to end")
    b = done[second]
    run_a, run_b = Run(a.run_folder).status(), Run(b.run_folder).status()
    # One after the other: the second run began after the first one ended, never beside it; and the
    # queue started it in the turn it saw the first end (its periodic look is an hour away).
    assert run_b.started_at >= run_a.ended_at
    assert b.started_at - a.ended_at >= 0
    assert a.run_folder != b.run_folder and run_a.output_dir != run_b.output_dir
    wait_for(queue_idle, "the queue to keep the agent up no more")


def test_a_job_waits_for_cards_a_foreign_process_holds_and_starts_when_they_free(
        idle_server: Path, tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        table = idle_server.read_text()
        held = f"|   0        {holder.pid}  C      python3 train.py" + " " * 25 + "2040MiB    |"
        lines = table.splitlines()
        # AIP 0 of the recorded table is module 2 of the fake server (csv-index-module_id.txt)
        row = next(i for i, line in enumerate(lines) if line.startswith("|   0        N/A"))
        lines[row] = held
        idle_server.write_text("\n".join(lines) + "\n")
        job = add(job_file(tmp_path, "patient"), "--cards", "2,")
        waiting = wait_for(lambda: entries()[job].state == "waiting" and entries()[job], "the job to wait")
        assert f"module 2: held by pid {holder.pid}" in waiting.why
        assert entries()[job].state == "waiting"
        # The holder ends and hl-smi no longer lists it: the queue sees its pid go and looks again.
        idle_server.write_text(table)
        holder.kill()
        holder.wait()
        done = wait_for(lambda: ended([job]), "the job to run once the card freed")
        assert done[job].outcome == "finished" and done[job].cards_used == [2]
    finally:
        holder.kill()
        holder.wait()


def test_three_queued_jobs_run_with_no_window(tmp_path: Path) -> None:
    """Three CPU trainings: each runs alone (issue 37 item 12: on a 2-core machine all three started
    together), the next one starting only after the one before it ended."""
    ids = [add(job_file(tmp_path, f"night{i}")) for i in range(3)]
    wait_for(lambda: entries()[ids[0]].state == "started", "the first job to start")
    second = entries()[ids[1]]
    assert second.state == "waiting" and "waiting for the CPU: q1 (night0) is running" in second.why, \
        listing()
    assert "waiting for the CPU" in gg("queue", "list").stdout
    done = wait_for(lambda: ended(ids), "three jobs to end")
    folders = {done[i].run_folder for i in ids}
    assert len(folders) == 3
    runs = [Run(done[i].run_folder).status() for i in ids]
    for i, status in zip(ids, runs, strict=True):
        assert status.state == "finished" and done[i].outcome == "finished", status.summary
    assert len({Run(f).status().output_dir for f in folders}) == 3
    for before, after in itertools.pairwise(runs):
        assert after.started_at >= before.ended_at, (before, after)


def test_queue_set_cpu_jobs_and_its_bad_input(tmp_path: Path) -> None:
    bad = gg("queue", "set", "--cpu-jobs", "two")
    assert bad.returncode == 2 and "--cpu-jobs takes" in bad.stderr and "Traceback" not in bad.stderr
    ok = gg("queue", "set", "--cpu-jobs", "2")
    assert ok.returncode == 0 and "CPU jobs: 2 at a time" in ok.stdout, ok.stderr
    assert json.loads(gg("queue", "list", "--json").stdout)["cpu_jobs"] == 2
    wait_for(queue_idle, "the queue to keep the agent up no more")


def test_a_failing_job_ends_with_its_outcome_and_the_next_one_runs(idle_server: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": "not a number"}')
    job = JobConfig(name="broken", model=str(broken))
    job.training_args = {"max_steps": 2, "save_strategy": "no"}
    job.save(tmp_path / "broken.json")
    bad = add(tmp_path / "broken.json", "--cards", "4,")
    good = add(job_file(tmp_path, "good"), "--cards", "4,")
    done = wait_for(lambda: ended([bad, good]), "both jobs to end")
    assert done[bad].outcome == "failed", done[bad].summary
    assert done[good].outcome == "finished", done[good].summary
    assert done[bad].attempts == 1  # a job that fails is not a transient start fault: not retried


def test_priorities_move_remove_pause_and_the_same_output_folder(tmp_path: Path) -> None:
    assert gg("queue", "pause").returncode == 0
    out = tmp_path / "shared-output"
    a = add(job_file(tmp_path, "a", output_dir=str(out)))
    b = add(job_file(tmp_path, "b"))
    c = add(job_file(tmp_path, "c"), "--priority", "5")
    refused = gg("queue", "add", "--config", str(job_file(tmp_path, "d", output_dir=str(out))))
    assert refused.returncode == 2 and str(out) in refused.stderr and "q1 (a)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    def order() -> list[str]:
        data = json.loads(gg("queue", "list", "--json").stdout)
        return [e["id"] for e in sorted(data["entries"], key=lambda e: e["position"]) if e["position"]]

    assert order() == [c, a, b]
    assert gg("queue", "move", b, "--before", c).returncode == 0
    assert order() == [b, c, a]
    listed = json.loads(gg("queue", "list", "--json").stdout)
    assert listed["paused"] and all(e["why"] == "the queue is paused" for e in listed["entries"])
    bad = gg("queue", "move", "q99", "--before", a)
    assert bad.returncode == 2 and "no queued job 'q99'" in bad.stderr
    usage = gg("queue", "add", "--config", str(tmp_path / "a.json"), "--cards", "two")
    assert usage.returncode == 2 and "--cards takes" in usage.stderr
    for entry_id in (a, b, c):
        assert gg("queue", "remove", entry_id).returncode == 0
    assert all(e.outcome == "removed" for e in entries().values())
    # Nothing left to run: the queue keeps the agent up no more.
    wait_for(queue_idle, "the queue to keep the agent up no more")
