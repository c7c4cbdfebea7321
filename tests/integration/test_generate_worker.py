"""The generate worker as a real child process on the tiny demo model."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gaudi_gui.core import generation, protocol
from gaudi_gui.core.generation import GenerationParams, LoadOptions

pytestmark = pytest.mark.slow


class Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui.workers.generate"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = protocol.decode(line)
            assert message is not None, f"non-protocol line on stdout: {line!r}"
            self.events.put(message)
        self.events.put({"type": "eof"})

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def until(self, *kinds: str, timeout: float = 60) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        seen = []
        while True:
            message = self.events.get(timeout=timeout)
            seen.append(message)
            if message["type"] in kinds:
                return message, seen


@pytest.fixture
def worker(demo_model: object) -> Iterator[Worker]:
    w = Worker()
    yield w
    if w.proc.poll() is None:
        w.proc.kill()
    w.proc.wait(10)


def test_load_generate_cancel_errors(worker: Worker) -> None:
    worker.until("ready")
    worker.send(generation.load_command(LoadOptions(model="/no/such/folder")))
    error, _ = worker.until("error", "loaded")
    assert error["type"] == "error" and error["kind"] == "missing_model"

    worker.send(generation.load_command(LoadOptions()))
    loaded, seen = worker.until("loaded", "error")
    assert loaded["type"] == "loaded", loaded
    assert loaded["device"] == "cpu" and loaded["parameters"] > 0
    assert any(m["type"] == "loading" for m in seen)

    params = GenerationParams(do_sample=False, max_new_tokens=12, min_new_tokens=12)
    worker.send(generation.generate_command(params, prompt="The model"))
    done, seen = worker.until("finished", "error")
    assert done["type"] == "finished", done
    assert done["stats"]["tokens"] == 12 and done["stats"]["stop_reason"] == "max_new_tokens"
    assert "".join(m["text"] for m in seen if m["type"] == "token")

    worker.send(generation.generate_command(GenerationParams(temperature=0), prompt="x"))
    error, _ = worker.until("error", "finished")
    assert error["kind"] == "bad_parameters" and "temperature" in error["message"]

    long = GenerationParams(do_sample=False, max_new_tokens=400, min_new_tokens=400)
    worker.send(generation.generate_command(long, messages=[{"role": "user", "content": "hi"}]))
    worker.until("token")
    worker.send(generation.cancel_command())
    done, _ = worker.until("finished", "error")
    assert done["stats"]["stop_reason"] == "cancelled" and done["stats"]["tokens"] < 400

    worker.send(generation.shutdown_command())
    worker.until("exiting")
    assert worker.proc.wait(20) == 0


def test_killed_mid_generation(worker: Worker) -> None:
    worker.until("ready")
    worker.send(generation.load_command(LoadOptions()))
    worker.until("loaded")
    long = GenerationParams(do_sample=False, max_new_tokens=400, min_new_tokens=400)
    worker.send(generation.generate_command(long, prompt="x"))
    worker.until("token")
    os.kill(worker.proc.pid, signal.SIGKILL)
    assert worker.proc.wait(10) == -signal.SIGKILL
    worker.until("eof")
