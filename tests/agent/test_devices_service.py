"""The agent's one device loop: every listener shares one ``hl-smi -l`` (at the shortest interval asked),
it ends when nobody listens, and a failing tool is said in words. Real agent, fake hl-smi replaying
recorded output (tests/fake_hl_smi.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gaudi_gui.core.agentwire import Connection
from tests.fake_hl_smi import SICK_DEAD, SICK_ECC
from tests.helpers import sick_server_env


def hl_smi_loops() -> list[psutil.Process]:
    """This test's ``hl-smi ... -l N`` processes (its GAUDI_GUI_HOME: other tests run beside it)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        cmdline = proc.info["cmdline"] or []
        if (any("hl-smi" in part or "hl_smi" in part for part in cmdline) and "-l" in cmdline
                and (proc.info["environ"] or {}).get("GAUDI_GUI_HOME") == os.environ["GAUDI_GUI_HOME"]):
            try:  # a process that ended between the listing and this look is no loop
                with_status = proc.status() if proc.is_running() else psutil.STATUS_ZOMBIE
            except psutil.Error:
                continue
            if with_status != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def wait_for(what: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def next_event(conn: Connection, name: str, timeout: float = 20.0,
               accept: Callable[[dict[str, Any]], bool] = lambda m: True) -> dict[str, Any]:
    for message in conn.stream(timeout):
        if message.get("ev") == name and accept(message):
            return message
    raise AssertionError(f"no {name} event within {timeout} s")


def test_two_clients_share_one_loop_at_the_shorter_interval_and_unwatch_ends_it(fake_hl_smi: Path) -> None:
    with Connection.open() as slow, Connection.open() as fast:
        slow.request("devices.watch", interval_s=5)
        fast.request("devices.watch", interval_s=2)
        event = next_event(fast, "devices", accept=lambda m: bool(m["samples"]))
        assert len(event["samples"]) == 8 and event["source"] == "hl-smi"
        assert event["samples"][0]["kind"] == "hpu" and event["machine"]["kind"] == "host"
        next_event(slow, "devices", accept=lambda m: bool(m["samples"]))
        loops = wait_for(hl_smi_loops)
        assert len(loops) == 1, [p.info["cmdline"] for p in loops]
        cmdline = loops[0].info["cmdline"]
        assert cmdline[cmdline.index("-l") + 1] == "2"
        latest = wait_for(lambda: (got := slow.request("devices.latest"))["state"] == "ok" and got)
        assert len(latest["latest"]["samples"]) == 8
        slow.request("devices.unwatch")
        fast.request("devices.unwatch")
        wait_for(lambda: not hl_smi_loops())
        assert fast.request("devices.latest")["state"] == "stopped"


def test_a_failing_tool_is_said_in_words_and_retried(fake_hl_smi: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "fail")
    with Connection.open() as conn:
        conn.request("devices.watch", interval_s=1)
        state = next_event(conn, "devices_state", accept=lambda m: m["state"] == "failed")
        assert "exited with code" in state["message"] and "retrying in" in state["message"]
        assert "-l 1" in state["command"]
        # The host stands in meanwhile.
        event = next_event(conn, "devices", accept=lambda m: m["source"] in ("host", "nvidia-smi"))
        assert event["machine"]["kind"] == "host"


def test_an_absent_tool_is_said(tmp_path: Path) -> None:
    with Connection.open() as conn:
        conn.request("devices.watch", interval_s=1, hl_smi=str(tmp_path / "no-such-hl-smi"))
        state = next_event(conn, "devices_state", accept=lambda m: m["state"] == "failed")
        assert "no-such-hl-smi" in state["message"] and "Check the hl-smi path" in state["message"]


def test_health_check_reports_a_sick_server_from_a_child_at_lower_priority(
        fake_hl_smi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in sick_server_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    with Connection.open() as conn, Connection.open() as watcher:
        watcher.request("subscribe", events=["health"])
        agent = psutil.Process(int(conn.agent["pid"]))
        ident = conn.send("health.check", hl_smi=str(fake_hl_smi))
        doctor = wait_for(lambda: next((p for p in agent.children()
                                        if "doctor" in " ".join(p.cmdline())), None))
        assert doctor.nice() >= agent.nice() + 10
        reply = wait_for(lambda: conn.receive(60), timeout=90)
        assert reply["re"] == ident and reply["ok"], reply
        report = reply["report"]
        assert report["reachable"]
        seen = {(f["check"], f["module_id"]) for f in report["findings"] if f["severity"] == "error"}
        assert any(module == SICK_ECC for _check, module in seen), seen
        assert any(module == SICK_DEAD for _check, module in seen), seen
        event = next_event(watcher, "health", timeout=30)
        assert event["report"] == report
