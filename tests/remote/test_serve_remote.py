"""``gaudi-gui serve --host``: the server runs on the host (the SSH test server) under the guard, bound
to the host's loopback, reached here through the forwarded port; a SIGKILLed client leaves nothing."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gaudi_gui.core import protocol
from gaudi_gui.core.serve import pick_free_port
from tests.remote.conftest import SshHost


def test_serve_on_a_host_through_the_forward_and_sigkill_leaves_nothing(ssh_host: SshHost,
                                                                         demo_model: Path) -> None:
    from openai import OpenAI

    local, remote = pick_free_port(), pick_free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "serve", "--host", ssh_host.dest,
                             "--model", "builtin:demo", "--device", "cpu", "--port", str(local),
                             "--remote-port", str(remote), "--events"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while not (seen and seen[-1].startswith("http://")):
            assert time.monotonic() < deadline, seen
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            assert line is not None, (seen, proc.stderr.read() if proc.stderr else "")
            seen.append(line)
        url = seen[-1]
        assert url == f"http://127.0.0.1:{local}/v1"
        states = [m.get("state") for line in seen if (m := protocol.decode(line)) is not None]
        assert "ready" in states
        # The server on the host binds its loopback on the remote port; here it is the forward's end.
        server = [p for p in ssh_host.processes() if "serve" in " ".join(p.cmdline())
                  and "transformers" in " ".join(p.cmdline())]
        assert server and str(remote) in " ".join(server[0].cmdline())
        assert "127.0.0.1" in server[0].cmdline()
        client = OpenAI(base_url=url, api_key="none", max_retries=0)
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5)
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True))
        assert len(chunks) >= 3
        # The host's request lines come back here as events.
        deadline = time.monotonic() + 20
        posts = 0
        while posts < 2 and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            message = protocol.decode(line)
            if message and message["type"] == "serve_request" and message["method"] == "POST":
                posts += 1
        assert posts == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    # The client died without a word: the guard on the host ends the server when ssh's stdin closes.
    # (The local end of the forward belongs to ssh's multiplexing master, which the fixture ends.)
    assert ssh_host.wait_no_processes(timeout=40) == []


def test_a_dropped_connection_is_made_again_and_the_endpoint_answers(ssh_host: SshHost,
                                                                     demo_model: Path) -> None:
    from openai import OpenAI

    local, remote = pick_free_port(), pick_free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "serve", "--host", ssh_host.dest,
                             "--model", "builtin:demo", "--device", "cpu", "--port", str(local),
                             "--remote-port", str(remote)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("http://"):
                break
        assert ssh_host.processes(), "the server runs on the host"
        # A long answer streams through the forward when the network goes: the client's stream ends
        # with an error within seconds (it does not hang on a half-open forward).
        streamer = OpenAI(base_url=f"http://127.0.0.1:{local}/v1", api_key="none", max_retries=0, timeout=60)
        got: list[str] = []
        ended: list[BaseException | None] = []

        def stream() -> None:
            try:
                chunks = streamer.chat.completions.create(
                    model=streamer.models.list().data[0].id, stream=True, max_tokens=100_000,
                    messages=[{"role": "user", "content": "Tell me everything"}])
                for chunk in chunks:
                    got.extend(c.delta.content or "" for c in chunk.choices)
                ended.append(None)
            except BaseException as exc:  # what the user's code sees is the point
                ended.append(exc)

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while len(got) < 5 and time.monotonic() < deadline and reader.is_alive():
            time.sleep(0.05)
        assert len(got) >= 5, ended
        dropped_at = time.monotonic()
        ssh_host.drop()  # a network cut mid-stream: every connection goes at once
        reader.join(30)
        assert not reader.is_alive(), "the stream hung after the forward dropped"
        assert time.monotonic() - dropped_at < 30
        assert ended and ended[0] is not None, "a cut stream must end with an error, not as complete"
        # The guard ended the server there; the command starts it again on a new connection.
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("http://"):
                break
        assert any("dropped: reconnecting (1/3)" in line for line in seen), seen
        assert seen[-1].strip() == f"http://127.0.0.1:{local}/v1"
        client = OpenAI(base_url=seen[-1].strip(), api_key="none", max_retries=0)
        reply = client.chat.completions.create(model=client.models.list().data[0].id,
                                               messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert reply.choices
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert ssh_host.wait_no_processes(timeout=40) == []
