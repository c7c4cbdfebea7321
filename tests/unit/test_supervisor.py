"""The one supervisor loop (core.supervisor), on real child processes and no torch: a stand-in launcher
(a Python child that writes the events a worker writes) makes each case take seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.launch import Launch
from gaudi_gui.core.prepare import PreparedRun
from gaudi_gui.core.proctree import ProcessRef
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.core.stopper import KILL_NOW_SIGNAL, Stopper
from gaudi_gui.core.supervisor import STEP_WRITE_S, finish, supervise, wait_gone
from tests.helpers import wait_until

TOKEN = "hf_" + "a" * 30

# A launcher standing in for accelerate + the worker: a metrics event every 0.1 s, a console line with
# a token, then the end event (or, with a step count of 0, training forever until killed).
LAUNCHER = """
import json, os, sys, time
events, steps = sys.argv[1], int(sys.argv[2])
fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
def event(**e):
    os.write(fd, (json.dumps(e) + "\\n").encode())
total = steps or 100000
event(type="training_started", start_step=0, max_steps=total, world_size=1)
print("token " + sys.argv[3], flush=True)
step = 0
while steps == 0 or step < steps:
    step += 1
    event(type="metrics", step=step, max_steps=total, loss=1.0 / step, elapsed=step * 0.1)
    time.sleep(0.1)
event(type="finished", global_step=step, max_steps=total, final_loss=1.0 / step)
"""


class Requests:
    """Stop requests as the CLI's signal handlers count them."""

    def __init__(self) -> None:
        self.count = 0
        self.last = ""

    def ask(self, name: str) -> None:
        self.last = name
        self.count += 1


def _prepared(tmp_path: Path, steps: int) -> PreparedRun:
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out")})
    run = RunStore(tmp_path / "runs").create(job)
    argv = [sys.executable, "-c", LAUNCHER, str(run.events_path), str(steps), TOKEN]
    return PreparedRun(run=run, job=job, user_job=job, launch=Launch(argv=argv), argv=argv,
                       env=dict(os.environ), device="cpu")


def _status(run: Run) -> dict[str, object]:
    return json.loads(run.status_path.read_text())


def test_steps_reach_the_status_while_it_trains_at_most_every_two_seconds(tmp_path: Path) -> None:
    prepared = _prepared(tmp_path, steps=45)  # 4.5 s of training
    seen: list[tuple[str, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            status = _status(prepared.run)  # written atomically: never half a file
            seen.append((str(status["state"]), int(status["step"])))  # type: ignore[call-overload]
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    lines: list[str] = []
    notes: list[str] = []
    try:
        result = supervise(prepared, grace_s=5, signals=Requests(), say=notes.append, echo=lines.append)
    finally:
        done.set()
        sampler.join()
    assert result.state == "finished" and result.exit_code == 0 and result.ok, result
    running = sorted({step for state, step in seen if state == "running" and step > 0})
    assert running and running[-1] < 45, seen  # progress shown before the end
    # One write every STEP_WRITE_S at most: 4.5 s of steps give 3 or 4 values, not 45.
    assert len(running) <= 4.5 / STEP_WRITE_S + 2, running
    assert f"token {TOKEN}" not in lines and any(line.startswith("token ") for line in lines), lines
    status = _status(prepared.run)
    assert status["state"] == "finished" and status["step"] == 45 and status["max_steps"] == 45
    assert status["exit_code"] == 0 and status["exit_description"] == "launcher exited with code 0"


def test_a_supervisor_with_no_one_to_echo_to_does_not_read_the_console(tmp_path: Path) -> None:
    """A background supervisor (``train --detach``: its stdout is /dev/null) leaves the launcher's
    console to the launcher's own log (tee): reading, redacting and discarding every line cost it CPU
    on the cores the run computes on (a tenth of a core while the demo model trained 140 steps/s)."""
    prepared = _prepared(tmp_path, steps=1)
    chatty = ("import os, sys\n"
              f"open({str(tmp_path / 'fd1')!r}, 'w').write(os.readlink('/proc/self/fd/1'))\n"
              "for i in range(50000):\n    print(f'step {i} ' + 'x' * 80)\n" + LAUNCHER)
    prepared.argv[2] = chatty
    t0 = time.process_time()
    result = supervise(prepared, grace_s=5, signals=Requests(), say=lambda _n: None, echo=None)
    cpu = time.process_time() - t0
    assert result.state == "finished" and result.ok, result
    assert (tmp_path / "fd1").read_text() == "/dev/null"
    assert cpu < 0.5, f"the supervisor spent {cpu:.2f} s of CPU on a console nobody reads"


def test_kill_now_request_kills_and_records_the_launchers_exit(tmp_path: Path) -> None:
    prepared = _prepared(tmp_path, steps=0)  # trains until killed
    requests = Requests()
    asked = threading.Timer(1.5, requests.ask, args=(KILL_NOW_SIGNAL.name,))
    asked.start()
    notes: list[str] = []
    try:
        result = supervise(prepared, grace_s=60, signals=requests, say=notes.append, echo=lambda _l: None)
    finally:
        asked.cancel()
    assert result.state == "killed" and "killed on request" in result.summary, result
    assert result.exit_code == -signal.SIGKILL and not result.ok
    assert any("kill requested" in n for n in notes), notes
    status = _status(prepared.run)
    assert status["exit_code"] == -signal.SIGKILL
    assert status["exit_description"] == "launcher killed by signal 9 (SIGKILL)"
    assert not prepared.run.processes_alive()


def _dying_child(tmp_path: Path, seconds: float) -> tuple[subprocess.Popen[bytes], ProcessRef, Path]:
    """A child that ends by itself ``seconds`` after it started, writing when it ended just before.
    It stands in for a rank sent SIGKILL that is still dying (a SIGKILL cannot be delayed, but a
    process stuck in a write to a slow disk ends only when the kernel lets it)."""
    ended = tmp_path / "ended"
    code = (f"import time, pathlib; time.sleep({seconds}); "
            f"pathlib.Path({str(ended)!r}).write_text(repr(time.time()))")
    child = subprocess.Popen([sys.executable, "-c", code])
    ref = ProcessRef.of(child.pid)
    assert ref is not None
    return child, ref, ended


def test_wait_gone_waits_for_the_process_and_is_bounded(tmp_path: Path) -> None:
    child, ref, _ended = _dying_child(tmp_path, 1.0)
    try:
        t0 = time.monotonic()
        assert wait_gone([ref], timeout_s=0.3, poll_s=0.05) == [ref]  # bounded: still there after 0.3 s
        assert 0.25 < time.monotonic() - t0 < 1.0
        assert wait_gone([ref], timeout_s=30, poll_s=0.05) == []
        assert not ref.is_alive()  # gone (a zombie until we reap it counts as gone)
    finally:
        child.kill()
        child.wait()


def test_the_end_waits_for_killed_processes_before_writing_the_outcome(tmp_path: Path) -> None:
    run = RunStore(tmp_path / "runs").create(JobConfig(training_args={"output_dir": str(tmp_path / "o")}))
    run.update_status(state="running", started_at=time.time())
    child, ref, ended = _dying_child(tmp_path, 1.5)
    try:
        assert wait_until(lambda: time.time() - ref.create_time > 0.3, 10)
        # A kill-now sent SIGKILL to the rank; the launcher has exited; the rank is still dying.
        stopper = Stopper(run, None, requested_at=time.time(), mode="ranks", killed=True,
                          kill_reason="request", kill_sent={ref})
        notes: list[str] = []
        result = finish(run, -signal.SIGKILL, stopper=stopper, events=[], say=notes.append)
        assert not ref.is_alive(), "the outcome was written while a killed rank still ran"
        status = run.status()
        assert ended.is_file() and status.ended_at >= float(ended.read_text())
    finally:
        child.kill()
        child.wait()
    assert any("waiting for 1 killed process(es)" in n for n in notes), notes
    assert result.state == "killed" and result.dying_pids == () and result.leftover_pids == ()
    assert status.state == "killed" and status.exit_code == -signal.SIGKILL
