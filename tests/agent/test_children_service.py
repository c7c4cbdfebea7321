"""The agent's interactive children (agent/children.py): a real generate worker on the tiny model,
started, spoken to, streamed and stopped through the agent; a crashing child's end; the window's
``AgentChild`` streaming a generation while the window process has no child of its own; the refusals
of a run on several hosts' children."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.agent import children
from gaudi_gui.core import generation
from gaudi_gui.core.agentwire import AgentError, Connection, Ev
from gaudi_gui.core.generation import GenerationParams, LoadOptions
from gaudi_gui.services.agent_child import EXIT_FAILED_TO_START, EXIT_NORMAL, AgentChild


def _until(conn: Connection, child_id: str, want: Any, timeout: float = 120) -> list[dict[str, Any]]:
    """Messages of ``child_id`` until ``want(event)`` holds for one event (returned with them)."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    for event in conn.stream(timeout=5):
        assert event["ev"] == Ev.OUTPUT.value and event["child_id"] == child_id
        seen.append(event)
        if want(event):
            return seen
        assert time.monotonic() < deadline, f"nothing wanted in {timeout} s: {seen[-3:]}"
    raise AssertionError(f"the stream went quiet: {seen[-3:]}")


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [m.get("type", "") for e in events for m in e.get("messages") or []]


def test_a_generate_worker_streams_through_the_agent_and_stops_mid_answer(demo_model: Path) -> None:
    with Connection.open() as conn:
        child_id = conn.request("child.start", kind="generate", args={})["child_id"]
        _until(conn, child_id, lambda e: "ready" in _types([e]))
        conn.request("child.send", child_id=child_id, message=generation.load_command(LoadOptions()))
        _until(conn, child_id, lambda e: "loaded" in _types([e]))
        params = GenerationParams(do_sample=False, max_new_tokens=4000, min_new_tokens=4000)
        conn.request("child.send", child_id=child_id,
                     message=generation.generate_command(params, prompt="The model", request_id=1))
        tokens = _until(conn, child_id, lambda e: _types([e]).count("token") > 0)
        assert f"generate child {child_id}" in " ".join(conn.request("status")["busy"])
        conn.request("child.stop", child_id=child_id, grace_s=5)
        ended = _until(conn, child_id, lambda e: "end" in e)
        end = ended[-1]["end"]
        assert end["stopped"] is True and end["exit_code"] in (0, -15, -9), end
        assert "finished" not in _types(tokens + ended)  # stopped mid-answer, not at its end
        assert conn.request("child.list")["children"] == []
        with pytest.raises(AgentError, match="no running child"):
            conn.request("child.send", child_id=child_id, message="x")


def test_a_crashing_child_ends_with_its_exit_status_and_tail(tmp_path: Path) -> None:
    crash = tmp_path / "crash"
    crash.write_text("#!/bin/sh\necho 'loading…' >&2\necho 'Traceback: it broke' >&2\nexit 3\n")
    crash.chmod(0o755)
    with Connection.open() as conn:
        child_id = conn.request("child.start", kind="probe", args={"python": str(crash)})["child_id"]
        end = _until(conn, child_id, lambda e: "end" in e)[-1]["end"]
        assert end == {"exit_code": 3, "status": "exited", "stopped": False,
                       "tail": ["loading…", "Traceback: it broke"]}
        with pytest.raises(AgentError, match="no such child kind: 'sh'"):
            conn.request("child.start", kind="sh", args={"command": "rm -rf /"})
        with pytest.raises(AgentError, match="absolute path"):
            conn.request("child.start", kind="probe", args={"python": "sh"})


def test_the_window_streams_a_generation_with_no_child_of_its_own(qtbot: QtBot, demo_model: Path) -> None:
    # (What the worker already had, such as a session's Slurm daemons, is not this test's.)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    child = AgentChild()
    messages: list[dict[str, Any]] = []
    child.message_received.connect(messages.append)
    ended: list[tuple[int, str]] = []
    child.finished.connect(lambda code, status: ended.append((code, status)))
    child.start("generate", {})
    child.write_line(generation.load_command(LoadOptions()))
    qtbot.waitUntil(lambda: any(m.get("type") == "loaded" for m in messages), timeout=120_000)
    params = GenerationParams(do_sample=False, max_new_tokens=2000, min_new_tokens=2000)
    child.write_line(generation.generate_command(params, prompt="The model", request_id=1))
    qtbot.waitUntil(lambda: sum(m.get("type") == "token" for m in messages) >= 3, timeout=60_000)
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    assert child.pid > 0 and psutil.Process(child.pid).is_running()
    child.write_line(generation.shutdown_command())
    child.close_stdin()
    qtbot.waitUntil(lambda: bool(ended), timeout=60_000)
    assert ended[0][1] == EXIT_NORMAL

    failed: list[str] = []
    child.error_occurred.connect(failed.append)
    child.start("nonsense", {})
    qtbot.waitUntil(lambda: len(ended) == 2, timeout=10_000)
    assert ended[1] == (-1, EXIT_FAILED_TO_START) and "no such child kind" in failed[0]


def test_the_hosts_children_take_a_destination_and_setup_options_only() -> None:
    """``ssh_config`` (``ssh -G``) and ``host_setup`` (``hosts --setup``), the Hosts tab's children: a
    destination that would be an option, and any option ``hosts --setup`` does not take, are refused
    before anything starts; ``ssh -G`` of a good one answers without connecting."""
    with Connection.open() as conn:
        for kind, args, words in (
                ("ssh_config", {"dest": "-oProxyCommand=touch /tmp/x"}, "cannot begin with '-'"),
                ("ssh_config", {"dest": "a b"}, "not an SSH destination"),
                ("host_setup", {"dest": "-x"}, "cannot begin with '-'"),
                ("host_setup", {"dest": "gg-a", "options": ["--remote-command", "rm -rf ~"]},
                 "'--remote-command' is not one of --venv, --python, --no-deps"),
                ("host_setup", {"dest": "gg-a", "options": ["--venv"]}, "--venv needs a value")):
            with pytest.raises(AgentError, match=words):
                conn.request("child.start", kind=kind, args=args)
        child_id = conn.request("child.start", kind="ssh_config", args={"dest": "user@gg-nowhere:2222"})[
            "child_id"]
        seen = _until(conn, child_id, lambda e: "end" in e, timeout=30)
        lines = [m.get("line", "") for e in seen for m in e.get("messages") or []]
        assert seen[-1]["end"]["exit_code"] == 0 and "hostname gg-nowhere" in lines and "port 2222" in lines


def test_a_child_whose_helper_holds_its_output_still_ends(tmp_path: Path) -> None:
    """A child that exits while a helper it started in a session of its own holds its stdout on: its
    end is said (within seconds, not when the helper ends), with what it printed; the helper is not the
    agent's to kill (it was not stopped)."""
    pid_file = tmp_path / "helper.pid"
    script = tmp_path / "leaves_a_helper"
    script.write_text(f"#!/bin/sh\nsetsid sleep 600 &\necho $! > {pid_file}\necho 'bye'\nexit 0\n")
    script.chmod(0o755)
    try:
        with Connection.open() as conn:
            started = time.monotonic()
            child_id = conn.request("child.start", kind="probe", args={"python": str(script)})["child_id"]
            seen = _until(conn, child_id, lambda e: "end" in e, timeout=30)
            took = time.monotonic() - started
            end = seen[-1]["end"]
            assert end["exit_code"] == 0 and took < 15, (end, took)
            assert "bye" in end["tail"] and "no longer read" in end["tail"][-1]
            assert conn.request("child.list")["children"] == []
    finally:
        if pid_file.exists():
            with contextlib.suppress(psutil.Error):
                psutil.Process(int(pid_file.read_text())).kill()


def test_a_run_on_several_hosts_children_refuse_bad_arguments_and_build_their_argv() -> None:
    """``hosts_preflight`` and ``keep_job_meter`` (the Training tab's pre-flight of a run on several hosts
    and its whole job meter kept): what is not theirs to run is refused before anything starts; what is
    is one argument per value, the job and the meter in temporary files the child's end deletes."""
    hosts = [{"name": "gg-a", "remote_command": "py -m gaudi_gui"}, {"name": "gg-b", "remote_command": ""}]
    preflight = {"hosts": hosts, "job": {"model": "builtin:demo"}, "port": 29500}
    keep = {"host": "gg-a", "remote_command": "py -m gaudi_gui", "folder": "/r/run-1", "meter": {"parts": []}}
    refused = [
        ("hosts_preflight", {**preflight, "hosts": hosts[:1]}, "two or more"),
        ("hosts_preflight", {**preflight, "hosts": "gg-a,gg-b"}, "two or more"),
        ("hosts_preflight", {**preflight, "hosts": [hosts[0], {"name": "gg-b,gg-c"}]}, "each host's name"),
        ("hosts_preflight", {**preflight, "hosts": [hosts[0], {"name": "gg-b=x"}]}, "each host's name"),
        ("hosts_preflight", {**preflight, "hosts": [hosts[0], {"name": ""}]}, "each host's name"),
        ("hosts_preflight", {**preflight, "hosts": [hosts[0], {"name": "gg-b", "remote_command": "py\nrm"}]},
         "one line"),
        ("hosts_preflight", {**preflight, "job": "{}"}, "needs job"),
        ("hosts_preflight", {**preflight, "port": 0}, "needs port"),
        ("hosts_preflight", {**preflight, "port": "29500"}, "needs port"),
        ("hosts_preflight", {**preflight, "port": True}, "needs port"),
        ("keep_job_meter", {**keep, "host": ""}, "each host's name"),
        ("keep_job_meter", {**keep, "host": "gg-a,gg-b"}, "each host's name"),
        ("keep_job_meter", {**keep, "folder": "run-1"}, "absolute path"),
        ("keep_job_meter", {**keep, "folder": ""}, "absolute path"),
        ("keep_job_meter", {**keep, "meter": None}, "needs meter"),
        ("keep_job_meter", {**keep, "meter": "[]"}, "needs meter"),
        ("keep_job_meter", {**keep, "remote_command": "py\nrm -rf /"}, "one line"),
    ]
    with Connection.open() as conn:
        for kind, args, needle in refused:
            with pytest.raises(AgentError, match=needle):
                conn.request("child.start", kind=kind, args=args)
        assert conn.request("child.list")["children"] == []

    spec = children.KINDS["hosts_preflight"]({**preflight, "main_ip": "10.0.0.1"})
    try:
        assert spec.argv[1:] == ["-m", "gaudi_gui", "hosts", "--preflight=gg-a,gg-b", "--port=29500",
                                 "--json", "--host-command=gg-a=py -m gaudi_gui", "--main-ip=10.0.0.1",
                                 f"--config={spec.files[0]}"]
        assert json.loads(Path(spec.files[0]).read_text()) == {"model": "builtin:demo"}
    finally:
        Path(spec.files[0]).unlink()
    spec = children.KINDS["keep_job_meter"](keep)
    try:
        assert spec.argv[1:] == ["-m", "gaudi_gui", "hosts", "--host=gg-a",
                                 "--remote-command=py -m gaudi_gui", "--keep-job-meter=/r/run-1",
                                 f"--meter={spec.files[0]}", "--json"]
        assert json.loads(Path(spec.files[0]).read_text()) == {"parts": []}
    finally:
        Path(spec.files[0]).unlink()
