"""Training faults injected for real: a full disk, a spoofed event, a stop while loading."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore

ROOT = Path(__file__).resolve().parents[2]


def _unshare() -> list[str]:
    """A private mount namespace (root, or an unprivileged user namespace) for a real tmpfs."""
    tool = shutil.which("unshare")
    assert tool, "util-linux's unshare is needed to mount a full tmpfs for this test"
    return [tool, "-rm"] if os.geteuid() != 0 else [tool, "-m"]


def test_full_disk_refuses_cleanly_and_leaves_nothing(tmp_path: Path) -> None:
    """A runs folder on a real 256 KiB tmpfs, filled up: `gaudi-gui train` says so in one line (through
    the agent, whose start of the job found the disk full: at most the empty folder of job files the
    agent hands over is left)."""
    mount = tmp_path / "small"
    mount.mkdir()
    job = tmp_path / "job.json"
    JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2}).save(job)
    script = (f"mount -t tmpfs -o size=256k tmpfs {mount} && "
              f"mkdir {mount}/runs && (head -c 1M /dev/zero > {mount}/filler || true) && "
              f"{sys.executable} -m gaudi_gui train --config {job} --runs-dir {mount}/runs --device cpu; "
              f"echo \"rc=$?\"; ls -A {mount}/runs; ls -A {mount}/runs/.incoming 2>/dev/null")
    done = subprocess.run([*_unshare(), "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert "rc=1" in done.stdout, (done.stdout, done.stderr)
    assert "No space left on device" in done.stderr and "Traceback" not in done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("gaudi-gui train:")]
    assert len(said) == 1, done.stderr
    # No half-made run, no .tmp: the runs folder holds nothing but the agent's empty .incoming.
    assert done.stdout.strip().split("rc=1", 1)[1].split() in ([], [".incoming"]), done.stdout


def test_a_dataset_cannot_spoof_an_event(tmp_path: Path, demo_model: Path) -> None:
    """A column named like an event line is printed by the worker's error; it changes nothing."""
    spoof = '@gaudi-gui {"type":"metrics","step":9,"loss":-123,"final_loss":-123}'
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({spoof: f"row {i} text here"}) for i in range(4)) + "\n")
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2})
    job.dataset.source = str(data)
    job.dataset.text_column = spoof
    job.save(tmp_path / "job.json")
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
                           "--runs-dir", str(tmp_path / "runs"), "--device", "cpu"],
                          capture_output=True, text=True, timeout=240)
    (folder,) = [r.folder for r in RunStore(tmp_path / "runs").runs()]
    status = Run(folder).status()
    assert status.final_loss != -123 and status.step != 9
    assert all(e.get("loss") != -123 for e in Run(folder).events())
    assert done.returncode in (0, 1)


# Loaded into every Python process of the run: the rank's first import of `datasets` (its loading
# phase, after torch) says so in a file and then waits for as long as the test needs, like a dataset
# on a share that does not answer. Only the rank imports `datasets`.
_HOLD_LOADING = """
import importlib.abc, os, sys, time

class _Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "datasets":
            sys.meta_path.remove(self)
            open(os.environ["GAUDI_GUI_TEST_HELD"], "w").close()
            while True:
                time.sleep(0.1)
        return None

sys.meta_path.insert(0, _Hold())
"""


def test_stop_while_loading_ends_cleanly(tmp_path: Path, demo_model: Path) -> None:
    """SIGTERM to the rank while it loads: 'stopped before training began', through the command line.

    The rank is held in its load (its import of `datasets` waits) until the signal comes, so training
    cannot begin first however fast the machine: the CI's fresh clone once started training before
    the test's poll saw the rank file."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOLD_LOADING)
    held = tmp_path / "held"
    env = {**os.environ, "GAUDI_GUI_TEST_HELD": str(held),
           "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 100000})
    job.save(tmp_path / "job.json")
    argv = [sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
            "--runs-dir", str(tmp_path / "runs"), "--device", "cpu"]
    cli = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not held.exists() and time.monotonic() < deadline and cli.poll() is None:
        time.sleep(0.05)
    assert held.exists(), "the rank never reached its dataset load"
    (folder,) = [r.folder for r in RunStore(tmp_path / "runs").runs()]
    run = Run(folder)
    os.kill(run.ranks()[0]["pid"], signal.SIGTERM)
    _out, err = cli.communicate(timeout=120)
    status = run.status()
    assert not any(e["type"] == "training_started" for e in run.events())
    assert status.state == "stopped", (status, err[-2000:])
    assert status.summary == "Stopped before training began — nothing to save"
    assert cli.returncode == 0 and "Traceback" not in err


# A rank that sends itself SIGTERM right after one step of its start, then runs as the launcher runs it.
_STOP_AT = """
import os, signal, sys
from gaudi_gui.workers import train

config, point = sys.argv[1], sys.argv[2]

def hit():
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs as soon as os.kill returns

if point == "record_rank":  # the rank file has just appeared: what Stop waits for
    recorded = train.record_rank
    def record_rank(run_dir):
        recorded(run_dir)
        hit()
    train.record_rank = record_rank
else:  # a line the rank prints ("started, pid N", "loading model and dataset")
    said = train.say
    def say(text):
        said(text)
        if text.startswith(point):
            hit()
    train.say = say
sys.exit(train.main(["--config", config]))
"""


@pytest.mark.parametrize("point", ["record_rank", "started", "loading"])
def test_sigterm_at_each_step_of_a_rank_start_is_a_stop(tmp_path: Path, point: str) -> None:
    """The loaded-machine failure of the test above, made exact: Stop signals a rank the moment its
    rank file appears, and a SIGTERM there (or while it printed its first line) escaped the
    worker's handling: a traceback, exit 1, and a run whose events end without an end event, which
    the outcome calls "killed" (or, before any event, "failed")."""
    from gaudi_gui.core import events
    from gaudi_gui.core.outcome import outcome_from_events

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2}).save(
        run_dir / "config.json")
    done = subprocess.run([sys.executable, "-c", _STOP_AT, str(run_dir / "config.json"), point],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = (run_dir / "events.jsonl").read_text().splitlines() if (run_dir / "events.jsonl").exists() \
        else []
    seen = [e for e in map(events.decode, lines) if e is not None]
    outcome = outcome_from_events(seen, exit_code=done.returncode)
    assert (outcome["state"], outcome["summary"]) == (
        "stopped", "Stopped before training began — nothing to save"), (seen, done.stderr[-2000:])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "stopped before training began" in done.stdout
