"""The runner's chat through the Serve endpoint: one streamed OpenAI request at a time over HTTP
(QNetworkAccessManager, on the GUI thread's event loop, never blocking it), its text as it arrives,
and the same stats line the worker gives (time to first token, tokens/s, tokens, stop reason).

Talking to the server is how a user tries what their own code will see: the same URL (for a host,
the local end of the forward), the same model id and API key as the snippets.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from PySide6.QtCore import QByteArray, QObject, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

from gaudi_gui.core.serve import SseReader, chat_body, chunk_finish, chunk_text, endpoint_stats

#: How long a request may go without a byte before it counts as failed (a server that hangs).
TRANSFER_TIMEOUT_MS = 120_000


class EndpointChat(QObject):
    """``generate(url, model, params, messages=… | prompt=…)``; ``cancel()`` ends the answer."""

    token_received = Signal(str)
    #: The answer ended: the stats (``core.generation.format_stats`` reads them).
    generation_finished = Signal(dict)
    #: (kind, message): "endpoint" for a failed request (the server's own error text where it sent one).
    error_occurred = Signal(str, str)
    busy_changed = Signal(bool)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._network = QNetworkAccessManager(self)
        self._reply: QNetworkReply | None = None
        self._reader = SseReader()
        self._started = 0.0
        self._first: float | None = None
        self._chunks = 0
        self._usage: dict[str, Any] | None = None
        self._finish = ""
        self._cancelled = False
        self._error_body = b""

    def is_busy(self) -> bool:
        return self._reply is not None

    def generate(self, url: str, model: str, params: Any, *, api_key_env: str = "",
                 messages: list[dict[str, str]] | None = None, prompt: str | None = None) -> bool:
        """Send one request to ``url`` (``http://127.0.0.1:PORT/v1``); False while one is going."""
        if self._reply is not None or not url:
            return False
        path = "/chat/completions" if messages is not None else "/completions"
        request = QNetworkRequest(QUrl(url.rstrip("/") + path))
        request.setHeader(QNetworkRequest.KnownHeaders.ContentTypeHeader, "application/json")
        request.setRawHeader(QByteArray(b"Accept"), QByteArray(b"text/event-stream"))
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if key:
            request.setRawHeader(QByteArray(b"Authorization"), QByteArray(f"Bearer {key}".encode()))
        request.setTransferTimeout(TRANSFER_TIMEOUT_MS)
        body = json.dumps(chat_body(model, params, messages=messages, prompt=prompt)).encode()
        self._reader = SseReader()
        self._first, self._chunks, self._usage, self._finish = None, 0, None, ""
        self._cancelled, self._error_body = False, b""
        self._started = time.perf_counter()
        reply = self._network.post(request, QByteArray(body))
        self._reply = reply
        reply.readyRead.connect(self._on_ready_read)
        reply.finished.connect(self._on_finished)
        self.busy_changed.emit(True)
        return True

    def cancel(self) -> None:
        """End the answer now (the server sees the connection close and stops generating)."""
        if self._reply is not None:
            self._cancelled = True
            self._reply.abort()

    def _status(self) -> int:
        reply = self._reply
        value = reply.attribute(QNetworkRequest.Attribute.HttpStatusCodeAttribute) if reply else None
        return int(value) if isinstance(value, int) else 0

    def _on_ready_read(self) -> None:
        reply = self._reply
        if reply is None:
            return
        if not reply.isOpen():
            return  # aborted (Stop): nothing more to read
        data = bytes(reply.readAll().data())
        if self._status() >= 400:
            self._error_body += data[:4000]
            return
        for event in self._reader.feed(data):
            if event == "[DONE]" or not isinstance(event, dict):
                continue
            if isinstance(event.get("error"), dict):
                self._error_body = json.dumps(event).encode()
                continue
            text = chunk_text(event)
            if text:
                if self._first is None:
                    self._first = time.perf_counter()
                self._chunks += 1
                self.token_received.emit(text)
            self._finish = chunk_finish(event) or self._finish
            if isinstance(event.get("usage"), dict):
                self._usage = event["usage"]

    def _on_finished(self) -> None:
        reply = self._reply
        if reply is None:
            return
        self._on_ready_read()
        status = self._status()
        error = reply.error()
        message = reply.errorString()
        self._reply = None
        reply.deleteLater()
        self.busy_changed.emit(False)
        if not self._cancelled and (self._error_body or status >= 400
                                    or error != QNetworkReply.NetworkError.NoError):
            self.error_occurred.emit("endpoint", _describe(status, self._error_body, message))
            return
        self.generation_finished.emit(endpoint_stats(
            started=self._started, first=self._first, ended=time.perf_counter(), chunks=self._chunks,
            usage=self._usage, finish="stopped" if self._cancelled else self._finish))


def _describe(status: int, body: bytes, network_message: str) -> str:
    """One line: the HTTP status and the server's own error message where it sent one."""
    text = body.decode("utf-8", errors="replace").strip()
    detail = text
    try:
        got = json.loads(text)
        if isinstance(got, dict):
            err = got.get("error", got.get("detail", got))
            detail = str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except ValueError:
        pass
    head = (f"the endpoint answered HTTP {status}" if status
            else f"the endpoint did not answer: {network_message}")
    return f"{head}: {detail[:300]}" if detail else head
