"""gaudi-gui serve on this CPU: a real ``transformers serve`` child with the demo model, real HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from gaudi_gui.core import protocol
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.serve import engine_record_path, pick_free_port, port_free
from tests.helpers import children_get_sigint, lines_of


def _start(*args: str) -> tuple[subprocess.Popen[str], queue.Queue[str | None]]:
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = lines_of(proc.stdout)
    return proc, lines


def _wait_for(lines: queue.Queue[str | None], seen: list[str], want: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError(f"serve ended before {want!r}: {seen}")
        seen.append(line)
        if line.startswith(want):
            return line
    raise AssertionError(f"no {want!r} within {timeout} s: {seen}")


def _post(url: str, body: dict[str, object]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                      headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def test_serve_answers_over_http_and_stops_on_sigterm(demo_model: Path) -> None:
    from openai import OpenAI

    port = pick_free_port()
    proc, lines = _start("--model", "builtin:demo", "--port", str(port), "--device", "cpu", "--events")
    seen: list[str] = []
    try:
        url = _wait_for(lines, seen, "http://")
        assert url == f"http://127.0.0.1:{port}/v1"
        states = [m["state"] for line in seen if (m := protocol.decode(line)) and m["type"] == "serve_state"]
        assert states[:3] == ["starting", "loading", "ready"]
        client = OpenAI(base_url=url, api_key="none", max_retries=0)
        model = client.models.list().data[0].id
        assert model == str(demo_model)
        # Non-streaming: the model's own words and token counts.
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}],
                                               max_tokens=6)
        assert reply.choices[0].finish_reason in ("length", "stop")
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        # Streaming: chunks arrive one by one.
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=6, stream=True))
        assert len(chunks) >= 3 and chunks[-1].choices[0].finish_reason in ("length", "stop")
        # Two clients at once both get their answer.
        answers: list[int] = []

        def ask() -> None:
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5)
            answers.append(len(r.choices))

        threads = [threading.Thread(target=ask) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert answers == [1, 1]
        # A bad request: another model than the one served is refused, the server stays up.
        status, body = _post(f"{url}/chat/completions",
                             {"model": "someone/else", "messages": [{"role": "user", "content": "x"}]})
        assert status == 400 and b"pinned" in body
        assert client.models.list().data
        # The request log came from the engine's own access lines.
        deadline = time.monotonic() + 20
        requests: list[dict[str, object]] = []
        while len(requests) < 6 and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            message = protocol.decode(line)
            if message and message["type"] == "serve_request":
                requests.append(message)
        posts = [(r["path"], r["status"]) for r in requests if r["method"] == "POST"]
        assert posts.count(("/v1/chat/completions", 200)) == 4
        assert ("/v1/chat/completions", 400) in posts
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    rest: list[str] = []
    while (item := lines.get(timeout=5)) is not None:
        rest.append(item)
    assert code == 0
    ended = [protocol.decode(line) for line in rest]
    assert any(m is not None and m.get("state") == "stopped" for m in ended)
    assert port_free(port)
    assert not engine_record_path(port).exists()  # a clean stop leaves no record behind


def test_port_taken_is_one_line_exit_2(demo_model: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--model", "builtin:demo",
                               "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"gaudi-gui serve: --port: port {port} is already taken on 127.0.0.1; "
                                   "choose another")


def test_not_a_model_and_bad_input(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("no model here")
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--model", str(folder),
                           "--port", str(pick_free_port())], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "has no config.json: not a model folder" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--model", "m", "--listen-all"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "requires an API key" in done.stderr
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--model", "m", "--cards", "2;3"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--cards: takes card ids separated by commas" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_failed_start_shows_the_engines_last_lines(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    port = pick_free_port()
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--model", str(broken), "--port",
                           str(port), "--device", "cpu"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr
    assert "gaudi-gui serve: the server ended before it answered" in done.stderr
    assert "  | " in done.stderr  # the engine's own last lines follow
    assert port_free(port)


_ADAPTER_SCRIPT = """
import sys
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
base, out = sys.argv[1], sys.argv[2]
config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
model.save_pretrained(out)
AutoTokenizer.from_pretrained(base).save_pretrained(out)
"""


def test_lora_adapter_is_merged_then_served(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = tmp_path / "run" / "adapter"
    subprocess.run([sys.executable, "-c", _ADAPTER_SCRIPT, str(tiny_model_dir), str(adapter)], check=True,
                   capture_output=True, timeout=120)
    port = pick_free_port()
    proc, lines = _start("--model", str(tiny_model_dir), "--adapter", str(adapter), "--port", str(port),
                         "--device", "cpu")
    seen: list[str] = []
    try:
        url = _wait_for(lines, seen, "http://")
        assert any("merging the adapter into its base model first" in line for line in seen), seen
        status, body = _post(f"{url}/chat/completions",
                             {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert status == 200 and json.loads(body)["choices"]
        # The merged copy lives in a temporary folder while it is served.
        served = json.loads(urllib.request.urlopen(f"{url}/models", timeout=10).read())["data"][0]["id"]
        assert "gaudi-gui-serve-merged-" in served and Path(served).is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0
    assert not Path(served).exists()  # removed at stop


def _pump_stderr(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    return lines_of(proc.stderr)


def test_a_closed_stdout_ends_the_printing_not_the_server(demo_model: Path) -> None:
    """``gaudi-gui serve … | head -n 3``: the reader of stdout goes away after the first lines; the
    next request line must not end the server (it ended in a BrokenPipeError traceback)."""
    port = pick_free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "serve", "--model", "builtin:demo", "--port",
                             str(port), "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    errors = _pump_stderr(proc)
    try:
        assert proc.stdout is not None
        first: list[str] = []
        deadline = time.monotonic() + 180
        while not (first and first[-1].startswith("http://")) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"serve ended before its URL: {first}"
            first.append(line.rstrip("\n"))
        assert first[-1] == f"http://127.0.0.1:{port}/v1", first
        proc.stdout.close()  # as `head -n 3` does once it has its lines
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        status, _ = _post(f"{first[-1]}/chat/completions", body)
        assert status == 200
        # The request's line met the closed pipe: serve says once that it stopped printing.
        said: list[str] = []
        deadline = time.monotonic() + 60
        while not any("stdout was closed" in line for line in said) and time.monotonic() < deadline:
            try:
                got = errors.get(timeout=0.5)
            except queue.Empty:
                continue
            assert got is not None, f"serve ended: {said}"
            said.append(got)
        assert any("stdout was closed" in line for line in said), said
        assert not any("Traceback" in line for line in said), said
        # And it serves on.
        status, _ = _post(f"{first[-1]}/chat/completions", body)
        assert status == 200
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    rest: list[str] = []
    while (item := errors.get(timeout=5)) is not None:
        rest.append(item)
    assert code == 0, rest
    assert not any("Traceback" in line for line in rest), rest
    assert port_free(port)


def _gaudi_gui(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_a_plain_serve_is_a_run_of_the_agent_and_ctrl_c_stops_it(demo_model: Path) -> None:
    """``gaudi-gui serve …`` with no option is this machine's agent's job (issue 38): it has a run folder
    that ``runs list`` shows while it serves, the command prints what it always printed (the server's
    states, its URL, one line per request), and Ctrl-C (SIGINT to the command) stops it: the run is
    marked stopped, the command exits 0 (as the in-process serve does), the port is free."""
    port = pick_free_port()
    with children_get_sigint():  # its Ctrl-C is the stop, whoever started this test
        proc, lines = _start("--model", "builtin:demo", "--port", str(port), "--device", "cpu")
    errors = _pump_stderr(proc)
    seen: list[str] = []
    folder: Path | None = None
    try:
        url = _wait_for(lines, seen, "http://")
        assert url == f"http://127.0.0.1:{port}/v1", seen
        assert seen[0].startswith("run folder: ") and "through the agent" in seen[0], seen
        folder = Path(seen[0].removeprefix("run folder: ").split(" (", 1)[0])
        assert any(line.startswith("loading ") for line in seen), seen  # its states, in words
        listed = _gaudi_gui("runs", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        runs = {item["name"]: item for item in json.loads(listed.stdout)}
        assert folder.name in runs, runs
        assert (runs[folder.name]["kind"], runs[folder.name]["status"]["state"]) == ("serve", "running"), runs
        assert runs[folder.name]["endpoint"]["url"] == url, runs
        status, _ = _post(f"{url}/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 3})
        assert status == 200
        request = _wait_for(lines, seen, "", timeout=60)
        while "POST /v1/chat/completions 200" not in request:
            request = _wait_for(lines, seen, "", timeout=60)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if folder is not None and Run(folder).supervisor() is not None:
            _gaudi_gui("runs", "stop", str(folder), "--now")
    rest: list[str] = []
    while (item := errors.get(timeout=5)) is not None:
        rest.append(item)
    assert code == 0, rest
    assert any("stop requested" in line for line in rest), rest
    assert not any("Traceback" in line for line in rest), rest
    assert Run(folder).status().state == "stopped"
    assert port_free(port)
    listed = json.loads(_gaudi_gui("runs", "list", "--json").stdout)
    assert [(r["name"], r["status"]["state"]) for r in listed] == [(folder.name, "stopped")]


def test_an_agent_that_cannot_start_says_so_in_one_line(demo_model: Path, tmp_path: Path) -> None:
    """No agent can listen (its folder is not one): one line that says so and how to run without it;
    ``--no-agent`` still checks and refuses in this process, never asking for one."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "gaudi-gui").write_text("not a folder")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    done = _gaudi_gui("serve", "--model", "builtin:demo", "--port", str(pick_free_port()), env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("gaudi-gui serve: this machine's agent did not start: "), done.stderr
    assert done.stderr.rstrip().endswith("(or run it with --no-agent)"), done.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        refused = _gaudi_gui("serve", "--model", "builtin:demo", "--port", str(port), "--no-agent", env=env)
    assert refused.returncode == 2 and "is already taken" in refused.stderr, refused.stderr


def _engine_of(seen: list[str]) -> psutil.Process:
    """The engine process, from the "loading" event that names its pid."""
    for line in seen:
        message = protocol.decode(line)
        if message and message.get("state") == "loading" and message.get("pid"):
            return psutil.Process(int(message["pid"]))
    raise AssertionError(f"no loading event with the engine's pid: {seen}")


def _wait_gone(procs: list[psutil.Process], port: int, timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running once all ended and the port is free, or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    left = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    while (left or not port_free(port)) and time.monotonic() < deadline:
        _gone, left = psutil.wait_procs(left, timeout=0.2)
    return [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.resume()
            p.kill()
    psutil.wait_procs(procs, timeout=10)


def test_sigkill_of_serve_ends_its_engine(demo_model: Path) -> None:
    """The engine must not outlive its owner unseen: a SIGKILLed ``gaudi-gui serve`` (nothing of it
    runs to clean up) leaves no engine serving and holding the port."""
    port = pick_free_port()
    proc, lines = _start("--model", "builtin:demo", "--port", str(port), "--device", "cpu", "--events")
    seen: list[str] = []
    engine_tree: list[psutil.Process] = []
    try:
        _wait_for(lines, seen, "http://")
        engine = _engine_of(seen)
        engine_tree = [engine, *engine.children(recursive=True)]
        # While it serves, the engine is recorded with its owner (each with its create time).
        record = json.loads(engine_record_path(port).read_text())
        assert (record["process"]["pid"], record["owner"]["pid"]) == (engine.pid, proc.pid)
        assert record["process"]["create_time"] == pytest.approx(engine.create_time(), abs=0.05)
        proc.kill()
        proc.wait(30)
        left = _wait_gone(engine_tree, port, timeout=60)
        assert not left, f"the engine outlived its killed owner: {[p.cmdline()[:3] for p in left]}"
        assert port_free(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill_all(engine_tree)


def test_an_orphan_engine_is_named_by_the_next_serve_and_stopped(demo_model: Path) -> None:
    """An engine that did not end with its owner (here: stopped, so it cannot handle the signal its
    owner's death sent) is recorded: the next serve on its port names it and how to stop it, and
    ``serve --stop-orphan`` ends it and frees the port."""
    port = pick_free_port()
    proc, lines = _start("--model", "builtin:demo", "--port", str(port), "--device", "cpu", "--events")
    seen: list[str] = []
    engine_tree: list[psutil.Process] = []
    try:
        _wait_for(lines, seen, "http://")
        engine = _engine_of(seen)
        engine_tree = [engine, *engine.children(recursive=True)]
        engine.suspend()  # a hung engine: it handles no signal but SIGKILL
        proc.kill()
        proc.wait(30)
        assert engine.is_running() and not port_free(port)
        again = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--model", "builtin:demo",
                                "--port", str(port), "--device", "cpu"], capture_output=True, text=True,
                               timeout=60)
        assert again.returncode == 2, again.stderr
        assert (f"port {port} is held by an earlier gaudi-gui serve engine (pid {engine.pid}, model "
                f"{demo_model}) whose owner is gone") in again.stderr, again.stderr
        assert f"gaudi-gui serve --stop-orphan --port {port}" in again.stderr, again.stderr
        stop = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--stop-orphan", "--port",
                               str(port)], capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
        assert f"stopped the engine (pid {engine.pid}, model {demo_model})" in stop.stdout, stop.stdout
        assert f"port {port} is free" in stop.stdout, stop.stdout
        assert not _wait_gone(engine_tree, port, timeout=30)
        assert port_free(port)
        # Nothing is left to stop: said, and not an error.
        nothing = subprocess.run([sys.executable, "-m", "gaudi_gui", "serve", "--stop-orphan", "--port",
                                  str(port)], capture_output=True, text=True, timeout=60)
        assert nothing.returncode == 0, nothing.stderr
        assert "no engine of an earlier gaudi-gui serve" in nothing.stdout, nothing.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill_all(engine_tree)
