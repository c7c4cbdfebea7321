"""Faults of the model runner's worker and ``gaudi-gui generate``, injected for real: real processes,
real signals, real pipes. After each test no process of it may be left running (every child carries a
tag in its environment, and the test looks for that tag among all processes).

| fault                                         | outcome checked here                                   |
|-----------------------------------------------|--------------------------------------------------------|
| worker writes > 64 KB to stderr               | CLI streams and exits 0 (both pipes read concurrently) |
| CLI killed with SIGKILL mid-answer            | the worker is gone within seconds                      |
| 100k '[' (and bad UTF-8) on the worker stdin  | one protocol error event; the worker keeps serving     |
| SIGINT to the worker mid-answer               | exit 130, no traceback, no SIGABRT                     |
| Ctrl+C (SIGINT to the group) on the CLI       | exit 130, worker gone, no traceback                    |
| ``gaudi-gui generate ... | head -c 10``       | 10 bytes, quiet end, worker gone                       |
| a real torch allocation failure               | classed out_of_memory                                  |
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from gaudi_gui.core import generation, protocol
from gaudi_gui.core.generation import GenerationParams, LoadOptions
from tests.helpers import children_get_sigint, processes_with_env, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("demo_model")]

TAG = "GAUDI_GUI_FAULT_TAG"


@pytest.fixture(autouse=True)
def tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A tag every child of this test inherits; afterwards none of them may be running."""
    value = uuid.uuid4().hex
    monkeypatch.setenv(TAG, value)
    yield value
    if not wait_until(lambda: not processes_with_env(TAG, value), 15):
        left = [(p.pid, p.cmdline()) for p in processes_with_env(TAG, value)]
        for proc in processes_with_env(TAG, value):
            proc.kill()
        pytest.fail(f"processes left running: {left}")


def _cli(*args: str, **popen: Any) -> subprocess.Popen[bytes]:
    with children_get_sigint():  # Ctrl-C (SIGINT) as from a terminal
        return subprocess.Popen([sys.executable, "-m", "gaudi_gui", "generate", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


class _Reader:
    """Drains a pipe in a thread (so the child never blocks on it) and keeps what came."""

    def __init__(self, stream: Any) -> None:
        self.data = bytearray()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            self.data += chunk

    def join(self) -> bytes:
        self._thread.join(10)
        return bytes(self.data)


def _worker_of(cli: subprocess.Popen[bytes]) -> psutil.Process:
    def find() -> psutil.Process | None:
        with_worker = [c for c in psutil.Process(cli.pid).children(recursive=True)
                       if "gaudi_gui.workers.generate" in " ".join(c.cmdline())]
        return with_worker[0] if with_worker else None
    worker = wait_until(find, 30)
    assert worker is not None, "the CLI started no worker in 30 s"
    return worker


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- the CLI --------------------------------------------------------------------------------------------


def test_chatty_worker_stderr_does_not_deadlock_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    # PYTHONVERBOSE makes the real worker log every import of torch and transformers to stderr:
    # hundreds of KB, where a 64 KB pipe read only after exit blocked both processes for ever.
    monkeypatch.setenv("PYTHONVERBOSE", "1")
    cli = _cli("--prompt", "The learning rate", "--max-new-tokens", "8", "--verbose")
    out, err = _Reader(cli.stdout), _Reader(cli.stderr)
    assert cli.wait(timeout=240) == 0, err.join()[-2000:]
    assert out.join().strip()
    assert len(err.join()) > 256 * 1024


def test_sigkill_of_the_cli_ends_its_worker() -> None:
    cli = _cli("--prompt", "The learning rate", "--max-new-tokens", "100000")
    out, err = _Reader(cli.stdout), _Reader(cli.stderr)
    worker = _worker_of(cli)
    assert wait_until(lambda: len(out.data) > 10, 120), "no answer streamed in 120 s"
    cli.kill()
    cli.wait(10)
    assert wait_until(lambda: _gone(worker), 10), "the orphaned worker did not end in 10 s"
    out.join(), err.join()


def test_ctrl_c_on_the_cli_exits_130_quietly() -> None:
    # As a terminal does it: SIGINT to the whole foreground process group (CLI and worker).
    cli = _cli("--prompt", "The learning rate", "--max-new-tokens", "100000", start_new_session=True)
    out, err = _Reader(cli.stdout), _Reader(cli.stderr)
    worker = _worker_of(cli)
    assert wait_until(lambda: len(out.data) > 10, 120), "no answer streamed in 120 s"
    os.killpg(cli.pid, signal.SIGINT)
    assert cli.wait(timeout=20) == 130
    stderr = err.join().decode(errors="replace")
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert wait_until(lambda: _gone(worker), 10), "the worker did not end in 10 s"
    out.join()


def test_sigint_to_the_cli_alone_ends_its_worker() -> None:
    cli = _cli("--prompt", "The learning rate", "--max-new-tokens", "100000")
    out, err = _Reader(cli.stdout), _Reader(cli.stderr)
    worker = _worker_of(cli)
    assert wait_until(lambda: len(out.data) > 10, 120), "no answer streamed in 120 s"
    cli.send_signal(signal.SIGINT)
    assert cli.wait(timeout=20) == 130
    assert "Traceback" not in err.join().decode(errors="replace")
    assert wait_until(lambda: _gone(worker), 10), "the worker did not end in 10 s"
    out.join()


def test_pipe_into_head_ends_quietly() -> None:
    shell = (f"{sys.executable} -m gaudi_gui generate --prompt 'The learning rate' "
             "--max-new-tokens 100000 | head -c 10")
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, timeout=180)
    stderr = proc.stderr.decode(errors="replace")
    assert len(proc.stdout) == 10
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr
    # The pipeline ended: the CLI returned, so its worker had ended (the tag fixture checks it too).


def test_cli_refuses_bad_values_in_one_line() -> None:
    cases = [("--prompt", ""), ("--prompt", "x", "--num-beams", "1000"),
             ("--prompt", "x", "--do-sample", "--temperature", "nan"),
             ("--prompt", "x", "--top-p", "inf"), ("--prompt", "x", "--max-new-tokens", "0"),
             ("--prompt", "x", "--repetition-penalty", "-1"), ("--prompt", "x", "--num-beams", "two")]
    for args in cases:
        proc = subprocess.run([sys.executable, "-m", "gaudi_gui", "generate", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
    empty = subprocess.run([sys.executable, "-m", "gaudi_gui", "generate", "--prompt", "  "],
                           capture_output=True, text=True, timeout=60)
    assert generation.EMPTY_PROMPT in empty.stderr


# -- the worker -----------------------------------------------------------------------------------------


class _Worker:
    def __init__(self) -> None:
        with children_get_sigint():  # SIGINT as from a terminal
            self.proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui.workers.generate"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.err = _Reader(self.proc.stderr)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            message = protocol.decode(raw.decode())
            if message is not None:
                self.events.put(message)
        self.events.put({"type": "eof"})

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def until(self, *kinds: str, timeout: float = 120) -> dict[str, Any]:
        while True:
            message = self.events.get(timeout=timeout)
            if message["type"] in kinds:
                return message
            assert message["type"] != "eof", "the worker ended"


def test_choking_lines_on_worker_stdin_do_not_kill_the_reader() -> None:
    worker = _Worker()
    try:
        worker.until("ready")
        worker.send((protocol.PREFIX + "[" * 100_000 + "\n").encode())
        error = worker.until("error")
        assert error["kind"] == "protocol"
        worker.send(b"[" * 100_000 + b"\n")                      # plain noise: ignored
        worker.send(protocol.PREFIX.encode() + b"\xff\xfe{\n")   # bad UTF-8 behind the prefix
        assert worker.until("error")["kind"] == "protocol"
        worker.send((generation.unload_command() + "\n").encode())
        worker.until("unloaded")  # still reading and serving
        worker.send((generation.shutdown_command() + "\n").encode())
        assert worker.proc.wait(20) == 0
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()


def test_sigint_ends_the_worker_with_130() -> None:
    idle = _Worker()
    idle.until("ready")
    idle.proc.send_signal(signal.SIGINT)
    assert idle.proc.wait(20) == 130

    worker = _Worker()
    try:
        worker.until("ready")
        worker.send((generation.load_command(LoadOptions()) + "\n").encode())
        worker.until("loaded")
        long = GenerationParams(do_sample=False, max_new_tokens=100_000)
        worker.send((generation.generate_command(long, prompt="The", request_id=1) + "\n").encode())
        worker.until("token")
        worker.proc.send_signal(signal.SIGINT)
        assert worker.until("finished", timeout=20)["stats"]["stop_reason"] == "cancelled"
        assert worker.proc.wait(20) == 130
        stderr = worker.err.join().decode(errors="replace")
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-2000:]
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()


def test_worker_ends_when_its_stdin_closes_mid_answer() -> None:
    worker = _Worker()
    try:
        worker.until("ready")
        worker.send((generation.load_command(LoadOptions()) + "\n").encode())
        worker.until("loaded")
        long = GenerationParams(do_sample=False, max_new_tokens=100_000)
        worker.send((generation.generate_command(long, prompt="The", request_id=1) + "\n").encode())
        worker.until("token")
        assert worker.proc.stdin is not None
        worker.proc.stdin.close()
        assert worker.proc.wait(20) == 0
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()


def test_a_real_allocation_failure_is_out_of_memory() -> None:
    code = ("import torch\n"
            "from gaudi_gui.workers.generate import _classify\n"
            "try:\n"
            "    torch.empty(1 << 55, dtype=torch.uint8)\n"
            "except Exception as exc:\n"
            "    print(_classify(exc).kind)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "out_of_memory", proc.stdout + proc.stderr
