"""Remote runner: the generate worker on a host over SSH against the same worker here.

The "host" is this machine behind a real SSH server on 127.0.0.1 (tests/sshd.py, as the remote tests'
fixture runs it: a throwaway key, the system OpenSSH client with BatchMode and multiplexing through
``GAUDI_GUI_SSH_CONFIG``). The remote worker is started exactly as the Model runner tab starts it (the
host's agent's ``generate`` child, through this machine's agent and its one ssh session to the host's
agent) and spoken to over the same JSON lines. Both workers load the demo model;
greedy answers of a fixed length alternate remote, local, remote, local … (bench/harness.py), giving
decode tokens/s as a ratio remote/local and the time to first token the connection adds.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_runner import Worker  # noqa: E402
from bench.harness import environ, interleaved_metrics, row  # noqa: E402
from gaudi_gui.core.remote import ssh_base  # noqa: E402

SSHD = ROOT / "tests" / "sshd.py"
ALIAS = "gg-bench"


@contextlib.contextmanager
def ssh_server(base: Path, extra_aliases: tuple[str, ...] = ()) -> Iterator[str]:
    """A throwaway SSH server on 127.0.0.1 and a client config naming it (also as ``extra_aliases``);
    yields the host alias."""
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        raise RuntimeError("the remote bench needs the OpenSSH client (ssh, ssh-keygen)")
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in ("client_key", "host_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / name)], check=True,
                       capture_output=True)
    env = dict(os.environ)
    # python3 on the "host" is this interpreter, so `python3 -m gaudi_gui` finds this checkout.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("GAUDI_GUI_SSH_CONFIG", None)
    port_file = base / "port"
    server = subprocess.Popen([sys.executable, str(SSHD), "--host-key", str(base / "host_key"),
                               "--authorized-keys", str(base / "client_key.pub"), "--port-file",
                               str(port_file)], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    control = Path(tempfile.mkdtemp(prefix="ggb-"))  # short: a socket path has ~104 bytes
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the bench SSH server did not start")
            time.sleep(0.05)
        port = int(port_file.read_text())
        kind, key = (base / "host_key.pub").read_text().split()[:2]
        (base / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
        (base / "config").write_text(
            f"Host {' '.join((ALIAS, *extra_aliases))}\n  HostName 127.0.0.1\n  Port {port}\n"
            f"  User {getpass.getuser()}\n"
            f"  IdentityFile {base / 'client_key'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {base / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
            f"  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
        # A state folder of its own: the agent the bench starts reads this ssh config (one already
        # running for the user would not know the alias).
        with environ(GAUDI_GUI_SSH_CONFIG=str(base / "config"), GAUDI_GUI_SSH_CONTROL_DIR=str(control),
                     GAUDI_GUI_HOME=str(base / "home")):
            yield ALIAS
    finally:
        # The multiplexing master is ours; then the server and its session group.
        subprocess.run([*ssh_base(ALIAS, config=str(base / "config"), control_dir=control), "-O", "exit",
                        "--", ALIAS], capture_output=True, check=False)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(control, ignore_errors=True)


class RemoteWorker(Worker):
    """The same protocol client as bench_runner.Worker, on the worker the runner tab starts on a host:
    the host's agent's ``generate`` child, reached through this machine's agent (its one ssh session to
    the host's agent), spoken to with ``child.send`` and heard as ``output`` events."""

    def __init__(self, host_name: str) -> None:
        from gaudi_gui.core.agentwire import Connection
        self.host = host_name
        self.conn = Connection.open(client="bench")
        self.child_id = str(self.conn.request("child.start", timeout=120, kind="generate", args={},
                                              host=host_name)["child_id"])
        self.conn.request("subscribe", events=["output"], key=self.child_id, host=host_name)
        self._pending: list[dict[str, Any]] = []

    def send(self, line: str) -> None:
        self.conn.request("child.send", child_id=self.child_id, message=line, host=self.host)

    def next_event(self) -> dict[str, Any]:
        while not self._pending:
            for event in self.conn.stream(timeout=120):
                if event.get("child_id") != self.child_id:
                    continue
                if "end" in event:
                    raise RuntimeError(f"worker ended: {event['end']}")
                self._pending += [m for m in event.get("messages") or [] if "type" in m]
                if self._pending:
                    break
            else:
                raise RuntimeError("the agent went quiet")
        return self._pending.pop(0)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.request("child.stop", child_id=self.child_id, grace_s=5, host=self.host)
        with contextlib.suppress(Exception):
            self.conn.request("shutdown")  # the bench's own agent (its state folder is the bench's)
        self.conn.close()


def run(quick: bool = False) -> list[dict]:
    n, reps = (64, 3) if quick else (128, 7)
    with tempfile.TemporaryDirectory() as tmp:
        demo = Path(tmp) / "demo"
        subprocess.run([sys.executable, "-m", "gaudi_gui.workers.demo", str(demo), "--steps", "50"],
                       check=True, capture_output=True)
        with ssh_server(Path(tmp) / "ssh") as alias:
            far = RemoteWorker(alias)
            near = Worker()
            try:
                far.load(str(demo))
                near.load(str(demo))

                def once(worker: Worker) -> dict[str, float]:
                    ttft, stats = worker.generate(n)
                    return {"ttft_s": ttft, "decode_tokens_per_s": stats["decode_tokens_per_s"]}

                # Remote and local alternate (a warm-up pair first), so drift hits both alike.
                result = interleaved_metrics(lambda: once(far), lambda: once(near), reps, warmup=1)
            finally:
                far.close()
                near.close()
    tps, ttft = result["decode_tokens_per_s"], result["ttft_s"]
    added = [(s["app"] - s["base"]) * 1000 for s in ttft["samples"]]
    return [
        row("remote: decode tokens/s (worker over ssh vs local worker)", tps, unit="tok/s",
            goal="ratio >= 0.95"),
        {"name": "remote: added time to first token (ssh to 127.0.0.1)", "value": statistics.median(added),
         "unit": "ms", "baseline": round(ttft["base_median"] * 1000, 3), "ratio": None,
         "spread": [round(min(added), 2), round(max(added), 2)], "repeats": len(added), "goal": "< 20 ms"},
    ]


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
