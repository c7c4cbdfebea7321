"""Model runner: decoding tokens/s through the app's worker against a plain ``model.generate`` script
(same model, same greedy settings, same run), the worker's added time to first token, and the latency
of Stop (cancel request to the finished event), on the demo model and a ~100M-parameter random Llama."""

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

from gaudi_gui.core import generation, protocol  # noqa: E402
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
path, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path).eval()
class Clock(BaseStreamer):
    def __init__(self): self.times = []
    def put(self, value): self.times.append(time.perf_counter())
    def end(self): pass
inputs = tok(sys.argv[4], return_tensors="pt")
out = []
with torch.inference_mode():
    model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
    for _ in range(reps):
        clock = Clock(); t0 = time.perf_counter()
        model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=clock)
        # put() is called once for the prompt, then once per new token
        first, last = clock.times[1], clock.times[-1]
        out.append({"ttft_s": first - t0, "decode_tokens_per_s": (len(clock.times) - 2) / (last - first)})
print(json.dumps(out))
"""


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


def _bench_model(label: str, path: str, n: int, reps: int) -> list[dict]:
    plain = json.loads(subprocess.run([sys.executable, "-c", PLAIN, path, str(n), str(reps), PROMPT],
                                      capture_output=True, text=True, check=True).stdout)
    worker = Worker()
    try:
        worker.load(path)
        worker.generate(4)  # warm-up, as the plain script does
        runs = [worker.generate(n) for _ in range(reps)]
        stops = [worker.stop_latency() for _ in range(3)]
    finally:
        worker.close()
    app_tps = statistics.median(r[1]["decode_tokens_per_s"] for r in runs)
    base_tps = statistics.median(p["decode_tokens_per_s"] for p in plain)
    app_ttft = statistics.median(r[0] for r in runs)
    base_ttft = statistics.median(p["ttft_s"] for p in plain)
    return [
        {"name": f"runner[{label}]: decode tokens/s (worker vs plain generate)", "value": app_tps,
         "unit": "tok/s", "baseline": base_tps, "ratio": app_tps / base_tps, "goal": "ratio >= 0.95"},
        {"name": f"runner[{label}]: added time to first token", "value": (app_ttft - base_ttft) * 1000,
         "unit": "ms", "baseline": base_ttft * 1000, "ratio": None, "goal": "< 20 ms"},
        {"name": f"runner[{label}]: Stop to finished event", "value": statistics.median(stops) * 1000,
         "unit": "ms", "baseline": None, "ratio": None, "goal": "< 100 ms"},
    ]


def run(quick: bool = False) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
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
    for row in run(quick="--quick" in sys.argv):
        print(row)
