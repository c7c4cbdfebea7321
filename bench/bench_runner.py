"""Model runner: decoding tokens/s through the app's worker against a plain ``model.generate`` script
(same model, same greedy settings, same run), the worker's added time to first token, and the latency
of Stop (cancel request to the finished event), on the demo model and a ~100M-parameter random Llama.

The worker runs as the window runs it: a ``generate`` child of this machine's agent (a private one, in
a temporary state folder), its tokens read as the agent's ``output`` events; decode tokens/s is timed
here, on the client's side of the agent, from the arrival of the first token to the last one."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import environ, interleaved_metrics, row  # noqa: E402
from gaudi_gui.core import generation, protocol  # noqa: E402
from gaudi_gui.core.agentwire import Connection  # noqa: E402
from gaudi_gui.core.generation import GenerationParams, LoadOptions  # noqa: E402

PROMPT = "The learning rate sets the size of each step."

BUILD_BIG = r"""
import sys, torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(sys.argv[1])
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
                  tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
model = LlamaForCausalLM(cfg)
model.save_pretrained(sys.argv[2]); tok.save_pretrained(sys.argv[2])
print(sum(p.numel() for p in model.parameters()))
"""

PLAIN = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.streamers import BaseStreamer
path, prompt = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path).eval()
class Clock(BaseStreamer):
    def __init__(self): self.times = []
    def put(self, value): self.times.append(time.perf_counter())
    def end(self): pass
inputs = tok(prompt, return_tensors="pt")
print("ready", flush=True)
# One generate per line on stdin ("N" new tokens), so the parent can interleave it with the worker.
for line in sys.stdin:
    n = int(line)
    with torch.inference_mode():
        clock = Clock(); t0 = time.perf_counter()
        model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=clock)
    # put() is called once for the prompt, then once per new token
    first, last = clock.times[1], clock.times[-1]
    print(json.dumps({"ttft_s": first - t0,
                      "decode_tokens_per_s": (len(clock.times) - 2) / (last - first)}), flush=True)
"""


class Plain:
    """A plain ``model.generate`` script, kept loaded, one generate per request."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PLAIN, path, PROMPT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     bufsize=1)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "ready":
                return
        raise RuntimeError("the plain generate script ended before it was ready")

    def generate(self, n: int) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("{"):
                return dict(json.loads(line))
        raise RuntimeError("the plain generate script ended")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Worker:
    """The app's generate worker, spoken to over its protocol, timed from this (parent) process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui.workers.generate"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def next_event(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = protocol.decode(line)
            if message is not None and "type" in message:
                return message
        raise RuntimeError("worker ended")

    def wait_for(self, kind: str) -> dict[str, Any]:
        while True:
            message = self.next_event()
            if message["type"] == kind:
                return message
            if message["type"] == "error":
                raise RuntimeError(message.get("message"))

    def load(self, path: str) -> None:
        self.send(generation.load_command(LoadOptions(model=path)))
        self.wait_for("loaded")

    def generate(self, n: int) -> tuple[float, dict[str, Any]]:
        params = GenerationParams(max_new_tokens=n, min_new_tokens=n, do_sample=False)
        t0 = time.perf_counter()
        self.send(generation.generate_command(params, prompt=PROMPT, request_id=1))
        first = None
        while True:
            message = self.next_event()
            if message["type"] == "token" and first is None:
                first = time.perf_counter() - t0
            elif message["type"] == "finished":
                return first or float("nan"), message["stats"]
            elif message["type"] == "error":
                raise RuntimeError(message.get("message"))

    def stop_latency(self) -> float:
        params = GenerationParams(max_new_tokens=100000, do_sample=False)
        self.send(generation.generate_command(params, prompt=PROMPT, request_id=2))
        seen = 0
        while seen < 5:
            if self.next_event()["type"] == "token":
                seen += 1
        t0 = time.perf_counter()
        self.send(generation.cancel_command())
        self.wait_for("finished")
        return time.perf_counter() - t0

    def close(self) -> None:
        try:
            self.send(generation.shutdown_command())
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class AgentWorker(Worker):
    """The same worker as the agent's ``generate`` child (what the window's runner uses), its events
    timed as they reach this client."""

    def __init__(self) -> None:  # no super().__init__(): it would start a worker of its own
        self.conn = Connection.open(client="bench")
        self.child_id = str(self.conn.request("child.start", kind="generate", args={})["child_id"])
        self._queue: list[tuple[float, dict[str, Any]]] = []

    def send(self, line: str) -> None:
        self.conn.request("child.send", child_id=self.child_id, message=line)

    def next_timed(self) -> tuple[float, dict[str, Any]]:
        while not self._queue:
            event = next(self.conn.stream(timeout=120))
            now = time.perf_counter()
            if event.get("child_id") != self.child_id:
                continue
            if "end" in event:
                raise RuntimeError(f"worker ended: {event['end']}")
            self._queue += [(now, m) for m in event.get("messages") or [] if "type" in m]
        return self._queue.pop(0)

    def next_event(self) -> dict[str, Any]:
        return self.next_timed()[1]

    def generate(self, n: int) -> tuple[float, dict[str, Any]]:
        params = GenerationParams(max_new_tokens=n, min_new_tokens=n, do_sample=False)
        t0 = time.perf_counter()
        self.send(generation.generate_command(params, prompt=PROMPT, request_id=1))
        times: list[float] = []
        while True:
            at, message = self.next_timed()
            if message["type"] == "token":
                times.append(at)
            elif message["type"] == "finished":
                stats = dict(message["stats"])
                stats["decode_tokens_per_s_worker"] = stats.get("decode_tokens_per_s", float("nan"))
                # The tokens after the first (a token event carries a piece of text: one or more), over
                # the time from the first's arrival here to the last's.
                span = times[-1] - times[0] if len(times) > 1 else float("nan")
                stats["decode_tokens_per_s"] = (int(stats.get("tokens") or 0) - 1) / span
                return times[0] - t0 if times else float("nan"), stats
            elif message["type"] == "error":
                raise RuntimeError(message.get("message"))

    def close(self) -> None:
        try:
            self.conn.request("child.send", child_id=self.child_id,
                              message=generation.shutdown_command(), close=True)
            self.conn.request("shutdown", force=True)
        finally:
            self.conn.close()


def _bench_model(label: str, path: str, n: int, reps: int) -> list[dict]:
    worker = AgentWorker()
    plain = Plain(path)
    try:
        worker.load(path)

        def app_once() -> dict[str, float]:
            ttft, stats = worker.generate(n)
            return {"ttft_s": ttft, "decode_tokens_per_s": stats["decode_tokens_per_s"]}

        # Worker and plain script alternate (warm-up pair first), so drift hits both alike.
        result = interleaved_metrics(app_once, lambda: plain.generate(n), reps, warmup=1)
        stops = [worker.stop_latency() for _ in range(3)]
    finally:
        worker.close()
        plain.close()
    tps, ttft = result["decode_tokens_per_s"], result["ttft_s"]
    added = [(s["app"] - s["base"]) * 1000 for s in ttft["samples"]]
    return [
        row(f"runner[{label}]: decode tokens/s (through the agent vs plain generate)", tps, unit="tok/s",
            goal="ratio >= 0.97"),
        {"name": f"runner[{label}]: added time to first token", "value": statistics.median(added),
         "unit": "ms", "baseline": round(ttft["base_median"] * 1000, 3), "ratio": None,
         "spread": [round(min(added), 2), round(max(added), 2)], "goal": "< 20 ms"},
        {"name": f"runner[{label}]: Stop to finished event", "value": statistics.median(stops) * 1000,
         "unit": "ms", "baseline": None, "ratio": None, "goal": "< 100 ms"},
    ]


def run(quick: bool = False) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp, environ(GAUDI_GUI_HOME=str(Path(tmp) / "home")):
        demo = Path(tmp) / "demo"
        subprocess.run([sys.executable, "-m", "gaudi_gui.workers.demo", str(demo), "--steps", "50"],
                       check=True, capture_output=True)
        big = Path(tmp) / "big"
        params = int(subprocess.run([sys.executable, "-c", BUILD_BIG, str(demo), str(big)],
                                    capture_output=True, text=True, check=True).stdout.split()[-1])
        rows = _bench_model("demo", str(demo), 64 if quick else 128, 3 if quick else 5)
        rows += _bench_model(f"{params / 1e6:.0f}M", str(big), 24 if quick else 64, 2 if quick else 3)
    return rows


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
