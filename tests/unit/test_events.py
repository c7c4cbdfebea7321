"""The event file: one atomic append per event, read back whole, whatever else writes to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gaudi_gui.core.events import EventFollower, EventWriter, LogFollower, decode, read_events
from gaudi_gui.core.outcome import outcome_from_events
from gaudi_gui.core.secrets import recorded_env, redact, strip_secret_args

_WRITER = """
import sys
from gaudi_gui.core.events import EventWriter
path, rank, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = EventWriter(path, rank=rank)
for i in range(count):
    w.write("metrics" if rank == 0 else "noise", step=i, blob="x" * size)
w.close()
"""


def test_ranks_writing_at_once_lose_no_event(tmp_path: Path) -> None:
    """Rank 0 writes 3000 small events while another rank writes 200 events of 256 KiB each (and a
    third dumps raw 1 MiB chunks through its own EventWriter-less handle to a different file)."""
    path = tmp_path / "events.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "0", "3000", "10"]),
             subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "1", "200", str(256 * 1024)])]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    events = read_events(path)
    assert len(events) == 3200
    assert [e["step"] for e in events if e["rank"] == 0] == list(range(3000))
    assert [e["step"] for e in events if e["rank"] == 1] == list(range(200))
    assert all(len(e["blob"]) == 256 * 1024 for e in events if e["rank"] == 1)
    assert path.stat().st_mode & 0o777 == 0o600


def test_follower_waits_for_a_cut_line_and_skips_garbage(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    follower = EventFollower(path)
    assert follower.read() == []
    with EventWriter(path) as w:
        w.write("phase", phase="loading")
    with open(path, "ab") as fh:
        fh.write(b'not json\n[' * 1 + b"[" * 100000 + b'\n{"type": "metrics", "st')
    got = follower.read()
    assert [e["type"] for e in got] == ["phase"]
    with open(path, "ab") as fh:
        fh.write(b'ep": 3}\n')
    assert follower.read() == [{"type": "metrics", "step": 3}]
    assert decode('{"type": 3}') is None and decode("[]") is None and decode("") is None


def test_outcomes() -> None:
    stopped = [{"type": "metrics", "step": 40, "max_steps": 100}, {"type": "stop_requested", "rank": 0},
               {"type": "checkpoint_saved", "step": 41, "path": "/o/checkpoint-41"},
               {"type": "stopped", "rank": 0, "global_step": 41, "checkpoint": "/o/checkpoint-41"}]
    out = outcome_from_events(stopped, exit_code=143, stop_requested=True)
    assert out["state"] == "stopped" and out["step"] == 41
    assert out["summary"] == "Stopped at step 41 — checkpoint-41 saved; Resume continues there"
    killed = outcome_from_events(stopped[:2], exit_code=-9, stop_requested=True, killed=True)
    assert killed["state"] == "killed" and "grace period" in killed["summary"]
    preempted = outcome_from_events(stopped, exit_code=0)  # SIGTERM from outside: still "stopped"
    assert preempted["state"] == "stopped"
    abrupt = outcome_from_events(stopped[:1], exit_code=1,
                                 log_tail=["subprocess.CalledProcessError: died with <Signals.SIGKILL: 9>."])
    assert abrupt["state"] == "killed" and "SIGKILL" in abrupt["summary"]
    error = outcome_from_events([{"type": "error", "kind": "oom", "message": "out of memory"}], exit_code=1)
    assert error["state"] == "failed" and error["error_kind"] == "oom"
    never = outcome_from_events([], exit_code=2)
    assert never["state"] == "failed" and "before the training worker started" in never["summary"]
    done = outcome_from_events([{"type": "finished", "rank": 0, "global_step": 8, "final_loss": 1.5,
                                 "final_dir": "/o/final"}], exit_code=0)
    assert done["state"] == "finished" and done["summary"].startswith("Finished 8 steps; final loss 1.5000")


def test_secrets_stay_off_disk_and_screen() -> None:
    env = {"HF_TOKEN": "hf_" + "a" * 34, "WANDB_API_KEY": "k" * 40, "AWS_SECRET_ACCESS_KEY": "s" * 40,
           "HUGGING_FACE_HUB_TOKEN": "x", "TOKENIZERS_PARALLELISM": "false", "PATH": "/bin"}
    recorded = recorded_env({"PYTHONUNBUFFERED": "1"}, env)
    text = json.dumps(recorded)
    assert "hf_" not in text and "k" * 40 not in text and "s" * 40 not in text
    assert recorded["inherited_secret_names"] == ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN",
                                                  "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY"]
    assert "PATH" not in text
    args, removed = strip_secret_args({"hub_token": "hf_secret", "max_steps": 3})
    assert args == {"max_steps": 3} and removed == ["hub_token"]
    line = f"HF_TOKEN={env['HF_TOKEN']} accelerate launch --hub_token abc -m x --max_new_tokens 40"
    assert redact(line) == "HF_TOKEN=*** accelerate launch --hub_token *** -m x --max_new_tokens 40"
    assert redact("loading token hf_" + "b" * 30 + " done") == "loading token *** done"


def test_the_followed_log_shows_a_redrawn_line_once(tmp_path: Path) -> None:
    """tqdm redraws its bar with carriage returns in log.txt: followed (the Training tab's re-attached
    runs, ``runs follow``, a Slurm job), each line is what a terminal would show at its end, not one
    line per redraw; an unfinished line waits for its end."""
    log = tmp_path / "log.txt"
    log.write_bytes(b"[rank 0/1] start\r\n  0%|  | 1/9\r 11%|# | 2/9\r" + b" " * 20 + b"\r{'loss': '4.2'}\n"
                    b" 22%|## | 3/9\r 33%|### | 4/9")
    tail = LogFollower(log)
    assert tail.read() == ["[rank 0/1] start", "{'loss': '4.2'}"]
    assert tail.end == tail.offset - len(b" 22%|## | 3/9\r 33%|### | 4/9")  # where `runs follow` resumes
    with open(log, "ab") as fh:
        fh.write(b"\r100%|#####| 9/9\n[rank 0/1] done\n")
    assert tail.read() == ["100%|#####| 9/9", "[rank 0/1] done"]
    assert tail.read() == []
    assert tail.end == tail.offset == log.stat().st_size
