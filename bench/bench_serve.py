"""Serve speed: streaming tokens/s and time to first token through the app's endpoint (``gaudi-gui
serve``: the command, its engine child, the access log read back) against the same engine started by
hand (``transformers serve DIR`` on another port, queried directly), with 1 and 4 concurrent streaming
clients; and the time from Start to ready (the URL printed / the models endpoint answering).

The two sides alternate (bench/harness.py): each pair starts the app's server, measures, stops it,
then does the same by hand, so only one server is up at a time. A "token" is one streamed content chunk
(transformers serve sends one per generated token); tokens/s is all clients' chunks over the wall time
of the round; TTFT is the median over the round's clients."""

from __future__ import annotations

import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.bench_training import _ensure_model
from bench.harness import environ, interleaved_metrics, row
from gaudi_gui.core import paths
from gaudi_gui.core.serve import pick_free_port

NEW_TOKENS = 48


def _stream_once(url: str) -> tuple[float, int]:
    """(seconds to the first content chunk, content chunks) of one streaming chat request."""
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me about Gaudi."}],
                       "max_tokens": NEW_TOKENS, "stream": True}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first = 0.0
    chunks = 0
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if delta.get("content"):
                chunks += 1
                if not first:
                    first = time.perf_counter() - started
    return first, chunks


def _round(url: str, clients: int) -> dict[str, float]:
    results: list[tuple[float, int]] = []
    started = time.perf_counter()
    threads = [threading.Thread(target=lambda: results.append(_stream_once(url))) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"tokens_per_s": sum(c for _, c in results) / wall,
            "ttft_ms": statistics.median(f for f, _ in results) * 1000}


def _wait_models(port: int, proc: subprocess.Popen[Any], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server ended (exit {proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not answer")


def _start_app(port: int, env: dict[str, str]) -> tuple[subprocess.Popen[str], float]:
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "serve", "--model", "builtin:demo",
                             "--device", "cpu", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for x in proc.stdout or []:
            lines.put(x)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        line = lines.get(timeout=300)
        if line.startswith("http://"):
            return proc, time.perf_counter() - started


def _start_direct(port: int, model_dir: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], float]:
    program = str(Path(sys.executable).parent / "transformers")
    started = time.perf_counter()
    proc = subprocess.Popen([program, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                             model_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    _wait_models(port, proc)
    return proc, time.perf_counter() - started


def _end(proc: subprocess.Popen[Any], group: bool = False) -> None:
    if proc.poll() is None:
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(quick: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="gaudi-gui-bench-serve-"))
    _ensure_model(tmp)
    model_dir = str(os.environ.get("GAUDI_GUI_DEMO_MODEL_DIR") or paths.demo_model_dir())
    env = {**os.environ, "GAUDI_GUI_HOME": str(tmp / "home"), "GAUDI_GUI_DEMO_MODEL_DIR": model_dir,
           "HF_HUB_OFFLINE": "1"}
    repeats = 2 if quick else 5

    def measure(url: str) -> dict[str, float]:
        out: dict[str, float] = {}
        _round(url, 1)  # the first request of a fresh server pays for its lazy set-up: not kept
        for clients in (1, 4):
            got = _round(url, clients)
            out[f"tokens_per_s_{clients}"] = got["tokens_per_s"]
            out[f"ttft_ms_{clients}"] = got["ttft_ms"]
        return out

    # One server at a time: two idle engines side by side on a small box slow each other down
    # (measured: one of the two ran 5-8x slower while both were up), which no user setup has.
    def app_once() -> dict[str, float]:
        port = pick_free_port()
        proc, took = _start_app(port, env)
        try:
            return {"ready_s": took, **measure(f"http://127.0.0.1:{port}/v1")}
        finally:
            _end(proc)

    def direct_once() -> dict[str, float]:
        port = pick_free_port()
        proc, took = _start_direct(port, model_dir, env)
        try:
            return {"ready_s": took, **measure(f"http://127.0.0.1:{port}/v1")}
        finally:
            _end(proc, group=True)

    result = interleaved_metrics(app_once, direct_once, repeats)
    host_rows = _host_rows(tmp, measure, model_dir, 3 if quick else 7)
    rows = [row("serve Start -> ready, demo model, CPU (app vs transformers serve by hand)",
                result["ready_s"], unit="s", goal="ratio close to 1 (s, lower is better)")]
    for clients in (1, 4):
        rows.append(row(f"serve streaming tokens/s, {clients} client(s), app endpoint vs engine direct",
                        result[f"tokens_per_s_{clients}"], unit="tok/s",
                        goal=f"ratio >= 0.95 ({NEW_TOKENS} new tokens per client, demo model, CPU)"))
        rows.append(row(f"serve TTFT, {clients} client(s), app endpoint vs engine direct",
                        result[f"ttft_ms_{clients}"], unit="ms", goal="< 5 ms added"))
    return rows + host_rows


def _host_rows(tmp: Path, measure: Any, model_dir: str, repeats: int) -> list[dict[str, Any]]:
    """A host's endpoint through the app's forward (``serve --host``: ssh -L on the multiplexed
    connection to the host's loopback) against the same server's port on the host queried directly.
    The "host" is the bench SSH server on 127.0.0.1, so its loopback port is reachable from here: one
    server, the two paths alternating request round by request round (forward, direct, forward, …)."""
    from bench.bench_remote import ssh_server

    host_env = {"GAUDI_GUI_DEMO_MODEL_DIR": model_dir, "HF_HUB_OFFLINE": "1",
                "GAUDI_GUI_HOME": str(tmp / "host-home")}
    with environ(**host_env), ssh_server(tmp / "ssh") as alias:
        local, remote = pick_free_port(), pick_free_port()
        proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "serve", "--host", alias, "--model",
                                 "builtin:demo", "--device", "cpu", "--port", str(local), "--remote-port",
                                 str(remote)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, env=dict(os.environ))
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("http://"):
                    break
            else:
                raise RuntimeError("serve --host ended before it printed its URL")
            forward = f"http://127.0.0.1:{local}/v1"
            direct = f"http://127.0.0.1:{remote}/v1"
            measure(forward)  # the first requests of a fresh server pay for its lazy set-up
            result = interleaved_metrics(lambda: measure(forward), lambda: measure(direct), repeats)
        finally:
            _end(proc)
    rows = []
    for clients in (1, 4):
        rows.append(row(f"serve on a host: streaming tokens/s, {clients} client(s), through the forward vs "
                        "the host's port", result[f"tokens_per_s_{clients}"], unit="tok/s",
                        goal="ratio >= 0.95"))
        rows.append(row(f"serve on a host: TTFT, {clients} client(s), through the forward vs the host's port",
                        result[f"ttft_ms_{clients}"], unit="ms", goal="< 5 ms added"))
    return rows


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(json.dumps(r))
