"""``gaudi-gui serve --host`` without ``--detach`` (issue 26: one door): the host's own ``serve --detach``
(its supervisor and run folder are the host's), followed here through the one relay (``runs follow``
over ssh) and reached through the forwarded port. Ctrl+C stops it there and frees the port here; a
dropped connection or a killed client leaves it serving there (before: the guard ended it)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gaudi_gui.core import protocol
from gaudi_gui.core.serve import pick_free_port, port_free
from tests.helpers import children_get_sigint, lines_of
from tests.remote.conftest import SshHost


def _serve_folder(ssh_host: SshHost) -> Path:
    """The one serve run folder in the host's runs store."""
    folders = [p.parent for p in ssh_host.runs_dir.glob("*/spec.json")
               if json.loads(p.read_text()).get("kind") == "serve"]
    assert len(folders) == 1, folders
    return folders[0]


def _status(folder: Path) -> dict:
    return json.loads((folder / "status.json").read_text())


def test_serve_on_a_host_through_the_forward_and_ctrl_c_stops_it_there(ssh_host: SshHost,
                                                                         demo_model: Path) -> None:
    from openai import OpenAI

    local, remote = pick_free_port(), pick_free_port()
    with children_get_sigint():  # its Ctrl-C (SIGINT) stops the server there
        proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "serve", "--host", ssh_host.dest,
                                 "--model", "builtin:demo", "--device", "cpu", "--port", str(local),
                                 "--remote-port", str(remote), "--events"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ))
    lines = lines_of(proc.stdout)
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
        server = [line for line in ssh_host.command_lines() if "serve" in line and "transformers" in line]
        assert server and str(remote) in server[0]
        assert "127.0.0.1" in server[0].split()
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
        # The job is the host's: a run folder of kind serve there, running under its supervisor.
        folder = _serve_folder(ssh_host)
        assert folder.parent == ssh_host.runs_dir and _status(folder)["state"] == "running"
        said = [protocol.decode(line) or {} for line in seen]
        assert any(m.get("folder") == str(folder) for m in said), seen
        proc.send_signal(signal.SIGINT)  # Ctrl+C: the server is stopped there, the port freed here
        code = proc.wait(90)
        rest = ""
        while (line := lines.get(timeout=30)) is not None:  # what the pump read to the end
            rest += line + "\n"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    ended_lines = [protocol.decode(line) for line in rest.splitlines()]
    stopped_states = [m for m in ended_lines if m is not None and m["type"] == "serve_state"]
    assert stopped_states and stopped_states[-1]["state"] == "stopped", rest
    assert f"port {local} here is free" in stopped_states[-1]["message"]
    assert port_free(local)
    assert ssh_host.wait_no_processes(timeout=40) == []
    status = _status(folder)
    assert (status["kind"], status["state"]) == ("serve", "stopped"), status


def test_a_dropped_connection_leaves_the_server_serving_and_the_endpoint_answers_again(
        ssh_host: SshHost, demo_model: Path) -> None:
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
        folder = _serve_folder(ssh_host)
        engine = json.loads((folder / "endpoint.json").read_text())["pid"]
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
        ssh_host.drop()  # a network cut mid-stream: every connection goes at once
        reader.join(60)
        assert not reader.is_alive(), "the stream hung after the forward dropped"
        assert ended and ended[0] is not None, "a cut stream must end with an error, not as complete"
        # The server goes on there (the same engine, not started again); the follow reconnects and
        # the forward is asked for again: the same URL answers.
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            for x in proc.stdout or []:
                lines.put(x)

        threading.Thread(target=pump, daemon=True).start()
        client = OpenAI(base_url=f"http://127.0.0.1:{local}/v1", api_key="none", max_retries=0, timeout=10)
        while True:  # no upper bound here: pytest-timeout has the last word
            try:
                model = client.models.list().data[0].id
                break
            except Exception:
                time.sleep(0.5)
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3)
        assert reply.choices
        assert json.loads((folder / "endpoint.json").read_text())["pid"] == engine
        assert _status(folder)["state"] == "running"
        said = "".join(seen) + "".join(lines.queue)
        assert "reconnecting" in said, said
        # Killed here without a word: the server still goes on there, until runs stop ends it.
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert _status(folder)["state"] == "running"
        stop = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--host", ssh_host.dest, "stop",
                               folder.name], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=120)
        assert stop.returncode == 0, stop.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert ssh_host.wait_no_processes(timeout=60) == []
    assert _status(folder)["state"] == "stopped"


def test_the_api_key_crosses_to_the_hosts_detached_serve_by_name_never_on_its_command_line(
        ssh_host: SshHost) -> None:
    """``--api-key-env NAME`` on a host: the key reaches the host's ``serve --detach`` (as the guard's
    checked ``--env``), so the host's own serve decides on it: here that ``transformers serve`` takes no
    key (exit 2, its sentence), not that the variable is unset there; the key is in no file there."""
    key = "sk-test-0123456789abcdefghij"
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--host", ssh_host.dest, "--model",
                           "builtin:demo", "--device", "cpu", "--engine", "transformers", "--port",
                           str(pick_free_port()), "--api-key-env", "GG_TEST_KEY"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180,
                          env={**os.environ, "GG_TEST_KEY": key})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "transformers serve takes no API key" in done.stderr, done.stderr
    folder = _serve_folder(ssh_host)
    assert _status(folder)["state"] == "failed"
    assert not any(key in p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())
    assert ssh_host.wait_no_processes(timeout=40) == []
