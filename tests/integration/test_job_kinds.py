"""Serve and Evaluate are jobs like training (issue 26): ``--detach`` returns at once, a supervisor owns a
run folder of their kind in the runs store, ``runs list``/``runs show`` name the kind, ``runs follow``
streams them and ``runs stop`` ends them. Real children, the demo model, real HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gaudi_gui.core import jobkind
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.serve import pick_free_port, port_free


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=timeout)


def wait_until(check: Callable[[], Any], what: str, run: Run | None = None) -> Any:
    """Poll ``check`` until it gives something true (no upper bound: pytest-timeout has the last word)."""
    while True:
        value = check()
        if value:
            return value
        if run is not None and run.status().state in ("failed", "killed"):
            raise AssertionError(f"{what}: the job ended: {run.status()} {run.log_tail(20)}")
        time.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def test_serve_detached_answers_is_listed_as_serve_and_runs_stop_frees_the_port(demo_model: Path) -> None:
    port = pick_free_port()
    done = _cli("serve", "--model", "builtin:demo", "--port", str(port), "--device", "cpu", "--detach",
                "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    run = Run(info["folder"])
    assert info["kind"] == "serve" and run.kind == "serve"
    supervisor = psutil.Process(info["pid"])
    endpoint = wait_until(lambda: jobkind.endpoint(run), "the endpoint", run)
    assert endpoint["url"] == f"http://127.0.0.1:{port}/v1" and endpoint["port"] == port
    engine = psutil.Process(endpoint["pid"])
    assert _answers(endpoint["url"])
    # A few real requests (one streamed): the meter counts exactly the tokens their usage says.
    from openai import OpenAI
    client, model = OpenAI(base_url=endpoint["url"], api_key="none", max_retries=0), endpoint["model"]
    usage = [client.chat.completions.create(messages=[{"role": "user", "content": "hello"}], model=model,
                                            max_tokens=n).usage for n in (5, 7)]
    streamed = list(client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], model=model, max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    usage.append(streamed[-1].usage)
    assert all(u is not None for u in usage)
    generated = sum(u.completion_tokens for u in usage if u is not None)
    prompts = sum(u.prompt_tokens for u in usage if u is not None)
    assert "serve" in json.loads((run.folder / jobkind.SPEC_NAME).read_text())["argv"]
    assert run.status().state == "running" and run.status().kind == "serve"
    wait_until((run.folder / jobkind.REQUESTS_NAME).is_file, "a request in requests.jsonl", run)
    listed = json.loads(_cli("runs", "list", "--json").stdout)
    assert [(r["name"], r["kind"]) for r in listed] == [(run.name, "serve")]
    assert f"{run.name}  serve" in _cli("runs", "list").stdout
    assert "(serve): running" in _cli("runs", "show", run.name).stdout
    stop = _cli("runs", "stop", run.name)
    assert stop.returncode == 0, stop.stderr
    wait_until(lambda: not supervisor.is_running() or supervisor.status() == psutil.STATUS_ZOMBIE,
               "the supervisor's end")
    assert not engine.is_running() or engine.status() == psutil.STATUS_ZOMBIE
    assert port_free(port)
    status = run.status()
    assert status.state == "stopped" and "is free" in status.summary, status
    # transformers serve's own count (workers/transformers_serve), the last of it written at the stop.
    shown = json.loads(_cli("runs", "show", run.name, "--json").stdout)
    meter = shown["meter"]
    assert (meter["generated_tokens"], meter["prompt_tokens"]) == (generated, prompts), meter
    assert meter["tokens_source"].startswith("the engine's own count")
    assert meter["tokens_per_s"] == pytest.approx(generated / meter["wall_s"], rel=0.01, abs=1e-3)
    assert f"{generated} tokens generated" in status.summary, status
    if meter["energy_j"] is None:  # this CPU: no readable RAPL counter
        assert meter["energy_per_1k_tokens_wh"] is None
        assert meter["per_1k_tokens_note"] == "energy not measured"
        assert "RAPL" in meter["note"], meter
    else:
        assert meter["energy_per_1k_tokens_wh"] == pytest.approx(
            meter["energy_j"] / 3600 / generated * 1000, rel=1e-6)
    tokens = [e for e in run.events() if e["type"] == "serve_tokens"]
    assert tokens[0]["completion_tokens"] == 0 and tokens[-1]["completion_tokens"] == generated


def test_serve_engine_dies_with_its_supervisor(demo_model: Path) -> None:
    port = pick_free_port()
    done = _cli("serve", "--model", "builtin:demo", "--port", str(port), "--device", "cpu", "--detach",
                "--json")
    info = json.loads(done.stdout.strip().splitlines()[-1])
    run = Run(info["folder"])
    endpoint = wait_until(lambda: jobkind.endpoint(run), "the endpoint", run)
    engine = psutil.Process(endpoint["pid"])
    psutil.Process(info["pid"]).kill()
    wait_until(lambda: not engine.is_running() or engine.status() == psutil.STATUS_ZOMBIE, "the engine's end")
    wait_until(lambda: port_free(port), "the port freed")
    # The serve command ends a moment after its engine; then every reader tells the run as killed.
    wait_until(lambda: run.reconcile().state == "killed", "the run told as killed")
    assert run.status().state == "running"  # nobody wrote it: its one writer is gone


def test_eval_detached_leaves_its_results_in_its_run_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The learning rate\nA model\n")
    os.chdir(tmp_path)  # a relative path is made absolute before the job leaves for the background
    done = _cli("eval", "--model", str(tiny_model_dir), "--base", str(tiny_model_dir), "--prompts",
                "prompts.txt", "--max-new-tokens", "4", "--metrics", "exact_match", "--detach", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    run = Run(info["folder"])
    assert run.kind == "eval"
    follow = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "follow", run.name],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL)
    lines = [json.loads(line) for line in follow.stdout.splitlines()]
    types = [m["event"]["type"] for m in lines if m["t"] == "event"]
    assert "progress" in types and "result" in types
    assert lines[-1]["t"] == "end" and lines[-1]["status"]["state"] == "finished"
    result = json.loads((run.folder / jobkind.RESULT_NAME).read_text())
    assert Path(result["path"]).is_file() and result["rows"]["prompts"] == 2
    status = run.status()
    assert (status.kind, status.state) == ("eval", "finished"), status
    assert status.step == status.max_steps > 0, status
    assert "eval" in _cli("runs", "list").stdout


def test_a_bad_serve_input_is_refused_before_anything_detaches(tmp_path: Path) -> None:
    done = _cli("serve", "--model", str(tmp_path / "nothing"), "--port", "0", "--detach")
    assert done.returncode == 2 and "--port" in done.stderr
    assert _cli("runs", "list", "--json").stdout.strip() == "[]"


@pytest.fixture(autouse=True)
def _home_cwd() -> Any:
    cwd = os.getcwd()
    yield
    os.chdir(cwd)



def _detached_demo_server() -> tuple[Run, dict[str, Any], int]:
    port = pick_free_port()
    done = _cli("serve", "--model", "builtin:demo", "--port", str(port), "--device", "cpu", "--detach",
                "--json")
    assert done.returncode == 0, done.stderr
    run = Run(json.loads(done.stdout.strip().splitlines()[-1])["folder"])
    return run, wait_until(lambda: jobkind.endpoint(run), "the endpoint", run), port


def _stopped(run: Run, port: int) -> None:
    """The server stopped, whatever the test found (nothing of it outlives the test)."""
    if run.status().state not in ("stopped", "failed", "killed", "finished"):
        _cli("runs", "stop", run.name)
    wait_until(lambda: run.status().state in ("stopped", "failed", "killed", "finished"), "the server's end")
    wait_until(lambda: port_free(port), "the port freed")


def _post(port: int, body: Any) -> tuple[int, str]:
    import http.client
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read().decode()


def test_a_malformed_request_gets_a_400_and_the_server_is_named_as_chosen(demo_model: Path) -> None:
    """Issue 37, items 7 and 13: a request with ``"messages": "hello"`` got a bare 500 from the server
    (transformers serve indexes what it never checked): now a 400 saying what is wrong, and the
    server stays up. And a server of builtin:demo is named so in its run (was its cache folder)."""
    run, endpoint, port = _detached_demo_server()
    try:
        status, text = _post(port, {"messages": "hello", "max_tokens": 4})
        assert status == 400 and "messages must be a non-empty list" in text, (status, text)
        status, text = _post(port, {"messages": [{"role": "user", "content": 3}], "max_tokens": 4})
        assert status == 400 and "messages[0].content" in text, (status, text)
        status, text = _post(port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"})
        assert status == 400 and "max_tokens" in text, (status, text)
        assert _post(port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})[0] == 200
        assert endpoint.get("name") == "builtin:demo", endpoint
        assert run.status().summary.startswith(f"Serving builtin:demo at {endpoint['url']}"), run.status()
    finally:
        _stopped(run, port)


def test_a_stopped_server_tells_its_streaming_client_it_was_stopped(demo_model: Path) -> None:
    """Issue 37, item 7: a client streaming an answer when the server was stopped read "The model's
    process crashed (exit code -15)"; now "The server was stopped". ``runs stop`` said "the ranks save
    a checkpoint" of a server: now what stopping a server does."""
    import http.client
    import threading

    run, _endpoint, port = _detached_demo_server()
    lines: list[str] = []
    first = threading.Event()

    def stream() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        connection.request("POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 100_000, "stream": True}),
            {"Content-Type": "application/json"})
        response = connection.getresponse()
        try:
            for raw in response:
                lines.append(raw.decode(errors="replace"))
                if '"content"' in lines[-1]:
                    first.set()
        except (OSError, http.client.HTTPException):
            pass  # the connection closed under the stream: what came before it is what is checked
        first.set()

    try:
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert first.wait(120), lines
        stop = _cli("runs", "stop", run.name)
        assert stop.returncode == 0, stop.stderr
        reader.join(60)
        assert not reader.is_alive()
        said = "".join(lines)
        assert "crashed" not in said, said[-500:]
        assert "The server was stopped" in said, said[-500:]
        assert "stop requested: the server ends its engine" in stop.stdout, stop.stdout
        assert "checkpoint" not in stop.stdout
        wait_until(lambda: run.status().state in ("stopped", "failed", "killed"), "the server's end")
        assert run.status().state == "stopped", run.status()
    finally:
        _stopped(run, port)
