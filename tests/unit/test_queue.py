"""The queue's rules without processes (issue 29): ordering, anti-starvation, card matching, requests
applied by the agent's own code (agent/queue.py's Book, in this process, nothing started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.agent.queue import Book
from gaudi_gui.core import health, queue
from gaudi_gui.core.queue import CardRequest, CardsView, Entry, QueueError, QueueState


def entry(n: int, *, ids: tuple[int, ...] = (), count: int = 0, priority: int = 0, passed: int = 0,
          state: str = "queued", used: tuple[int, ...] = ()) -> Entry:
    return Entry(id=f"q{n}", job={}, name=f"job{n}", card_ids=list(ids), card_count=count,
                 priority=priority, passed=passed, state=state, cards_used=list(used))


def server(free: tuple[int, ...] = tuple(range(8)), held: dict[int, str] | None = None) -> CardsView:
    """An 8-card server as the doctor reports it: ``free`` cards, ``held`` card -> holder text."""
    findings = tuple(health.Finding("busy.held", "error", text, "", module, module, "local")
                     for module, text in (held or {}).items())
    cards = tuple({"index": i, "module_id": i, "bus_id": f"b{i}", "name": "HL-225"} for i in range(8))
    return CardsView(health.HostHealth("local", True, "", findings, cards, free), 1.0)


def starts(state: QueueState, view: CardsView) -> dict[str, tuple[int, ...]]:
    return {d.entry_id: d.cards for d in queue.plan(state, view) if d.action == "start"}


def test_card_request_parsing() -> None:
    assert CardRequest.parse("2") == CardRequest(count=2)
    assert CardRequest.parse("2,3") == CardRequest(ids=(2, 3))
    assert CardRequest.parse("3,") == CardRequest(ids=(3,))
    assert CardRequest.parse("") == CardRequest()
    for bad in ("x", "0", "2,a", "-1", "99"):
        with pytest.raises(ValueError, match="--cards takes"):
            CardRequest.parse(bad)
    assert CardRequest.parse("3,").to_text() == "3," and CardRequest(count=2).to_text() == "2"


def test_priority_then_first_come_first_served() -> None:
    state = QueueState(entries=[entry(1), entry(2, priority=5), entry(3), entry(4, priority=5)])
    assert [e.id for e in state.pending()] == ["q2", "q4", "q1", "q3"]
    assert state.positions() == {"q2": 1, "q4": 2, "q1": 3, "q3": 4}


def test_same_cards_one_after_the_other() -> None:
    state = QueueState(entries=[entry(1, ids=(2, 3)), entry(2, ids=(2, 3))])
    view = server()
    assert starts(state, view) == {"q1": (2, 3)}
    why = {d.entry_id: d.why for d in queue.plan(state, view)}
    assert "in use by queued job q1" in why["q2"]
    state.entries[0].state, state.entries[0].cards_used = "started", [2, 3]
    assert starts(state, view) == {}
    state.entries[0].state = "ended"
    assert starts(state, view) == {"q2": (2, 3)}


def test_held_or_unhealthy_cards_mean_wait_with_the_reason() -> None:
    view = server(free=(0, 1, 3, 4, 5, 6, 7), held={2: "held by pid 4242 (python3 train.py)"})
    state = QueueState(entries=[entry(1, ids=(2, 3))])
    (decision,) = queue.plan(state, view)
    assert decision.action == "wait" and "module 2: held by pid 4242" in decision.why
    assert view.holder_pids([2]) == {4242}


def test_n_cards_take_a_free_healthy_group() -> None:
    view = server(free=(0, 1, 3, 4, 5, 6, 7), held={2: "held by pid 7"})
    state = QueueState(entries=[entry(1, count=2), entry(2, count=4)])
    got = starts(state, view)
    assert got["q1"] == (0, 1)             # Intel's first whole free group
    assert got["q2"] == (4, 5, 6, 7)        # 0-3 has the held card 2


def test_a_later_small_job_may_pass_a_waiting_large_one_a_bounded_number_of_times() -> None:
    # Four of eight cards busy: the 8-card job waits; 1-card jobs behind it may start.
    busy = entry(9, ids=(0, 1, 2, 3), state="started", used=(0, 1, 2, 3))
    big = entry(1, count=8)
    small = entry(2, count=1)
    state = QueueState(entries=[busy, big, small])
    decisions = {d.entry_id: d for d in queue.plan(state, server())}
    assert decisions["q1"].action == "wait"
    assert decisions["q2"].action == "start" and decisions["q2"].passes == ("q1",)
    # Once passed MAX_PASSED times, the big job holds every card: the small one waits, and says why.
    big.passed = queue.MAX_PASSED
    decisions = {d.entry_id: d for d in queue.plan(state, server())}
    assert decisions["q2"].action == "wait" and "held for q1" in decisions["q2"].why
    # A job that asks for no cards is never held back.
    state.entries.append(entry(3))
    assert "q3" in starts(state, server())


def test_a_job_on_other_named_cards_is_not_held_by_a_starving_one() -> None:
    state = QueueState(entries=[entry(9, ids=(0,), state="started", used=(0,)),
                                entry(1, ids=(0, 1), passed=queue.MAX_PASSED), entry(2, ids=(4, 5))])
    assert starts(state, server()) == {"q2": (4, 5)}


def test_no_hl_smi_bookkeeps_ids_among_the_queues_own_jobs() -> None:
    state = QueueState(entries=[entry(1, count=2), entry(2, ids=(1,)), entry(3)])
    assert starts(state, CardsView(None)) == {"q1": (0, 1), "q3": ()}


def test_paused_queue_starts_nothing() -> None:
    state = QueueState(paused=True, entries=[entry(1)])
    decisions = queue.plan(state, CardsView(None))
    assert [(d.action, d.why) for d in decisions] == [("wait", "the queue is paused")]


def _apply(book: Book, action: str, **values: Any) -> dict[str, Any]:
    """A request as the agent applies it, with its reply as a client reads it (ok, message, …)."""
    try:
        return {"ok": True, **book.apply(action, values)}
    except QueueError as exc:
        return {"ok": False, "message": str(exc)}


def test_requests_add_move_remove_and_the_same_output_folder(tmp_path: Path) -> None:
    runner = Book()
    runner.state.paused = True
    out = str(tmp_path / "shared-out")
    first = _apply(runner, "add", job={}, name="a", output_dir=out)
    assert first["ok"] and first["entry"] == "q1"
    refused = _apply(runner, "add", job={}, name="b", output_dir=out + "/")
    assert not refused["ok"] and str(Path(out).resolve()) in refused["message"]
    assert "q1 (a)" in refused["message"]
    assert _apply(runner, "add", job={}, name="b")["entry"] == "q2"
    assert _apply(runner, "add", job={}, name="c", priority=3)["entry"] == "q3"
    assert [e.id for e in runner.state.pending()] == ["q3", "q1", "q2"]
    moved = _apply(runner, "move", entry="q2", before="q3")
    assert moved["ok"] and [e.id for e in runner.state.pending()] == ["q2", "q3", "q1"]
    moved_entry = runner.state.find("q2")
    assert moved_entry is not None and moved_entry.priority == 3
    assert not _apply(runner, "move", entry="q9", before="q1")["ok"]
    assert _apply(runner, "remove", entry="q1")["ok"]
    removed = runner.state.find("q1")
    assert removed is not None and removed.outcome == "removed"
    # The ended job's output folder is free again.
    assert _apply(runner, "add", job={}, name="d", output_dir=out)["ok"]
    assert not _apply(runner, "add", job={}, kind="serve")["ok"]
    # What the agent writes is what a new agent reads.
    queue.write_state(runner.state, queue.make_dirs(tmp_path / "q"))
    assert [e.id for e in queue.read_state(tmp_path / "q").pending()] == ["q2", "q3", "q4"]


def test_a_damaged_state_reads_as_an_empty_queue_with_the_problem(tmp_path: Path) -> None:
    root = queue.make_dirs(tmp_path / "q")
    queue.state_path(root).write_text('{"entries": [', encoding="utf-8")
    state = queue.read_state(root)
    assert state.entries == [] and "truncated" in state.problem


def test_the_same_add_sent_twice_is_queued_once(tmp_path: Path) -> None:
    runner = Book()
    runner.state.paused = True
    first = _apply(runner, "add", job={}, name="a", client_id="abc")
    again = _apply(runner, "add", job={}, name="a", client_id="abc")
    assert again["ok"] and again["entry"] == first["entry"] == "q1"
    assert "already queued as q1 (a)" in again["message"]
    assert len(runner.state.entries) == 1


def test_cpu_jobs_start_one_at_a_time_and_say_for_which_job() -> None:
    """Issue 37 item 12: three CPU trainings queued on a small machine all started together. At most
    ``cpu_jobs`` (default 1) of them run; the others wait, in order, naming the job they wait for."""
    state = QueueState(entries=[entry(1), entry(2), entry(3)])
    assert state.cpu_jobs == 1
    assert starts(state, CardsView(None)) == {"q1": ()}
    why = {d.entry_id: d.why for d in queue.plan(state, CardsView(None))}
    assert why["q2"].startswith("waiting for the CPU: q1 (job1) is running")
    assert "--cpu-jobs" in why["q3"]
    state.entries[0].state = "started"
    assert starts(state, CardsView(None)) == {}
    state.entries[0].state = "ended"
    assert starts(state, CardsView(None)) == {"q2": ()}
    # Two at a time, and no limit; card jobs, serve and download jobs take no turn of the CPU.
    state.cpu_jobs = 2
    assert starts(state, CardsView(None)) == {"q2": (), "q3": ()}
    state.cpu_jobs = 0
    busy = QueueState(cpu_jobs=0, entries=[entry(1), entry(2), entry(3)])
    assert set(starts(busy, CardsView(None))) == {"q1", "q2", "q3"}
    others = QueueState(entries=[entry(1, state="started"), entry(2, count=1), entry(3), entry(4)])
    others.entries[2].kind, others.entries[3].kind = "serve", "download"
    assert starts(others, CardsView(None)) == {"q2": (0,), "q3": (), "q4": ()}
    waiting = Entry(id="q9", job={}, state="waiting", why=why["q2"])
    assert waiting.state_text() == "waiting for the CPU"


def test_the_cpu_limit_is_set_by_a_request_and_kept_in_the_state(tmp_path: Path) -> None:
    runner = Book()
    runner.state.paused = True
    assert _apply(runner, "set", cpu_jobs=2) == {"ok": True, "message": "CPU jobs: 2 at a time",
                                                 "cpu_jobs": 2}
    root = queue.make_dirs(tmp_path / "q")
    queue.write_state(runner.state, root)
    assert queue.read_state(root).cpu_jobs == 2
    for bad in (-1, "two", True, 1.5, 1000):
        reply = _apply(runner, "set", cpu_jobs=bad)
        assert not reply["ok"] and "--cpu-jobs takes" in reply["message"]
    # The window's adds carry its setting.
    assert _apply(runner, "add", job={}, name="a", cpu_jobs=3)["ok"]
    assert runner.state.cpu_jobs == 3
    # A damaged value in the file reads as the default.
    queue.state_path(root).write_text('{"cpu_jobs": "x", "entries": []}', encoding="utf-8")
    assert queue.read_state(root).cpu_jobs == queue.DEFAULT_CPU_JOBS


def test_stop_is_for_a_started_job(tmp_path: Path) -> None:
    runner = Book()
    runner.state.paused = True
    assert _apply(runner, "add", job={}, name="a")["ok"]
    refused = _apply(runner, "stop", entry="q1")
    assert not refused["ok"] and "has not started: Remove takes it out" in refused["message"]
    first = runner.state.find("q1")
    assert first is not None
    first.state = "starting"
    asked = _apply(runner, "stop", entry="q1")
    assert asked["ok"] and "stopped as soon as it has started" in asked["message"] and first.stop_asked
    removed = _apply(runner, "remove", entry="q1")
    assert not removed["ok"] and "gaudi-gui queue stop q1" in removed["message"]
