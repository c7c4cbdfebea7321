"""``gaudi-gui train --slurm --detach`` and the agent's Slurm jobs, against the real one-node Slurm
cluster (tests/slurm_cluster.py): the job is submitted by a supervisor in a session of its own, which
announces the run once sbatch took it and follows the job to its end. Through the agent (``job.start``
kind ``train`` with ``--slurm`` in its words) it is followed, listed, re-adopted by a new agent after a
SIGKILL, stopped with a checkpoint (``job.stop``) or cancelled at once (``job.stop`` now); a job whose
supervisor died (and no ``runs attach`` took over) gets a new one from the agent. A bad option
is refused with exit 2 and one line, a job sbatch refuses with exit 1 and one line, nothing followed.
Nothing is left running: the leftover guard of tests/conftest.py checks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gaudi_gui.core.agentwire import AgentError, Connection
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, checkpoint_complete
from tests.helpers import children_get_sigint, events, job_file, slow_disk_env, steps, wait_gone, wait_until
from tests.remote.conftest import SshHost
from tests.slurm_cluster import PARTITION, SlurmCluster

# One cluster per session: under xdist every Slurm test goes to the same worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

#: The words of an agent's Slurm training job on the test cluster.
SLURM_WORDS = ["--slurm", "--device", "cpu", "--partition", PARTITION, "--time", "10", "--grace", "90"]


def _slurm_state(slurm: SlurmCluster, job_id: str) -> str:
    done = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True,
                          env=slurm.env(), check=False, timeout=20)
    return done.stdout.split("JobState=", 1)[1].split()[0] if "JobState=" in done.stdout else done.stderr


def _job_id(folder: str | Path) -> str:
    return str(json.loads((Path(folder) / "slurm.json").read_text())["job_id"])


class _Heard:
    """What a subscriber heard of one job: its records, log lines and events, read by a thread on a
    connection of its own (the test waits on conditions, never on one message)."""

    def __init__(self, job_id: str) -> None:
        conn = Connection.open(start=False)
        self.conn, self.job_id = conn, job_id
        self.records: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.done = threading.Event()
        conn.request("subscribe", events=["job", "log", "event"], key=job_id)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(AgentError, OSError):  # closed by close(): the test is done with it
            self._take()

    def _take(self) -> None:
        while not self.done.is_set():
            for message in self.conn.stream(timeout=0.5):
                if self.done.is_set():
                    return
                if message.get("job_id") != self.job_id:
                    continue
                if message.get("ev") == "job":
                    self.records.append(dict(message["job"]))
                elif message.get("ev") == "log":
                    self.lines += message["lines"]
                elif message.get("ev") == "event":
                    self.events += message["events"]

    def steps(self) -> int:
        return max((int(e.get("step") or 0) for e in self.events if e.get("type") == "metrics"), default=0)

    def ended(self) -> dict[str, Any] | None:
        return next((r for r in reversed(self.records) if r["state"] not in ("queued", "running")
                     and not r["alive"]), None)

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)
        self.conn.close()


def _attach(folder: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """``gaudi-gui runs attach RUN``, its output (stdout and stderr) collected as it comes."""
    with children_get_sigint():
        proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "runs", "attach", str(folder)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    stream = proc.stdout
    assert stream is not None
    threading.Thread(target=lambda: out.extend(iter(stream.readline, "")), daemon=True).start()
    return proc, out


def _start(conn: Connection, tmp_path: Path, runs: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    config = JobConfig.load(job_file(tmp_path, tmp_path / "out")).to_dict()
    reply = conn.request("job.start", kind="train", runs_dir=runs, env=env or {},
                         job={"args": SLURM_WORDS, "config": config})
    return dict(reply["job"])


@pytest.mark.usefixtures("demo_model")
def test_an_agent_slurm_job_survives_the_agent_and_stops_with_a_checkpoint(slurm: SlurmCluster,
                                                                           tmp_path: Path) -> None:
    runs = str(tmp_path / "runs")
    with Connection.open() as conn:
        first_agent = int(conn.agent["pid"])
        job = _start(conn, tmp_path, runs)
        folder, job_id = Path(job["folder"]), job["job_id"]
        assert job["kind"] == "train" and job["alive"], job
        slurm_id = _job_id(folder)
        assert slurm_id in slurm.jobs()
        supervisor = Run(folder).supervisor()
        assert supervisor is not None
        heard = _Heard(job_id)
        try:
            # Followed through the agent: the nodes' console and the ranks' events, from the run folder.
            assert wait_until(lambda: heard.steps() >= 2, 150), (heard.lines[-20:], heard.records[-1:])
            assert wait_until(lambda: any("[rank 0/1]" in line for line in heard.lines), 30), \
                heard.lines[-20:]
            assert wait_until(lambda: any(r["state"] == "running" and r["step"] >= 1 for r in heard.records),
                              30), heard.records[-3:]
        finally:
            heard.close()
        listed = {j["job_id"]: j for j in conn.request("jobs.list")["jobs"]}
        assert listed[job_id]["state"] == "running" and listed[job_id]["alive"], listed
    # The agent dies; the job's supervisor (not its child) and the Slurm job go on.
    os.kill(first_agent, signal.SIGKILL)
    assert wait_gone(first_agent, 10)
    seen = steps(folder)
    assert wait_until(lambda: steps(folder) > seen, 60)
    assert supervisor.is_alive() and slurm_id in slurm.jobs()

    with Connection.open() as conn:
        assert int(conn.agent["pid"]) != first_agent
        listed = {j["job_id"]: j for j in conn.request("jobs.list")["jobs"]}
        assert listed[job_id]["state"] == "running" and listed[job_id]["alive"], listed
        assert len([p for p in os.listdir(runs) if not p.startswith(".")]) == 1  # nothing submitted twice
        heard = _Heard(job_id)
        try:
            words = conn.request("job.stop", job_id=job_id)["words"]
            assert "checkpoint" in words, words
            assert wait_until(heard.ended, 150), (heard.records[-3:], (folder / "supervisor.log").read_text())
            final = heard.ended()
        finally:
            heard.close()
        assert final is not None and final["state"] == "stopped", final
        assert conn.request("status")["busy"] == []
    saved = events(folder, "checkpoint_saved")
    assert saved, (folder / "supervisor.log").read_text()
    step = int(saved[-1]["step"])
    assert checkpoint_complete(tmp_path / "out" / f"checkpoint-{step}")
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "stopped" and f"checkpoint-{step} saved" in status["summary"], status
    assert status["exit_description"] == f"Slurm job {slurm_id}: COMPLETED", status
    # The stop went through the batch shell's trap to the rank, never to the launcher.
    assert "SIGTERM sent to rank pid" in (folder / "log.txt").read_text()
    assert _slurm_state(slurm, slurm_id) == "COMPLETED"
    assert wait_gone(supervisor.pid, 10)


@pytest.mark.usefixtures("demo_model")
def test_runs_attach_follows_an_agent_job_and_takes_over_from_a_dead_supervisor_kill_now_cancels(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    runs = str(tmp_path / "runs")
    with Connection.open() as conn:
        # The checkpoint disk is slow (sbatch passes the environment on): Slurm's SIGTERM of the cancel
        # asks the rank for a checkpoint that cannot be written before the cluster's KillWait is over.
        job = _start(conn, tmp_path, runs, env=slow_disk_env(0.05))
        folder, job_id = Path(job["folder"]), job["job_id"]
        slurm_id = _job_id(folder)
        assert wait_until(lambda: steps(folder) >= 1, 150), (folder / "supervisor.log").read_text()
        # `runs attach` of a job its supervisor follows: it follows too (a Ctrl-C there goes to the
        # supervisor).
        reader, out = _attach(folder)
        assert wait_until(lambda: any("follows it too" in line for line in out), 30), out
        assert wait_until(lambda: any("[rank 0/1]" in line for line in out), 60), out
        # The detached supervisor dies (SIGKILL: it asks nothing of the job): runs attach takes its place.
        supervisor = Run(folder).supervisor()
        assert supervisor is not None and supervisor.pid != reader.pid
        os.kill(supervisor.pid, signal.SIGKILL)
        assert wait_until(lambda: any("is gone: following job" in line for line in out), 30), out
        assert wait_until(lambda: (Run(folder).supervisor() or supervisor).pid == reader.pid, 10)
        # That one dies too: nothing follows the job, which goes on in Slurm. The agent takes over: it
        # starts `gaudi-gui runs attach` as the job's supervisor (a stop asked before then is refused
        # with the words when).
        reader.kill()
        reader.wait(timeout=30)
        assert Run(folder).supervisor() is None and slurm_id in slurm.jobs()
        try:
            conn.request("job.stop", job_id=job_id)  # refused while none follows (sent, once one does)
        except AgentError as refused:
            assert "supervisor is gone; the agent starts a new one" in str(refused), refused
        gone = (supervisor.pid, reader.pid)
        assert wait_until(lambda: (Run(folder).supervisor() or supervisor).pid not in gone, 30), \
            (folder / "supervisor.log").read_text()
        taken = Run(folder).supervisor()
        assert taken is not None
        agent_pid = int(conn.agent["pid"])
        took = psutil.Process(taken.pid)
        assert took.cmdline()[-3:] == ["runs", "attach", str(folder)] and took.ppid() == agent_pid
        assert os.getsid(taken.pid) == taken.pid  # a session of its own: it outlives the agent
        heard = _Heard(job_id)
        try:
            assert wait_until(lambda: any(r["alive"] for r in heard.records), 10), heard.records
            # Kill now through the agent reaches the new supervisor: the job is cancelled.
            assert conn.request("job.stop", job_id=job_id, now=True)["words"] == "kill requested"
            assert wait_until(heard.ended, 120), (heard.records[-3:], (folder / "supervisor.log").read_text())
            final = heard.ended()
        finally:
            heard.close()
        assert final is not None and final["state"] == "killed", final
        assert wait_gone(taken.pid, 30)
        assert wait_until(lambda: not psutil.pid_exists(taken.pid), 10)  # reaped by the agent: no zombie
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "killed" and "killed on request" in status["summary"], status
    assert not events(folder, "checkpoint_saved")
    assert wait_until(lambda: _slurm_state(slurm, slurm_id) == "CANCELLED", 30), _slurm_state(slurm, slurm_id)


@pytest.mark.usefixtures("demo_model")
def test_detach_announces_the_submitted_job_and_refuses_in_one_line(slurm: SlurmCluster,
                                                                    tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    job = job_file(tmp_path, tmp_path / "out", max_steps=3)
    base = [sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), "--slurm", "--device", "cpu",
            "--runs-dir", str(runs), "--detach", "--json"]
    # A bad option: exit 2, one line, nothing made, nothing submitted.
    bad = subprocess.run([*base, "--partition", PARTITION, "--time", "soon"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert bad.returncode == 2 and bad.stdout == "", bad
    assert "not a Slurm time limit" in bad.stderr and bad.stderr.strip().count("\n") == 0, bad.stderr
    # sbatch refuses the job (no such partition): exit 1, one line, no job followed.
    refused = subprocess.run([*base, "--partition", "gg-nowhere"], capture_output=True, text=True,
                             timeout=120, check=False)
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert "sbatch refused the job" in refused.stderr, refused.stderr
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "Traceback" not in bad.stderr + refused.stderr and slurm.jobs() == []
    # Through the agent: the same refusals are the reply's error.
    config = JobConfig.load(job).to_dict()
    with Connection.open() as conn:
        with pytest.raises(AgentError, match="not a Slurm time limit"):
            conn.request("job.start", kind="train", runs_dir=str(runs),
                         job={"args": [*SLURM_WORDS, "--time", "soon"], "config": config})
        with pytest.raises(AgentError, match="--events is the agent's"):
            conn.request("job.start", kind="train",
                         job={"args": [*SLURM_WORDS, "--events"], "config": config})
        assert conn.request("jobs.list")["jobs"] == []
    # A good one: the JSON line once sbatch took the job; it runs to its end without anyone following.
    started = time.monotonic()
    done = subprocess.run([*base, "--partition", PARTITION, "--time", "10"], capture_output=True, text=True,
                          timeout=150, check=False)
    assert done.returncode == 0, done
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(info) >= {"folder", "pid", "name", "job_id", "login", "device"}, info
    folder = Path(info["folder"])
    assert info["job_id"] == _job_id(folder) and info["login"] == "local"
    supervisor = Run(folder).supervisor()
    assert supervisor is not None and supervisor.pid == info["pid"]
    assert os.getsid(info["pid"]) == info["pid"]  # a session of its own
    assert wait_until(lambda: json.loads((folder / "status.json").read_text())["state"] == "finished", 150), \
        (folder / "supervisor.log").read_text()
    status = json.loads((folder / "status.json").read_text())
    assert status["step"] == 3 and status["exit_description"] == f"Slurm job {info['job_id']}: COMPLETED"
    assert wait_gone(info["pid"], 20), time.monotonic() - started
    assert "submitted batch job" in (folder / "supervisor.log").read_text()


@pytest.mark.usefixtures("demo_model")
def test_detached_on_a_login_host_over_ssh(slurm: SlurmCluster, ssh_host: SshHost, tmp_path: Path) -> None:
    """--detach --login: the background supervisor runs sbatch and follows the job on the login host
    (a real SSH server on 127.0.0.1 in front of the same cluster); one that cannot reach it says so in
    one line, nothing submitted."""
    job = job_file(tmp_path, tmp_path / "out", max_steps=3)
    base = [sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), "--slurm", "--device", "cpu",
            "--partition", PARTITION, "--time", "10", "--runs-dir", str(tmp_path / "runs"), "--detach",
            "--json"]
    # First: once a connection to the server is open, ssh multiplexes any alias of it over that one.
    bad = subprocess.run([*base, "--login", "gg-nokey"], capture_output=True, text=True, timeout=150,
                         check=False)
    assert bad.returncode == 1 and bad.stdout == "", bad
    assert "the login host gg-nokey could not be reached" in bad.stderr, bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and slurm.jobs() == [], bad.stderr
    done = subprocess.run([*base, "--login", ssh_host.dest], capture_output=True, text=True, timeout=150,
                          check=False)
    assert done.returncode == 0, done
    info = json.loads(done.stdout.strip().splitlines()[-1])
    folder = Path(info["folder"])
    assert info["login"] == ssh_host.dest and info["job_id"] == _job_id(folder), info
    assert wait_until(lambda: json.loads((folder / "status.json").read_text())["state"] == "finished", 150), \
        (folder / "supervisor.log").read_text()
    said = (folder / "supervisor.log").read_text()
    assert f"submitted batch job {info['job_id']} on {ssh_host.dest}" in said, said
    assert wait_gone(info["pid"], 20)
    assert _slurm_state(slurm, info["job_id"]) == "COMPLETED"
    assert ssh_host.wait_no_processes(20) == []
