#!/usr/bin/env python3
"""A stand-in for ``vllm serve`` (no vLLM can run here: no accelerator, not installed), on the parts
gaudi-gui talks to, standard library only (it starts in a blink):

- ``vllm serve MODEL --host H --port P ...``: prints start-up lines, then uvicorn's access line per
  request (``INFO:     127.0.0.1:PORT - "POST /v1/chat/completions HTTP/1.1" 200 OK``);
- ``GET /v1/models``, ``GET /health``; ``POST /v1/chat/completions`` answers with ``usage``: the
  prompt's tokens are its words, the answer is ``max_tokens`` tokens;
- ``GET /metrics``: the text of tests/data/vllm/metrics.txt (Prometheus text format 0.0.4 as vLLM's
  prometheus_client writes it) with ``vllm:prompt_tokens_total`` and ``vllm:generation_tokens_total``
  set to what this server counted so far, labelled with the model as served;
- ``VLLM_API_KEY`` set: the ``/v1`` routes need ``Authorization: Bearer KEY`` (401 otherwise) and
  ``/metrics`` does not, as vLLM's AuthenticationMiddleware does (PUBLIC_ENDPOINTS);
- SIGTERM ends it (exit 0).

Knob: ``FAKE_VLLM_METRICS=404`` makes /metrics answer 404 (a server without Prometheus metrics).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

METRICS = (Path(__file__).parent / "data" / "vllm" / "metrics.txt").read_text(encoding="utf-8")
_lock = threading.Lock()
_counts = {"vllm:prompt_tokens_total": 0, "vllm:generation_tokens_total": 0}


def _metrics_text(model: str) -> str:
    def value(match: re.Match[str]) -> str:
        return f'{match["name"]}{{engine="0",model_name="{model}"}} {float(_counts[match["name"]])!r}'

    with _lock:
        text = re.sub(r'^(?P<name>vllm:(?:prompt|generation)_tokens_total)\{[^}]*\} \S+$', value, METRICS,
                      flags=re.M)
    return re.sub(r'model_name="[^"]*"', f'model_name="{model}"', text)


class Handler(BaseHTTPRequestHandler):
    model = ""
    key = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: ``_send`` prints uvicorn's access line instead, as vLLM's server does."""

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        phrase = {200: "OK", 401: "Unauthorized", 404: "Not Found"}.get(status, "")
        print(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path} '
              f'HTTP/1.1" {status} {phrase}', flush=True)

    def _authorized(self) -> bool:
        if self.key and self.path.startswith("/v1") and \
                self.headers.get("Authorization", "") != f"Bearer {self.key}":
            self._send(401, b'{"error":"Unauthorized"}')
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path == "/metrics":
            if os.environ.get("FAKE_VLLM_METRICS") == "404":
                self._send(404, b'{"detail":"Not Found"}')
            else:
                self._send(200, _metrics_text(self.model).encode(),
                           "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]})
                       .encode())
        elif self.path == "/health":
            self._send(200, b"")
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not self._authorized():
            return
        if self.path != "/v1/chat/completions":
            self._send(404, b'{"detail":"Not Found"}')
            return
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        generated = int(body.get("max_tokens") or 16)
        with _lock:
            _counts["vllm:prompt_tokens_total"] += prompt
            _counts["vllm:generation_tokens_total"] += generated
        answer = {"id": "chatcmpl-fake", "object": "chat.completion", "model": self.model,
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * generated},
                               "finish_reason": "length"}],
                  "usage": {"prompt_tokens": prompt, "completion_tokens": generated,
                            "total_tokens": prompt + generated}}
        self._send(200, json.dumps(answer).encode())


def main() -> int:
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("command")
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, _rest = parser.parse_known_args()
    Handler.model, Handler.key = args.model, os.environ.get("VLLM_API_KEY", "")
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"INFO {stamp} api_server.py:712] vLLM API server version 0.0.0 (tests/fake_vllm.py)", flush=True)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"INFO:     Started server process [{os.getpid()}]", flush=True)
    print(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", flush=True)
    server.serve_forever(poll_interval=0.05)
    server.server_close()
    print("INFO:     Shutting down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
