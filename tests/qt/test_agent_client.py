"""The window's connection to the agent: it starts the agent when none answers, asks and hears on the
event loop (never waiting), and comes back by itself, subscriptions included, when the agent dies."""

from __future__ import annotations

import functools
import os
import signal
import sys
import time

import psutil
import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.core import agentwire
from gaudi_gui.core.runstore import Run
from gaudi_gui.services.agent_client import AgentClient
from gaudi_gui.services.context import AppServices
from gaudi_gui.services.jobs import ActiveJob, JobRegistry, close_question
from tests.fake_hub import FakeHub, FakeRepo


def test_the_window_starts_the_agent_asks_it_and_reconnects_after_it_is_killed(qtbot: QtBot) -> None:
    services = AppServices.__new__(AppServices)
    services.agent = None
    services.jobs = JobRegistry()
    client = services.ensure_agent()
    try:
        qtbot.waitUntil(lambda: client.state == "up" and bool(client.agent.get("pid")), timeout=30000)
        first = int(client.agent["pid"])
        # The agent is not the window's child: the window process starts none.
        assert first not in [p.pid for p in psutil.Process().children(recursive=True)]
        replies: list[dict] = []
        client.request("status", replies.append)
        qtbot.waitUntil(lambda: bool(replies), timeout=10000)
        assert replies[0]["ok"] and [c["client"] for c in replies[0]["clients"]] == ["window"]
        notices: list[dict] = []
        client.subscribe(agentwire.Ev.NOTICE, notices.append)
        states: list[str] = []
        client.state_changed.connect(lambda state, words: states.append(state))
        os.kill(first, signal.SIGKILL)
        qtbot.waitUntil(lambda: client.state == "up" and int(client.agent.get("pid", first)) != first,
                        timeout=30000)
        assert "connecting" in states
        again: list[dict] = []
        client.request("status", again.append)
        qtbot.waitUntil(lambda: bool(again), timeout=10000)
        # The subscription was made again on the new agent.
        assert again[0]["clients"][0]["subscribed"] == ["job", "notice"]  # the close dialog's jobs too
    finally:
        client.close()


def test_a_request_made_before_the_agent_answers_waits_and_is_answered(qtbot: QtBot) -> None:
    client = AgentClient(starter=agentwire.spawn)
    try:
        replies: list[dict] = []
        client.request("ping", replies.append)
        client.start()
        qtbot.waitUntil(lambda: bool(replies), timeout=30000)
        assert replies[0]["ok"]
        refused: list[dict] = []
        client.request("bogus", refused.append)
        qtbot.waitUntil(lambda: bool(refused), timeout=10000)
        assert not refused[0]["ok"] and "bogus" in refused[0]["error"]
    finally:
        client.close()


def test_the_close_dialog_lists_and_stops_the_agents_jobs(qtbot: QtBot, fake_hub: FakeHub,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A job the agent runs (started by another client: the command line) is in the close dialog's
    list, and its Stop asks the agent, which stops it."""
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "300")
    fake_hub.repos["org/slow"] = FakeRepo(files={"config.json": b"{}", "model.bin": os.urandom(1_000_000)})
    fake_hub.stall("org/slow", "model.bin", times=20)
    with agentwire.Connection.open() as conn:
        job = conn.request("job.start", timeout=120, kind="download", job={"args": ["org/slow"]})["job"]
    services = AppServices.__new__(AppServices)
    services.agent = None
    services.jobs = JobRegistry()
    client = services.ensure_agent()
    try:
        (owner,) = services.jobs.owners()
        qtbot.waitUntil(lambda: bool(owner.active_jobs()), timeout=30000)
        (line,) = owner.active_jobs()
        assert line.startswith(f"download {job['job_id']}")
        assert line in close_question([ActiveJob(line, owner.outlives_window)])
        owner.stop_jobs()
        qtbot.waitUntil(lambda: not owner.active_jobs(), timeout=60000)
        assert Run(job["folder"]).status().state == "stopped"
        owner.shutdown()
    finally:
        client.close()


def test_the_window_starts_the_agent_without_waiting_for_its_starter(qtbot: QtBot,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38, "the window never waits": the starter ``agent --daemon`` is an interpreter that ends
    right after it forked the agent; the window's client returns at once (a 2 s starter here), keeps
    connecting, and reaps the starter once it ended (no zombie, no child left)."""
    real = agentwire.agent_argv()
    slow = [sys.executable, "-c", "import os, sys, time; time.sleep(2); os.execv(sys.argv[1], sys.argv[1:])",
            *real]
    monkeypatch.setattr(agentwire, "agent_argv", lambda: slow)
    client = AgentClient(starter=functools.partial(agentwire.spawn, wait=False))
    try:
        began = time.monotonic()
        client.start()
        assert time.monotonic() - began < 1.0, "the window waited for the agent's starter"
        starter = psutil.Process(agentwire._STARTED[0].pid)
        assert starter.ppid() == os.getpid() and starter.is_running()
        qtbot.waitUntil(lambda: client.state == "up", timeout=60_000)
        qtbot.waitUntil(lambda: agentwire.reap_started() == 0, timeout=30_000)
        assert starter.pid not in [p.pid for p in psutil.Process().children()]  # reaped: no zombie
    finally:
        client.close()


def test_a_subscription_made_while_connecting_is_sent_once(qtbot: QtBot, fake_hub: FakeHub) -> None:
    """A view that subscribes before the agent answered (the window's first paint) hears a job's history
    once: the subscription is sent once, in its place among the requests that waited, not a second time
    with the re-subscriptions a reconnect makes (which a new agent needs, and gets once)."""
    fake_hub.repos["org/small"] = FakeRepo(files={"config.json": b"{}"})
    with agentwire.Connection.open() as conn:
        job = conn.request("job.start", timeout=120, kind="download", job={"args": ["org/small"]})["job"]
        deadline = time.monotonic() + 60
        while any(j["job_id"] == job["job_id"] for j in conn.request("jobs.list")["jobs"]):  # running ones
            assert time.monotonic() < deadline, "the download did not end"
            time.sleep(0.2)  # polling the agent's own word on a job that ends within seconds
    client = AgentClient(starter=agentwire.spawn)
    heard: list[dict] = []
    batches: list[list[str]] = []
    try:
        client.subscribe(agentwire.Ev.LOG, lambda m: batches.append(list(m.get("lines") or [])),
                         key=job["job_id"])
        client.subscribe(agentwire.Ev.JOB, heard.append, key=job["job_id"])
        client.start()
        qtbot.waitUntil(lambda: bool(heard) and bool(batches), timeout=30000)
        replies: list[dict] = []
        client.request("ping", replies.append)  # everything sent before it has been answered
        qtbot.waitUntil(lambda: bool(replies), timeout=10000)
        assert len(heard) == 1 and len(batches) == 1, (heard, batches)  # one replay of each
        first = int(client.agent["pid"])
        os.kill(first, signal.SIGKILL)
        qtbot.waitUntil(lambda: client.state == "up" and int(client.agent.get("pid", first)) != first,
                        timeout=30000)
        qtbot.waitUntil(lambda: len(heard) == 2 and len(batches) == 2, timeout=30000)  # one more each
        again: list[dict] = []
        client.request("ping", again.append)
        qtbot.waitUntil(lambda: bool(again), timeout=10000)
        assert len(heard) == 2 and len(batches) == 2, (heard, batches)
    finally:
        client.close()
