"""A real SSH server on 127.0.0.1 (tests/sshd.py), a throwaway key, and the system OpenSSH client
configured the way a user's ~/.ssh/config would be: the "remote" host is this machine, with the fake
hl-smi on its PATH and a data folder of its own (GAUDI_GUI_HOME), reached as ``gg-remote``.

Everything the server starts carries a marker in its environment, so a test can ask what is still
running "on the host" after the client side was killed.

``@pytest.mark.sshd(max_sessions=N)`` gives the server OpenSSH's ``MaxSessions N`` (no limit
otherwise); ``SshHost.sessions()`` says how many sessions are open and the most that ever were."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

SSHD = Path(__file__).resolve().parents[1] / "sshd.py"
FAKE = Path(__file__).resolve().parents[1] / "fake_hl_smi.py"
MARKER = "GAUDI_GUI_REMOTE_MARKER"
ALIAS = "gg-remote"


@dataclass
class SshHost:
    dest: str
    home: Path  #: the host's GAUDI_GUI_HOME
    config: Path
    control_dir: Path
    server: subprocess.Popen
    marker: str
    port: int
    #: the server's session counts (tests/sshd.py --sessions-file)
    sessions_file: Path

    def sessions(self) -> tuple[int, int]:
        """(sessions open now, the most ever open at once) over all the server's connections."""
        counts = json.loads(self.sessions_file.read_text())
        return int(counts["open"]), int(counts["peak"])

    @property
    def runs_dir(self) -> Path:
        return self.home / "data" / "runs"

    def drop(self) -> None:
        """Cut every connection, as a network failure does (the host's processes keep running)."""
        self.server.send_signal(signal.SIGUSR1)

    def processes(self) -> list[psutil.Process]:
        """What is running on the "host" that the server started (zombies excluded)."""
        out = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.pid != self.server.pid and proc.status() != psutil.STATUS_ZOMBIE \
                        and proc.environ().get(MARKER) == self.marker:
                    out.append(proc)
        return out

    def command_lines(self) -> list[str]:
        """The command lines of ``processes()``, each joined; a process that ends while it is read is
        left out (a full run read the list, then a helper of a cut connection ended before its
        command line was read: ProcessLookupError in the test, not in the product)."""
        lines = []
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                lines.append(" ".join(proc.cmdline()))
        return lines

    def window_children(self) -> list[str]:
        """What this (the window's, the test's) process started since this server and still runs (see
        ``_children_now``). A process caught between its fork and its exec, or as it ends (no command
        line yet or any more), is judged again half a second later: what counts is there both times."""
        first = self._children_now()
        if not first:
            return []
        time.sleep(0.5)  # a second look with a fixed pause, not a wait for a condition
        return [child for child in self._children_now() if child in first]

    def _children_now(self) -> list[str]:
        """What this (the window's, the test's) process started since this server and still runs, the
        server and its sessions (the "host") aside: "pid command line" each. Only since the server: an
        xdist worker runs many tests, and what an earlier one started (a session's Slurm cluster) is not
        this test's to judge."""
        server = psutil.Process(self.server.pid)
        since = server.create_time()
        host_side = {server.pid} | {p.pid for p in server.children(recursive=True)}
        # The agent's starter (``agentwire.spawn(wait=False)``: ``agent --daemon``, which forks the
        # agent and ends) is the one process the window makes, on purpose; it is reaped, not waited for.
        from gaudi_gui.core import agentwire
        starters = {proc.pid for proc in agentwire._STARTED}
        out = []
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.pid not in host_side | starters and proc.status() != psutil.STATUS_ZOMBIE \
                        and proc.create_time() >= since:
                    out.append(f"{proc.pid} {' '.join(proc.cmdline())}")
        return out

    def wait_no_processes(self, timeout: float = 20.0, *, but_agent: bool = False) -> list[str]:
        """What still runs on the host after ``timeout`` (empty: nothing). ``but_agent``: the host's
        agent and the relay of the workstation's link to it are meant to stay (they are left out)."""
        deadline = time.monotonic() + timeout

        def left_now() -> list[psutil.Process]:
            out = []
            for proc in self.processes():
                with contextlib.suppress(psutil.Error):
                    line = " ".join(proc.cmdline())
                    if not (but_agent and (" agent --daemon" in line or " agent --stdio" in line)):
                        out.append(proc)
            return out

        left = left_now()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = left_now()
        return [_described(p) for p in left if p.is_running()]


def _described(proc: psutil.Process) -> str:
    """A process left running, with its parent (who started it is the first question)."""
    with contextlib.suppress(psutil.Error):
        line = " ".join(proc.cmdline())[:160]
        parent = proc.parent()
        return line + (f"  <- parent {parent.pid}: {' '.join(parent.cmdline())[:100]}" if parent else "")
    return f"pid {proc.pid} (ended while it was read)"


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                   capture_output=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sshd(max_sessions=N): the test SSH server's MaxSessions")


@pytest.fixture
def ssh_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             request: pytest.FixtureRequest) -> Iterator[SshHost]:
    if shutil.which("ssh") is None:
        pytest.fail("the remote-host tests need the OpenSSH client (Debian: apt-get install openssh-client)")
    base = tmp_path / "ssh"
    base.mkdir(mode=0o700)
    _keygen(base / "client_key")
    _keygen(base / "host_key")
    _keygen(base / "other_key")  # a key the server does not accept
    marker = uuid.uuid4().hex
    home = tmp_path / "remote-home"
    home.mkdir()
    fake_bin = tmp_path / "remote-bin"
    fake_bin.mkdir()
    program = fake_bin / "hl-smi"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    program.chmod(0o755)
    env = dict(os.environ)
    # An idle server: the recorded HL-225 summary (its Compute Processes all N/A; the HL-205 table's
    # pids 10 and 20 would make the doctor's busy check see cards 0 and 6 held on every test host).
    env.update({"GAUDI_GUI_HOME": str(home), MARKER: marker, "FAKE_HLSMI_PERIOD": "0.1",
                "FAKE_HLSMI_TABLE": str(FAKE.parent / "data" / "hlsmi" / "table-hl225-1.12.1.txt"),
                "PATH": os.pathsep.join([str(fake_bin), str(Path(sys.executable).parent), env["PATH"]])})
    env.pop("GAUDI_GUI_SSH_CONFIG", None)
    port_file = base / "port"
    sessions_file = base / "sessions.json"
    mark = request.node.get_closest_marker("sshd")
    max_sessions = int(mark.kwargs.get("max_sessions", 0)) if mark is not None else 0
    server = subprocess.Popen([sys.executable, str(SSHD), "--host-key", str(base / "host_key"),
                               "--authorized-keys", str(base / "client_key.pub"), "--port-file",
                               str(port_file), "--cwd", str(home), "--max-sessions", str(max_sessions),
                               "--sessions-file", str(sessions_file)], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            err = server.stderr.read().decode(errors="replace") if server.stderr else ""
            pytest.fail(f"the test SSH server did not start: {err[-2000:]}")
        time.sleep(0.05)
    port = int(port_file.read_text())
    host_pub = (base / "host_key.pub").read_text().split()
    (base / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    common = (f"  HostName 127.0.0.1\n  Port {port}\n  User {getpass.getuser()}\n"
              f"  IdentitiesOnly yes\n  UserKnownHostsFile {base / 'known_hosts'}\n"
              f"  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
    config = base / "config"
    config.write_text(f"Host {ALIAS} {ALIAS}-b\n  IdentityFile {base / 'client_key'}\n{common}\n"
                      f"Host gg-nokey\n  IdentityFile {base / 'other_key'}\n{common}\n"
                      f"Host gg-unknown-key\n  IdentityFile {base / 'client_key'}\n"
                      f"{common.replace(str(base / 'known_hosts'), '/dev/null')}\n"
                      f"Host gg-*\n  ConnectTimeout 5\n")
    control = Path(tempfile.mkdtemp(prefix="ggs-"))  # short: a socket path has ~104 bytes
    monkeypatch.setenv("GAUDI_GUI_SSH_CONFIG", str(config))
    monkeypatch.setenv("GAUDI_GUI_SSH_CONTROL_DIR", str(control))
    host = SshHost(ALIAS, home, config, control, server, marker, port, sessions_file)
    try:
        yield host
    finally:
        # ssh's multiplexing masters (ControlPersist) are ours: end them, then the server and what
        # it started (a test that checks for leftovers has done so already).
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.name() == "ssh" and any(str(control) in a for a in proc.cmdline()):
                    proc.kill()
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)
        if server.poll() is None:
            server.kill()
        for proc in host.processes():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        shutil.rmtree(control, ignore_errors=True)
