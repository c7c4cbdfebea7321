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

from gaudi_gui.core import generation
from gaudi_gui.core.serve import SseReader, chat_body, chunk_finish, chunk_text, endpoint_stats

#: How long a request may go without a byte before it counts as failed (a server that hangs).
TRANSFER_TIMEOUT_MS = 120_000
#: What a message adds besides its text (the chat template's role markers), in characters, for the
#: estimate of a conversation's tokens before the server has counted one.
MESSAGE_OVERHEAD_CHARS = 16


def _chars(messages: list[dict[str, str]]) -> int:
    return sum(len(str(m.get("content", ""))) + MESSAGE_OVERHEAD_CHARS for m in messages)


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
        # The conversation kept within the model's context (issue 37, item 11): the whole conversation,
        # what the last request sent of it, how many turns it left out, the model's context in tokens
        # (the server's, or its refusal's) and tokens per character as the server last counted them.
        self._request: tuple[str, str, Any, str] | None = None
        self._messages: list[dict[str, str]] | None = None
        self._sent: list[dict[str, str]] = []
        self._left_out = 0
        self._context = 0
        self._ratio = 0.0
        self._url = ""

    def is_busy(self) -> bool:
        return self._reply is not None

    def generate(self, url: str, model: str, params: Any, *, api_key_env: str = "",
                 messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                 context: int = 0) -> bool:
        """Send one request to ``url`` (``http://127.0.0.1:PORT/v1``); False while one is going.

        A conversation (``messages``) is kept within the model's ``context`` (tokens; 0: not known
        until the server refuses a prompt as too long, which says it): the oldest turns are left
        out, by the server's own count of the last request's prompt; a refusal the estimate missed is
        answered by leaving out more and asking again, until the server takes it. The stats say how
        many turns were left out."""
        if self._reply is not None or not url:
            return False
        if url != self._url:
            self._url, self._ratio, self._context = url, 0.0, 0  # another server: another tokenizer
        self._request = (url, model, params, api_key_env)
        self._messages, self._left_out = messages, 0
        self._context = context or self._context
        self._started = time.perf_counter()
        if messages is not None:
            try:
                sent = self._fit(0)
            except generation.ContextError as exc:
                # By the server's own count of the last prompt, per character: an estimate.
                self.error_occurred.emit("endpoint", exc.said(self._context, about=True))
                return False
            self._post(messages=sent)
        else:
            self._post(prompt=prompt)
        self.busy_changed.emit(True)
        return True

    def _fit(self, at_least: int) -> list[dict[str, str]]:
        """The conversation to send: all of it until the server's count and the model's context are
        known, then the oldest turns left out until the estimate fits (``generation.fit_messages``)."""
        messages = self._messages or []
        params = self._request[2] if self._request else None
        if not self._context or not self._ratio or params is None:
            if at_least:
                kept, self._left_out = generation.fit_messages(messages, lambda _kept: 0, 0,
                                                               at_least=at_least)
                return kept
            return list(messages)
        ratio = self._ratio
        budget = generation.prompt_budget(self._context, int(params.max_new_tokens))
        kept, self._left_out = generation.fit_messages(
            messages, lambda chosen: int(_chars(chosen) * ratio + 0.5), budget, at_least=at_least)
        return kept

    def _post(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None) -> None:
        assert self._request is not None
        url, model, params, api_key_env = self._request
        path = "/chat/completions" if messages is not None else "/completions"
        request = QNetworkRequest(QUrl(url.rstrip("/") + path))
        request.setHeader(QNetworkRequest.KnownHeaders.ContentTypeHeader, "application/json")
        request.setRawHeader(QByteArray(b"Accept"), QByteArray(b"text/event-stream"))
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if key:
            request.setRawHeader(QByteArray(b"Authorization"), QByteArray(f"Bearer {key}".encode()))
        request.setTransferTimeout(TRANSFER_TIMEOUT_MS)
        body = json.dumps(chat_body(model, params, messages=messages, prompt=prompt)).encode()
        self._sent = list(messages or [])
        self._reader = SseReader()
        self._first, self._chunks, self._usage, self._finish = None, 0, None, ""
        self._cancelled, self._error_body = False, b""
        reply = self._network.post(request, QByteArray(body))
        self._reply = reply
        reply.readyRead.connect(self._on_ready_read)
        reply.finished.connect(self._on_finished)

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
        failed = not self._cancelled and (bool(self._error_body) or status >= 400
                                          or error != QNetworkReply.NetworkError.NoError)
        if failed and self._retry_shorter(status):
            return  # asked again with fewer turns: still busy
        self.busy_changed.emit(False)
        if failed:
            overflow = generation.context_overflow(self._error_body.decode("utf-8", errors="replace"))
            if overflow is not None:
                # Said without the engine's option names: its --max-model-len cannot go past the
                # model's own context, which is what refused the prompt here.
                self.error_occurred.emit("endpoint", f"the endpoint refused the prompt: {overflow[0]} "
                                                     f"tokens, and the model takes at most {overflow[1]}, "
                                                     "prompt and answer: shorten the message or lower max "
                                                     "new tokens")
                return
            self.error_occurred.emit("endpoint", _describe(status, self._error_body, message))
            return
        prompt_tokens = (self._usage or {}).get("prompt_tokens")
        if self._sent and isinstance(prompt_tokens, int) and prompt_tokens > 0:
            self._ratio = prompt_tokens / _chars(self._sent)  # the server's own count, for the next turn
        stats = endpoint_stats(
            started=self._started, first=self._first, ended=time.perf_counter(), chunks=self._chunks,
            usage=self._usage, finish="stopped" if self._cancelled else self._finish)
        if self._messages is not None:
            stats.update(left_out=self._left_out, context=self._context or None)
        self.generation_finished.emit(stats)

    def _retry_shorter(self, status: int) -> bool:
        """A conversation the server refused as too long for the model (its message says the prompt's
        tokens and the model's limit): leave out more of its oldest turns, by the server's count, and
        ask again. False where it was another failure, or nothing more can be left out (then the
        refusal is said as it came)."""
        if status != 400 or self._messages is None or self._request is None:
            return False
        text = self._error_body.decode("utf-8", errors="replace")
        overflow = generation.context_overflow(text)
        if overflow is None:
            return False
        prompt_tokens, limit = overflow
        self._context = limit
        self._ratio = max(self._ratio, prompt_tokens / max(_chars(self._sent), 1))
        try:
            sent = self._fit(self._left_out + 1)
        except generation.ContextError:
            return False
        self._post(messages=sent)
        return True


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
