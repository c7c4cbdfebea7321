"""One job on two hosts (``gaudi-gui train --hosts A,B``): two SSH destinations to this machine, one
process each, gloo on the CPU. A real two-machine rendezvous through accelerate's multi-node launch that
trains, stops with a checkpoint on both machines at the same step and resumes from it; a rank killed on
one host ends the run on the other with a message naming the host, and nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gaudi_gui.core.jobconfig import JobConfig
from tests.helpers import children_get_sigint, events, job_file, steps, wait_until
from tests.remote.conftest import SshHost

pytestmark = pytest.mark.slow

HOST_B = "gg-remote-b"  # the fixture's second alias of the same server


class Cli:
    def __init__(self, job: Path, *extra: str) -> None:
        with children_get_sigint():  # its Ctrl-C (SIGINT) stops every host
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), "--hosts",
                 f"gg-remote,{HOST_B}", "--device", "cpu", "--main-ip", "127.0.0.1", *extra],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=lambda s=stream, k=sink: k.extend(iter(s.readline, "")),
                             daemon=True).start()

    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def folders(self) -> dict[str, Path]:
        found = {}
        for line in self.out:
            if ": machine rank " in line and "run folder " in line:
                found[line.split(":", 1)[0]] = Path(line.rsplit("run folder ", 1)[1].strip())
        return found


@pytest.mark.usefixtures("demo_model")
def test_two_hosts_train_stop_with_a_checkpoint_on_both_and_resume(ssh_host: SshHost, tmp_path: Path) -> None:
    cli = Cli(job_file(tmp_path, ssh_host.home / "out"))
    assert wait_until(lambda: len(cli.folders()) == 2, 120), cli.text()
    runs = cli.folders()
    a, b = runs["gg-remote"], runs[HOST_B]
    assert wait_until(lambda: steps(a) >= 3, 240), cli.text() + (a / "log.txt").read_text()[-3000:]
    # One job: both machines are in one process group of two (world size 2), one per host.
    started = events(a, "training_started")[0]
    assert started["world_size"] == 2, started
    prefixes = {ln.split("|", 1)[0].strip() for ln in cli.out if "|" in ln}
    assert {"gg-remote", HOST_B} <= prefixes, prefixes  # every host's log, each line with its host
    cli.proc.send_signal(signal.SIGINT)  # Ctrl-C: every host stops with a checkpoint
    assert cli.proc.wait(timeout=240) == 0, cli.text()
    # The whole job's meter: each host's part (its own supervisor's meter) asked and summed.
    meter_line = next(ln for ln in cli.err + cli.out if ln.startswith("meter: the whole job"))
    assert meter_line.startswith(f"meter: the whole job (2 parts: gg-remote, {HOST_B}) · "), meter_line
    assert " 0 J" not in meter_line
    # ... and kept in host A's (machine rank 0's) run: its `runs show --json` says the whole job.
    kept = f"meter: the whole job's kept in gg-remote's run {a}"
    assert any(ln.startswith(kept) for ln in cli.err + cli.out), cli.text()
    shown = json.loads(subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "show", str(a), "--json"],
                                      capture_output=True, text=True, timeout=60).stdout)
    assert shown["meter"]["kind"] == "parts" and len(shown["meter"]["parts"]) == 2, shown["meter"]
    assert shown["meter_part"]["kind"] == "cpu"  # host A's own part, beside it
    # Host B has no rank 0: its own folder's steps are its first rank's "step" events (its meter times
    # its Gaudi compile meter by them), never "metrics" (rank 0's, in host A's folder).
    b_steps = [e["step"] for e in events(b, "step")]
    assert b_steps and b_steps == sorted(b_steps) and not events(b, "metrics"), b_steps
    saved_a = events(a, "checkpoint_saved")
    saved_b = events(b, "checkpoint_saved")
    assert saved_a and saved_b and saved_a[-1]["step"] == saved_b[-1]["step"], (saved_a, saved_b)
    step = saved_a[-1]["step"]
    checkpoint = ssh_host.home / "out" / f"checkpoint-{step}"
    assert (checkpoint / "trainer_state.json").exists()
    assert (checkpoint / "rng_state_0.pth").exists() and (checkpoint / "rng_state_1.pth").exists()
    for run in (a, b):
        status = json.loads((run / "status.json").read_text())
        assert status["state"] == "stopped" and f"checkpoint-{step}" in status["summary"], status
    assert ssh_host.wait_no_processes(30) == []

    # Resume on both from that checkpoint: training goes on from the same step to the end.
    resume = Cli(job_file(tmp_path, ssh_host.home / "out", resume=str(checkpoint), max_steps=step + 2))
    assert resume.proc.wait(timeout=300) == 0, resume.text()
    ra = resume.folders()["gg-remote"]
    assert steps(ra) == step + 2 and min(int(e["step"]) for e in events(ra, "metrics")) == step + 1
    assert json.loads((ra / "status.json").read_text())["state"] == "finished"
    assert ssh_host.wait_no_processes(30) == []


@pytest.mark.usefixtures("demo_model")
def test_a_rank_killed_on_one_host_ends_the_run_on_the_other(ssh_host: SshHost, tmp_path: Path) -> None:
    cli = Cli(job_file(tmp_path, ssh_host.home / "out"))
    assert wait_until(lambda: len(cli.folders()) == 2, 120), cli.text()
    a, b = cli.folders()["gg-remote"], cli.folders()[HOST_B]
    assert wait_until(lambda: steps(a) >= 2, 240), cli.text()
    rank = json.loads(next((b / "ranks").glob("rank-*.json")).read_text())
    os.kill(int(rank["pid"]), signal.SIGKILL)  # the machine of host B loses its rank
    assert cli.proc.wait(timeout=240) == 1, cli.text()
    text = cli.text()
    assert f"{HOST_B} (machine rank 1)" in text and "killing the other hosts' ranks" in text, text
    assert "the run failed on gg-remote-b" in text
    assert ssh_host.wait_no_processes(60) == []


def test_preflight_refuses_what_would_hang(ssh_host: SshHost, tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    JobConfig(model=str(tmp_path / "no-such-model"),
              training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2}).save(job)

    def train(hosts: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), "--hosts",
                               hosts, "--device", "cpu"], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ), check=False)

    # A host whose key is refused (gg-nokey: the same account as gg-remote; each alias has its own
    # connection, so the order of the two does not matter).
    res = train("gg-nokey,gg-remote")
    assert res.returncode == 3 and "ssh-copy-id gg-nokey" in res.stderr, res.stderr
    res = train(f"gg-remote,{HOST_B}")
    assert res.returncode == 3, res.stderr
    assert "no-such-model is not on gg-remote" in res.stderr and "Traceback" not in res.stderr
    assert f"no-such-model is not on {HOST_B}" in res.stderr
    res = train("gg-remote")
    assert res.returncode == 2 and "two or more hosts" in res.stderr
    assert ssh_host.wait_no_processes(20) == []
