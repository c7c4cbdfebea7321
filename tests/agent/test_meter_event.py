"""Issue 38 item 7, one event stream: the agent reads a running job's meter.jsonl and sends what it says
so far as ``meter`` events (agent/jobs.py), to a session subscribed with the job's id; the window reads
no meter file. Any running run of the agent's stores (a runs store a client named in ``jobs.list``),
watched or not; nothing for an ended run, and the reading goes on (aging) when no new sample comes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gaudi_gui.core.agentwire import Connection


def _run(folder: Path, state: str = "running", started_at: float | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "status.json").write_text(json.dumps({"state": state, "kind": "train",
                                                    "started_at": started_at or time.time()}))


def _samples(folder: Path, times: list[float], watts: float = 100.0) -> None:
    with open(folder / "meter.jsonl", "a") as fh:
        for t in times:
            cards = [{"name": f"module {i}", "module_id": i, "index": i, "power_w": watts} for i in (2, 3)]
            fh.write(json.dumps({"t": round(t, 3), "source": "hl-smi", "cards": cards}) + "\n")


def _readings(conn: Connection, job_id: str, until: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = conn.receive(0.5)
        if message is not None and message.get("ev") == "meter" and message.get("job_id") == job_id:
            got.append(message["meter"])
            if until(message["meter"]):
                return got
    raise AssertionError(f"no such reading of {job_id} within {timeout:.0f} s: {got[-3:]}")


def test_the_agent_sends_a_running_jobs_meter_readings(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    now = time.time()
    live, ended = runs / "run-live", runs / "run-ended"
    _run(live, started_at=now - 10)
    _samples(live, [now - 10 + i for i in range(10)])
    _run(ended, state="finished")
    _samples(ended, [now - 5, now - 4])
    with Connection.open() as conn:
        conn.request("jobs.list", runs_dir=str(runs))  # the store, as the window names its own
        conn.request("subscribe", events=["meter"], key="run-live")
        first = _readings(conn, "run-live", lambda r: r["samples"] == 10)[-1]
        # Two cards of 100 W for 9 s between the first and the last sample: 1800 J.
        assert first["power_w"] == 200.0 and abs(first["energy_j"] - 1800.0) < 1e-6, first
        assert first["text"].startswith("⚡ 200 W now · ") and "card-hours" in first["text"], first
        # New samples reach the subscriber without asking again.
        _samples(live, [time.time()], watts=150.0)
        later = _readings(conn, "run-live", lambda r: r["samples"] == 11)[-1]
        assert later["power_w"] == 300.0 and later["energy_j"] > first["energy_j"]
        # No new sample: the readings go on, and say how old the last one is.
        _readings(conn, "run-live", lambda r: "no power reading for" in r["text"], timeout=60)
        # An ended run's meter is its summary: no live reading; a run of no store: none either.
        conn.request("subscribe", events=["meter"], key="run-ended")
        conn.request("subscribe", events=["meter"], key="run-nowhere")
        assert {m["job_id"] for m in _drain(conn, 2.5)} == {"run-live"}
        # The run ends: the readings stop.
        _run(live, state="finished", started_at=now - 10)
        _drain(conn, 2.5)
        assert _drain(conn, 2.5) == []


def _drain(conn: Connection, seconds: float) -> list[dict[str, Any]]:
    """Every ``meter`` event for ``seconds``."""
    got = [m for m in conn.events if m.get("ev") == "meter"]
    conn.events.clear()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        message = conn.receive(0.2)
        if message is not None and message.get("ev") == "meter":
            got.append(message)
    return got
