"""``gaudi-gui train --slurm`` against a real one-node Slurm cluster (slurmctld, slurmd, munge): a job
submitted with sbatch runs to the end; a long one whose submitting terminal was killed is followed again
with ``runs attach``, and stopped with Ctrl-C there ends "stopped" with a complete
checkpoint (the batch shell's trap asks the ranks to save, not the launcher), and resuming submits a new
job that continues from it. Nothing is left running: the leftover guard of tests/conftest.py checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gaudi_gui.core.runstore import checkpoint_complete
from tests.helpers import children_get_sigint, events, job_file, steps, wait_until
from tests.remote.conftest import SshHost
from tests.slurm_cluster import PARTITION, SlurmCluster

# One cluster per session: under xdist every Slurm test goes to the same worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


class Cli:
    """A ``gaudi-gui`` command, its output collected as it comes."""

    def __init__(self, *args: str) -> None:
        with children_get_sigint():  # its Ctrl-C (SIGINT) is the stop
            self.proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", *args], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=lambda s=stream, k=sink: k.extend(iter(s.readline, "")),
                             daemon=True).start()

    @classmethod
    def train(cls, job: Path, *extra: str) -> Cli:
        """``gaudi-gui train --slurm``: the job submitted to the test partition and followed."""
        return cls("train", "--config", str(job), "--slurm", "--device", "cpu", "--partition", PARTITION,
                   "--time", "10", *extra)

    @classmethod
    def attach(cls, run: Path) -> Cli:
        """``gaudi-gui runs attach RUN``: the job of a run followed again."""
        return cls("runs", "attach", str(run))

    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def folder(self) -> Path | None:
        for line in list(self.out):
            if line.startswith("run folder: "):
                return Path(line[len("run folder: "):].split(" (", 1)[0])
        return None

    def job_id(self) -> str:
        for line in list(self.out):
            if line.startswith("submitted batch job "):
                return line.split()[3]
        return ""


def _slurm_state(slurm: SlurmCluster, job_id: str) -> str:
    done = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True,
                          env=slurm.env(), check=False, timeout=20)
    return done.stdout.split("JobState=", 1)[1].split()[0] if "JobState=" in done.stdout else done.stderr


def test_print_script_shows_the_job_and_submits_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = job_file(tmp_path, tmp_path / "out")
    train = [sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), "--slurm", "--device", "cpu"]
    asked = ["--nodes", "2", "--partition", PARTITION, "--account", "ml", "--time", "1:00:00",
             "--print-script"]
    done = subprocess.run([*train, *asked], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    script = done.stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=gg",
                 "#SBATCH --account=ml", "#SBATCH --time=1:00:00", '--machine_rank "$SLURM_NODEID"'):
        assert line in script, script
    assert slurm.jobs() == []
    bad = subprocess.run([*train, "--time", "soon"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "not a Slurm time limit" in bad.stderr, bad.stderr


@pytest.mark.usefixtures("demo_model")
def test_a_submitted_job_runs_to_the_end(slurm: SlurmCluster, tmp_path: Path) -> None:
    cli = Cli.train(job_file(tmp_path, tmp_path / "out", max_steps=3))
    assert cli.proc.wait(timeout=180) == 0, cli.text()
    run = cli.folder()
    assert run is not None and cli.job_id(), cli.text()
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 3, status
    assert _slurm_state(slurm, cli.job_id()) == "COMPLETED"
    assert "#SBATCH --partition=gg" in (run / "slurm.sh").read_text()
    assert json.loads((run / "slurm.json").read_text())["job_id"] == cli.job_id()
    # The console of the node's task came back through the shared folder's log.
    assert f"job {cli.job_id()}: running on {slurm.node}" in cli.text()
    assert "[rank 0/1] done" in cli.text() and "[rank 0/1] done" in (run / "log.txt").read_text()
    assert (tmp_path / "out" / "final").is_dir()


@pytest.mark.usefixtures("demo_model")
def test_submitted_and_followed_on_a_login_host_over_ssh(slurm: SlurmCluster, ssh_host: SshHost,
                                                         tmp_path: Path) -> None:
    """--login: sbatch, squeue, scontrol and sacct run on the login host through the system ssh
    client (here a real SSH server on 127.0.0.1 in front of the same cluster), the folder is shared."""
    # A login host that refuses us is a clear error, nothing submitted. (First: once a connection to
    # the server is open, ssh multiplexes any alias of the same user@host:port over it.)
    bad = Cli.train(job_file(tmp_path, tmp_path / "out", max_steps=3), "--login", "gg-nokey")
    assert bad.proc.wait(timeout=120) == 1, bad.text()
    assert "the login host gg-nokey could not be reached" in bad.text(), bad.text()
    assert "Traceback" not in bad.text() and slurm.jobs() == []

    cli = Cli.train(job_file(tmp_path, tmp_path / "out", max_steps=3), "--login", ssh_host.dest)
    assert cli.proc.wait(timeout=180) == 0, cli.text()
    run = cli.folder()
    assert run is not None and cli.job_id(), cli.text()
    assert f"submitted batch job {cli.job_id()} on {ssh_host.dest}" in cli.text()
    assert f"job {cli.job_id()}: running on {slurm.node}" in cli.text()
    info = json.loads((run / "slurm.json").read_text())
    assert info["login"] == ssh_host.dest and info["options"]["partition"] == PARTITION
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    assert _slurm_state(slurm, cli.job_id()) == "COMPLETED"
    assert ssh_host.wait_no_processes(20) == []


@pytest.mark.usefixtures("demo_model")
def test_ctrl_c_stops_the_job_with_a_checkpoint_and_resume_submits_a_new_job(slurm: SlurmCluster,
                                                                              tmp_path: Path) -> None:
    submitter = Cli.train(job_file(tmp_path, tmp_path / "out"))
    assert wait_until(lambda: submitter.folder() is not None, 60), submitter.text()
    run = submitter.folder()
    assert run is not None
    assert wait_until(lambda: steps(run) >= 2, 120), submitter.text()
    # The terminal that submitted it is gone (SIGKILL: nothing is asked of the job), the job goes on;
    # `runs attach` follows it again from its folder, and its Ctrl-C is the stop.
    submitter.proc.kill()
    submitter.proc.wait(timeout=30)
    assert submitter.job_id() in slurm.jobs()
    cli = Cli.attach(run)
    assert wait_until(lambda: cli.job_id() == submitter.job_id(), 30), cli.text()
    assert wait_until(lambda: f"job {cli.job_id()}: running on {slurm.node}" in cli.text(), 30), cli.text()
    seen = steps(run)
    assert wait_until(lambda: steps(run) > seen and "[rank 0/1]" in cli.text(), 60), cli.text()
    cli.proc.send_signal(signal.SIGINT)
    assert cli.proc.wait(timeout=90) == 0, cli.text()
    saved = events(run, "checkpoint_saved")
    assert saved, cli.text()
    step = int(saved[-1]["step"])
    checkpoint = tmp_path / "out" / f"checkpoint-{step}"
    assert checkpoint_complete(checkpoint), list(checkpoint.iterdir()) if checkpoint.exists() else cli.text()
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and f"checkpoint-{step} saved" in status["summary"], status
    # The stop went through the batch shell's trap to the rank, never to the launcher.
    log = (run / "log.txt").read_text()
    assert "SIGTERM sent to rank pid" in log, log[-3000:]
    assert _slurm_state(slurm, cli.job_id()) == "COMPLETED"

    resume = Cli.train(job_file(tmp_path, tmp_path / "out", resume=str(checkpoint), max_steps=step + 2),
                       "--resumed-from", str(run))
    assert resume.proc.wait(timeout=150) == 0, resume.text()
    assert resume.job_id() and resume.job_id() != cli.job_id()
    again = resume.folder()
    assert again is not None
    metrics = events(again, "metrics")
    assert min(int(e["step"]) for e in metrics) == step + 1 and steps(again) == step + 2, metrics
    status = json.loads((again / "status.json").read_text())
    assert status["state"] == "finished" and status["resumed_from"] == str(run), status
