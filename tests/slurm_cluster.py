"""A real one-node Slurm cluster for tests, from Debian's slurm-wlm and munge, started as root.

Everything lives in one private temporary folder: slurm.conf (this machine as the only node, with the
CPUs and memory it has; proctrack/linuxproc, task/none and no cgroup, so it runs in a container),
state and spool folders, a fresh munge key and munge's socket. munged, slurmctld and slurmd run in
the foreground as children of the test process (``-F`` / ``-D``), on free ports, so nothing of a
machine's own Slurm or munge is touched and teardown ends exactly what was started.

``SlurmCluster.start()`` raises ``ClusterError`` saying what could not start (not root, a program
missing, a daemon that exited, the node never idle) with the daemon's log tail: the fixture turns it
into a test failure, never a skip. Client commands need ``cluster.env()`` (SLURM_CONF).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import psutil

PROGRAMS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ("sbatch", "squeue", "sinfo", "scancel", "scontrol", "srun")
PARTITION = "gg"


class ClusterError(RuntimeError):
    """The cluster could not be started; the message says why."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, count: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-count:])
    except OSError:
        return "(no log)"


def _memory_mb() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return max(256, int(line.split()[1]) // 1024 - 512)
    return 1024


class SlurmCluster:
    #: The clusters started in this process and not stopped yet (a session's one, as a rule).
    started: ClassVar[list[SlurmCluster]] = []

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="gg-slurm-"))
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    # -- environment ------------------------------------------------------------------------------

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for the client commands (sbatch, squeue, …) of this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def _daemon_env(self) -> dict[str, str]:
        # The daemons must not carry a test's GAUDI_GUI_HOME (the leftover-process guard looks for it).
        keep = ("PATH", "LANG", "LC_ALL", "HOME", "USER", "LOGNAME")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env["SLURM_CONF"] = str(self.conf)
        return env

    # -- start ------------------------------------------------------------------------------------

    def check(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError(f"the Slurm test cluster runs its daemons as root; this is uid {os.geteuid()} "
                               f"(CI runs as root)")
        missing = [p for p in PROGRAMS.values() if not os.access(p, os.X_OK)]
        missing += [c for c in CLIENTS if shutil.which(c) is None]
        if missing:
            raise ClusterError(f"Slurm or munge is not installed: {', '.join(missing)} missing "
                               f"(scripts/bootstrap.sh installs slurm-wlm and munge as root: "
                               f"apt-get install slurm-wlm munge)")

    def write_config(self) -> None:
        for sub in ("state", "spool", "munge", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        cpus = os.cpu_count() or 1
        r = self.root
        lines = [
            "ClusterName=gaudi-gui-test",
            f"SlurmctldHost={self.node}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            f"PlugStackConfig={r / 'plugstack.conf'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            # Ended jobs stay visible to squeue/scontrol for a while (there is no accounting database).
            "MinJobAge=600",
            "KillWait=10",
            "InactiveLimit=0",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"NodeName={self.node} CPUs={cpus} RealMemory={_memory_mb()} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        (r / "plugstack.conf").write_text("")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.root / "log" / f"{name}.out"
        self.logs[name] = log
        with open(log, "wb") as out:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT, env=self._daemon_env(),
                                                start_new_session=True)

    def _alive_or_raise(self, name: str, extra_log: Path | None = None) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise ClusterError(f"{name} exited with code {proc.returncode}:\n{_tail(self.logs[name])}"
                               + (f"\n{_tail(extra_log)}" if extra_log else ""))

    def _wait(self, what: str, condition: object, timeout: float, names: tuple[str, ...]) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in names:
                self._alive_or_raise(name, self.root / "log" / f"{name}.log")
            if callable(condition) and condition():
                return
            time.sleep(0.2)
        logs = "\n".join(f"--- {n}:\n{_tail(self.root / 'log' / f'{n}.log')}\n{_tail(self.logs[n])}"
                         for n in names)
        raise ClusterError(f"{what} within {timeout:g} s\n{logs}")

    def start(self, timeout: float = 60.0) -> None:
        self.check()
        self.write_config()
        SlurmCluster.started.append(self)
        m = self.root / "munge"
        self._spawn("munged", [PROGRAMS["munged"], "-F", "--force", f"--socket={self.socket}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}", f"--seed-file={m / 'seed'}"])
        self._wait("munged did not open its socket", self.socket.exists, 20, ("munged",))
        self._spawn("slurmctld", [PROGRAMS["slurmctld"], "-D", "-i", "-f", str(self.conf)])
        self._wait("slurmctld did not answer", lambda: self._run(["scontrol", "ping"]).returncode == 0,
                   timeout, ("munged", "slurmctld"))
        self._spawn("slurmd", [PROGRAMS["slurmd"], "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(f"node {self.node} did not become idle", self.node_idle, timeout,
                   ("munged", "slurmctld", "slurmd"))

    def _run(self, argv: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, capture_output=True, text=True, env=self.env(), timeout=timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(argv, 1, "", str(exc))

    def node_idle(self) -> bool:
        done = self._run(["sinfo", "-h", "-N", "-n", self.node, "-o", "%T"])
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def daemon_pids(self) -> set[int]:
        """The daemons and the controller's helpers (slurmscriptd): children of the test process by
        design, not what a test left running (a job's processes are slurmd's, never listed here)."""
        pids = {proc.pid for proc in self.procs.values() if proc.poll() is None}
        controller = self.procs.get("slurmctld")
        if controller is not None and controller.poll() is None:
            with contextlib.suppress(psutil.Error):
                pids |= {c.pid for c in psutil.Process(controller.pid).children(recursive=True)}
        return pids

    def jobs(self) -> list[str]:
        """Ids of jobs not yet ended."""
        done = self._run(["squeue", "-h", "-o", "%i"])
        return done.stdout.split() if done.returncode == 0 else []

    # -- stop -------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel what still runs, then end the daemons (slurmd, slurmctld, munged) and remove the folder."""
        controller = self.procs.get("slurmctld")
        if controller is not None and controller.poll() is None and self.jobs():
            self._run(["scancel", "--full", "--signal=KILL", "--user=root"])
            deadline = time.monotonic() + 30
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(ValueError):
            SlurmCluster.started.remove(self)


__all__ = ["PARTITION", "ClusterError", "SlurmCluster"]
