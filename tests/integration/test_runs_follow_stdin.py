"""``gaudi-gui runs follow RUN`` and its stdin, as real child processes (issue 25, item 14).

A caller that gives the follower no stdin (cron, ``nohup``, ``ssh -n``, CI: ``< /dev/null``) gets the
whole history every time; a caller that keeps stdin open as a pipe and closes it (the app and the
remote follow over ssh, where nothing else tells the follower its reader went away) still ends it.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
from pathlib import Path

import psutil

from gaudi_gui.core.jobconfig import JobConfig
from tests.helpers import lines_of

EVENTS = 300
#: Past the follower's 1 MiB read per poll: the history takes several polls to print.
LOG_LINES = 14_000
TRIES = 20


def _run_folder(root: Path, name: str, *, state: str, launcher: psutil.Process | None = None) -> Path:
    folder = root / name
    (folder / "ranks").mkdir(parents=True)
    status: dict[str, object] = {"state": state, "step": EVENTS, "max_steps": EVENTS,
                                 "summary": f"{state} at step {EVENTS}", "started_at": 1.7e9}
    if state == "finished":
        status["ended_at"] = 1.7e9 + 5
    if launcher is not None:
        status["pid"], status["pid_create_time"] = launcher.pid, launcher.create_time()
    job = JobConfig(training_args={"output_dir": str(root / "out")}).to_dict()
    for file in ("config.json", "job.json"):
        (folder / file).write_text(json.dumps(job))
    (folder / "status.json").write_text(json.dumps(status))
    events = [json.dumps({"type": "step", "step": i + 1, "max_steps": EVENTS, "loss": 2.0 - i / EVENTS})
              for i in range(EVENTS)]
    if state == "finished":
        events.append(json.dumps({"type": "end", "state": "finished"}))
    (folder / "events.jsonl").write_text("".join(e + "\n" for e in events))
    (folder / "log.txt").write_text("".join(f"log line {i:06d} " + "x" * 80 + "\n" for i in range(LOG_LINES)))
    return folder


def _follow_argv(root: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(root), "follow", name]


def test_follow_with_stdin_from_dev_null_prints_the_whole_history_every_time(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _run_folder(root, "20250101-000000-done", state="finished")
    expected_events = EVENTS + 1
    for attempt in range(TRIES):
        done = subprocess.run(_follow_argv(root, "20250101-000000-done"), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        messages = [json.loads(line) for line in done.stdout.splitlines()]
        kinds = [m["t"] for m in messages]
        got_events = kinds.count("event")
        got_lines = kinds.count("log")
        assert (got_events, got_lines) == (expected_events, LOG_LINES), \
            f"try {attempt + 1}/{TRIES}: {got_events}/{expected_events} events, {got_lines}/{LOG_LINES} " \
            f"log lines; stderr: {done.stderr[-500:]}"
        assert kinds[-1] == "end" and messages[-1]["status"]["state"] == "finished", kinds[-3:]


def _pump(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    return lines_of(proc.stdout, keep_ends=True)


def _read_until(lines: queue.Queue[str | None], want: str, timeout: float = 60) -> list[dict[str, object]]:
    """The messages up to and including the first of kind ``want``."""
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError(f"the follower ended before a {want!r} line: {[m['t'] for m in got][-5:]}")
        message = json.loads(line)
        got.append(message)
        if message["t"] == want:
            return got
    raise AssertionError(f"no {want!r} line within {timeout} s")


def test_follow_with_no_stdin_keeps_following_a_running_run(tmp_path: Path) -> None:
    """/dev/null is no reader going away: a running run is followed on (as ``tail -f`` does)."""
    root = tmp_path / "runs"
    folder = _run_folder(root, "20250101-000000-running", state="running", launcher=psutil.Process())
    proc = subprocess.Popen(_follow_argv(root, folder.name), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = _pump(proc)
        history = _read_until(lines, "alive")  # the first heartbeat comes once the history is out
        assert sum(m["t"] == "event" for m in history) == EVENTS
        assert sum(m["t"] == "log" for m in history) == LOG_LINES
        with open(folder / "events.jsonl", "a") as fh:
            fh.write(json.dumps({"type": "step", "step": EVENTS + 1, "max_steps": EVENTS + 1}) + "\n")
        later = _read_until(lines, "event")
        assert later[-1]["event"] == {"type": "step", "step": EVENTS + 1, "max_steps": EVENTS + 1}
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)


def test_follow_ends_when_the_callers_stdin_pipe_closes(tmp_path: Path) -> None:
    """The remote protocol: over ssh nothing but stdin's end tells the follower its reader is gone."""
    root = tmp_path / "runs"
    folder = _run_folder(root, "20250101-000000-running", state="running", launcher=psutil.Process())
    proc = subprocess.Popen(_follow_argv(root, folder.name), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = _pump(proc)
        history = _read_until(lines, "alive")
        assert sum(m["t"] == "event" for m in history) == EVENTS
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
