"""The generate worker as a real child process on the tiny demo model."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
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


def test_cancel_then_generate_at_once_cancels_the_first(worker: Worker) -> None:
    worker.until("ready")
    worker.send(generation.load_command(LoadOptions()))
    worker.until("loaded")
    long = GenerationParams(do_sample=False, max_new_tokens=20000, min_new_tokens=20000)
    short = GenerationParams(do_sample=False, max_new_tokens=5, min_new_tokens=5)
    worker.send(generation.generate_command(long, prompt="The", request_id=1))
    worker.until("token")
    # Both lines in one write: the second generate reaches the reader before the first notices.
    assert worker.proc.stdin is not None
    worker.proc.stdin.write(generation.cancel_command(1) + "\n"
                            + generation.generate_command(short, prompt="The", request_id=2) + "\n")
    worker.proc.stdin.flush()
    first, _ = worker.until("finished", timeout=30)
    assert first["id"] == 1 and first["stats"]["stop_reason"] == "cancelled"
    assert first["stats"]["tokens"] < 2000
    second, seen = worker.until("finished", timeout=30)
    assert second["id"] == 2 and second["stats"]["tokens"] == 5
    assert all(m.get("id") == 2 for m in seen if m["type"] == "token")
    # An id-less cancel cancels what came before it, never a generate sent after it.
    worker.send(generation.generate_command(long, prompt="The", request_id=3))
    worker.send(generation.cancel_command())
    worker.send(generation.generate_command(short, prompt="The", request_id=4))
    third, _ = worker.until("finished", timeout=30)
    fourth, _ = worker.until("finished", timeout=30)
    assert third["stats"]["stop_reason"] == "cancelled"
    assert fourth["id"] == 4 and fourth["stats"]["stop_reason"] == "max_new_tokens"


def test_stop_strings_literal_and_empty_prompt(worker: Worker) -> None:
    worker.until("ready")
    worker.send(generation.load_command(LoadOptions()))
    worker.until("loaded")
    free = GenerationParams(do_sample=False, max_new_tokens=40)
    worker.send(generation.generate_command(free, prompt="The learning rate", request_id=1))
    _, seen = worker.until("finished")
    text = "".join(m["text"] for m in seen if m["type"] == "token")
    words = text.split()
    assert len(words) > 3, text
    stop = " " + words[2]
    stopped = GenerationParams(do_sample=False, max_new_tokens=40, stop=[stop, "。", "\\x"])
    worker.send(generation.generate_command(stopped, prompt="The learning rate", request_id=2))
    done, seen = worker.until("finished")
    shown = "".join(m["text"] for m in seen if m["type"] == "token")
    assert done["stats"]["stop_reason"] == "stop_string", done
    assert shown == text[:text.index(stop)] and stop not in shown
    assert done["stats"]["tokens"] < 40

    worker.send(generation.generate_command(free, prompt="", request_id=3))
    error, _ = worker.until("error", "finished")
    assert error["kind"] == "bad_parameters" and error["message"] == generation.EMPTY_PROMPT
    for bad in ({"temperature": float("nan")}, {"num_beams": 1000, "do_sample": False},
                {"max_new_tokens": "lots"}, {"top_p": 1e309}):
        worker.send(protocol.PREFIX + json.dumps({"cmd": "generate", "prompt": "x", "id": 4,
                                                  "params": bad}))
        error, _ = worker.until("error", "finished")
        assert error["type"] == "error" and error["kind"] == "bad_parameters", (bad, error)


#: Run in a child (transformers and torch stay out of the test process): streams a text through the
#: worker's streamer an id at a time, then all ids within one interval, and prints what it saw.
_STREAM_CHECK = r"""
import json, sys
from transformers import AutoTokenizer
from gaudi_gui.workers.generate import _Detokenizer

class Ids:  # what generate hands a streamer: a tensor's tolist (a batch of one, or the new ids)
    def __init__(self, ids): self.ids = ids
    def tolist(self): return self.ids

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
text = sys.argv[2]
ids = tokenizer(text, add_special_tokens=False)["input_ids"]
each = []
streamer = _Detokenizer(tokenizer, each.append, interval_s=0.0)
streamer.put(Ids([[1, 2, 3]]))  # the prompt: not shown
for one in ids:
    streamer.put(Ids([one]))
streamer.end()
decodes = [0]
original = tokenizer.decode
def counted(*args, **kwargs):
    decodes[0] += 1
    return original(*args, **kwargs)
tokenizer.decode = counted
batched = []
streamer = _Detokenizer(tokenizer, batched.append, interval_s=60.0)
streamer.put(Ids([[1]]))
for one in ids:
    streamer.put(Ids([one]))
streamer.end()
print(json.dumps({"whole": original(ids, skip_special_tokens=True), "ids": len(ids), "each": each,
                  "batched": batched, "decodes": decodes[0]}))
"""


def test_the_streamed_text_is_the_answer_decoded_whole_and_costs_a_decode_per_event(
        tiny_model_dir: Path) -> None:
    """The worker's streamer decodes only the ids since its last event (HF's TextStreamer decoded the
    whole line at every token: 38 µs a token of the demo model, 5% of its decode rate)."""
    text = ("Grüße 😀 über naïve café — ok 你好.\n  The learning rate sets the size of each step; "
            "a warm-up raises it.\n\nEnd")
    done = subprocess.run([sys.executable, "-c", _STREAM_CHECK, str(tiny_model_dir), text],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # Every id its own event (interval 0): each piece is only what that id adds, none lost or doubled,
    # a character split over ids (the emoji's bytes) held back until it is whole.
    assert "".join(seen["each"]) == seen["whole"]
    assert all("\ufffd" not in p for p in seen["each"]), seen["each"]
    assert len(seen["each"]) > seen["ids"] // 2
    # Ids arriving faster than one event per interval: the first at once, the rest at the end.
    assert "".join(seen["batched"]) == seen["whole"] and len(seen["batched"]) == 2, seen["batched"]
    assert seen["decodes"] <= 4, seen["decodes"]


def test_first_demo_load_reports_build_progress(demo_model: object, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GAUDI_GUI_DEMO_MODEL_DIR", str(tmp_path / "unbuilt"))
    w = Worker()
    try:
        w.until("ready")
        w.send(generation.load_command(LoadOptions()))
        while True:
            message = w.events.get(timeout=120)
            assert message["type"] not in ("error", "loaded", "eof"), message
            if message["type"] == "loading" and message.get("progress"):
                break
        assert "building the demo model" in message["stage"] and message["progress"][1] > 0
    finally:
        w.proc.kill()
        w.proc.wait(10)


def test_offline_hub_id_fails_fast(worker: Worker) -> None:
    worker.until("ready")
    started = time.perf_counter()
    worker.send(generation.load_command(LoadOptions(model="some-org/not-cached")))
    error, seen = worker.until("error", "loaded")
    took = time.perf_counter() - started
    assert error["kind"] == "no_network" and "HF_HUB_OFFLINE" in error["message"]
    assert took < 3, took
    assert not any(m.get("stage", "").startswith("importing torch") for m in seen)


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


def test_a_long_chat_keeps_within_the_models_context(worker: Worker) -> None:
    """Issue 37, item 11: a chat that grew past the model's context (the demo's 512 tokens) failed
    for good. Twelve turns of long questions: every one is answered, the oldest turns are left out
    (the answer's stats say how many, and the context), and the prompt always leaves the answer room."""
    worker.until("ready")
    worker.send(generation.load_command(LoadOptions()))
    worker.until("loaded")
    params = GenerationParams(do_sample=False, max_new_tokens=64, min_new_tokens=64)
    question = "What does the learning rate do to the loss of the model during training? " * 4
    messages: list[dict[str, str]] = [{"role": "system", "content": "Answer briefly."}]
    every: list[dict[str, Any]] = []
    for turn in range(12):
        messages.append({"role": "user", "content": f"{turn}: {question}"})
        worker.send(generation.generate_command(params, messages=messages, request_id=turn))
        done, seen = worker.until("finished", "error")
        assert done["type"] == "finished", done
        stats = done["stats"]
        answer = "".join(m["text"] for m in seen if m["type"] == "token")
        assert stats["tokens"] == 64 and answer, stats
        every.append(stats)
        messages.append({"role": "assistant", "content": answer})
    # The answer always had room in the context (before: the prompt grew past 512 by turn 6).
    assert max(s["prompt_tokens"] for s in every) + 64 <= 512, [s["prompt_tokens"] for s in every]
    assert {s.get("context") for s in every} == {512}
    left_out = [s["left_out"] for s in every]
    assert left_out[0] == 0 and left_out[-1] > 0, left_out
    note = generation.format_stats({"left_out": left_out[-1], "context": 512})
    assert note == f"{left_out[-1]} oldest turns left out to fit the model's 512-token context"
