"""The queue in the window (issue 29, 38): the Training tab's Queue button, the Queue view's rows and
buttons pressed as a person presses them, the Devices panel's "next:" line, and the notifications of a
queued job's start and end. The queue is the real agent's (paused, so nothing trains here), its changes
the agent's ``queue`` events; where a test needs states or answers the agent would not give on cue, the
test plays the agent: its messages go to the window's client as they would come off the socket."""

from __future__ import annotations

import time
from typing import Any

from gaudi_gui.app import AppServices, create_services
from gaudi_gui.core import agentwire, queue
from gaudi_gui.core.agentwire import Connection
from gaudi_gui.core.queue import Entry, QueueState
from gaudi_gui.services.agent_client import AgentClient
from gaudi_gui.services.queue import QueueService
from gaudi_gui.ui.devices_tab import DevicesTab
from gaudi_gui.ui.queue_view import QueueView
from tests.helpers import click, close_training_tab, end_training_tab, set_arg, training_tab


def ask(op: str, **values: Any) -> dict[str, Any]:
    """A request to this test's agent (started when none runs), as the command line sends it."""
    with Connection.open(client="test") as conn:
        return conn.request(op, **values)


def played(services: AppServices) -> AgentClient:
    """The window's client of an agent the test plays: never connected, so only what the test hands
    it (``play``, ``answer``) reaches the services."""
    services.agent = AgentClient()
    return services.agent


def play(service: QueueService, entries: list[Entry], **fields: Any) -> None:
    """A ``queue`` event as the agent would send it, taken by the window's client."""
    state = QueueState(entries=entries)
    positions = state.positions()
    service.client._take({"v": 1, "ev": "queue", "paused": False, "cpu_jobs": 1, **fields,
                          "entries": [queue.wire_entry(e, positions.get(e.id, 0)) for e in entries]})


def sent(client: AgentClient) -> list[dict[str, Any]]:
    """The requests the window's client would send (it waits for its agent: none connected)."""
    return [agentwire.decode(data) for data in client._pending]


def rows(view: QueueView) -> list[tuple[str, ...]]:
    table = view.table
    out = []
    for r in range(table.rowCount()):
        items = [table.item(r, c) for c in range(table.columnCount())]
        out.append(tuple(item.text() if item is not None else "" for item in items))
    return out


def test_queue_button_and_the_queue_view_clicked(qtbot, tmp_path, demo_model) -> None:
    ask("queue.pause")  # the real agent; nothing it gets starts
    services, tab = training_tab(qtbot, tmp_path)
    try:
        click(qtbot, tab.btn["Queue"])
        qtbot.waitUntil(lambda: "queued: it starts by itself" in tab.status.text(), timeout=10000)
        service = services.queue
        assert service is not None
        qtbot.waitUntil(lambda: len(service.state.pending()) == 1, timeout=60000)
        click(qtbot, tab.btn["Queue"])  # the same job again: its own run folder and output folder
        qtbot.waitUntil(lambda: len(service.state.pending()) == 2, timeout=60000)

        view = QueueView(service)
        qtbot.addWidget(view)
        view.resize(1000, 400)
        view.show()
        qtbot.waitUntil(lambda: len(rows(view)) == 2, timeout=10000)
        assert "paused" in view.summary.text()
        first, second = rows(view)
        assert first[0] == "1" and first[3] == "waiting" and first[5] == "the queue is paused"
        assert first[2] == "training"
        assert second[0] == "2"
        second_id = second[1].split()[0]
        # Move the second job up: it becomes position 1.
        view.table.selectRow(1)
        click(qtbot, view.up_button)
        qtbot.waitUntil(lambda: rows(view)[0][1].split()[0] == second_id, timeout=30000)
        # Remove both, each selected and removed as a person does.
        for removed in (1, 2):
            view.table.selectRow(0)
            assert view.remove_button.isEnabled()
            click(qtbot, view.remove_button)
            qtbot.waitUntil(lambda n=removed: [r[3] for r in rows(view)].count("ended: removed") == n,
                            timeout=30000)
        qtbot.waitUntil(lambda: all(r[3] == "ended: removed" for r in rows(view)), timeout=30000)
        assert not view.remove_button.isEnabled()
        # Resume: the button says what it does and the queue is no longer paused.
        assert view.pause_button.text() == "Resume"
        click(qtbot, view.pause_button)
        qtbot.waitUntil(lambda: view.pause_button.text() == "Pause", timeout=30000)
        assert not ask("queue.list")["paused"]
        service.shutdown()
    finally:
        close_training_tab(services, tab)


def test_the_training_tab_follows_its_queued_run_and_the_queue_views_stop_stops_it(
        qtbot, tmp_path, demo_model) -> None:
    """Issue 37 item 12: a job queued from the Training tab and started by the (real) agent's queue is
    shown by the tab as if started there (its log and curve, live); the Queue view's Stop, clicked,
    stops it as the tab's Stop does: it ends "stopped" with its checkpoint saved."""
    from gaudi_gui.core.runstore import Run, checkpoint_complete
    from gaudi_gui.core.stopper import KILL_NOW_SIGNAL
    services, tab = training_tab(qtbot, tmp_path)
    view: QueueView | None = None
    try:
        for name, text in (("output_dir", str(tmp_path / "out")), ("max_steps", "100000"),
                           ("save_steps", "100000"), ("logging_steps", "1")):
            set_arg(tab, name, text)
        click(qtbot, tab.btn["Queue"])
        service = services.queue
        assert service is not None
        qtbot.waitUntil(lambda: any(e.state == "started" for e in service.state.entries), timeout=120000)
        (entry,) = service.state.entries
        qtbot.waitUntil(lambda: tab.job.folder == entry.run_folder, timeout=30000)
        job = tab.job
        qtbot.waitUntil(lambda: len(job.records) >= 2, timeout=240000)
        assert tab.chart.isVisible() and "[rank 0/1]" in tab.log.plain_text()
        assert tab.btn["Stop"].isEnabled()

        view = QueueView(service)
        qtbot.addWidget(view)
        view.resize(1000, 400)
        view.show()
        qtbot.waitUntil(lambda: bool(rows(view)) and rows(view)[0][3] == "started", timeout=10000)
        assert not view.stop_button.isEnabled()  # nothing selected yet
        view.table.selectRow(0)
        assert view.stop_button.isEnabled()
        click(qtbot, view.stop_button)
        qtbot.waitUntil(lambda: "stop requested" in view.message.text(), timeout=30000)
        qtbot.waitUntil(lambda: rows(view)[0][3] == "ended: stopped", timeout=240000)
        qtbot.waitUntil(lambda: not job.is_running(), timeout=60000)
        status = Run(entry.run_folder).status()
        assert status.state == "stopped", status.summary
        assert checkpoint_complete(tmp_path / "out" / f"checkpoint-{status.step}")
        assert tab.status.text().startswith(f"Stopped at step {status.step} — checkpoint-{status.step} saved")
        assert not Run(entry.run_folder).processes_alive()
    finally:
        if view is not None:
            view.close()
        # A run the queue started and the tab never followed (a failure above) is killed here.
        for started in queue.read_state().entries:
            supervisor = Run(started.run_folder).supervisor() if started.run_folder else None
            if supervisor is not None:
                supervisor.signal(KILL_NOW_SIGNAL)
                qtbot.waitUntil(lambda s=supervisor: not s.is_alive(), timeout=60000)
        end_training_tab(qtbot, services, tab)
        if services.queue is not None:
            services.queue.shutdown()


def test_devices_next_line_and_the_notifications(qtbot) -> None:
    now = time.time()
    big = Entry(id="q1", job={}, name="llama-sft", card_count=2, state="waiting", since=now,
                why="healthy and free now: module 4")
    services = create_services()
    played(services)
    services.ensure_health()
    service = services.ensure_queue()
    play(service, [big])
    tab = DevicesTab(services)
    qtbot.addWidget(tab)
    tab.resize(1200, 900)
    tab.show()
    try:
        qtbot.waitUntil(tab.queue_line.isVisible, timeout=10000)
        assert tab.queue_line.text() == "next: llama-sft waits for 2 cards"
        assert tab.queue_line.toolTip() == "healthy and free now: module 4"
        notifier = services.notifier
        assert notifier is not None
        big.state, big.run_name, big.since = "started", "20261204-llama", time.time()
        play(service, [big])
        qtbot.waitUntil(lambda: ("Queued job llama-sft started", "run 20261204-llama") in notifier.history,
                        timeout=10000)
        qtbot.waitUntil(lambda: not tab.queue_line.isVisible(), timeout=10000)
        big.state, big.outcome, big.summary = "ended", "finished", "Finished 2 steps"
        play(service, [big])
        qtbot.waitUntil(lambda: ("Queued job llama-sft finished", "Finished 2 steps") in notifier.history,
                        timeout=10000)
    finally:
        service.shutdown()
        services.poller.stop()
        if services.health is not None:
            services.health.shutdown()
        notifier = services.notifier
        if notifier is not None:
            notifier.shutdown()


def test_the_queue_service_follows_the_agents_events(qtbot) -> None:
    """A change asked by another client (the command line) reaches the window as the agent's event:
    nothing is read from a file, nothing is asked again on a timer."""
    services = create_services()
    service = services.ensure_queue()
    seen: list[QueueState] = []
    service.state_changed.connect(seen.append)
    try:
        qtbot.waitUntil(lambda: service.known, timeout=30000)
        assert not service.state.paused
        ask("queue.pause")
        qtbot.waitUntil(lambda: service.state.paused, timeout=10000)
        added = ask("queue.add", kind="download", words=["org/name"], name="download-name", checked=True)
        qtbot.waitUntil(lambda: [e.id for e in service.state.pending()] == [added["entry"]], timeout=10000)
        assert seen and seen[-1] is service.state
    finally:
        service.shutdown()


def test_the_hosts_overview_says_this_machines_queue_length(qtbot) -> None:
    from gaudi_gui.ui.hosts_tab import QUEUE, HostsTab
    services = create_services()
    played(services)
    tab = HostsTab(services)
    qtbot.addWidget(tab)
    tab.resize(1200, 500)
    tab.show()
    service = None
    try:
        local = tab._items["local"]
        assert local.text(QUEUE) == ""  # not watched yet: blank, not "empty"
        service = services.ensure_queue()
        tab.bind_local_queue(service)
        play(service, [Entry(id="q1", job={}, name="big", card_count=2, state="waiting",
                             why="healthy and free now: module 4"),
                       Entry(id="q2", job={}, name="small", kind="eval", state="started", cards_used=[1])])
        qtbot.waitUntil(lambda: tab._items["local"].text(QUEUE) == "1 queued · 1 started", timeout=10000)
        assert tab._items["local"].toolTip(QUEUE) == \
            "next: big — waiting for 2 cards: healthy and free now: module 4"
        play(service, [])
        qtbot.waitUntil(lambda: tab._items["local"].text(QUEUE) == "empty", timeout=10000)
    finally:
        if service is not None:
            service.shutdown()
        tab.shutdown()
        services.poller.stop()


def test_a_hosts_tab_that_is_gone_is_not_told_of_queue_changes(qtbot) -> None:
    # A full run under load: the queue service (the app's, longer-lived) told a Hosts tab already
    # deleted, through a lambda, and it wrote to its deleted rows ("Internal C++ object already
    # deleted" in four remote tests). Its rows' slots now go with the tab.
    import shiboken6

    from gaudi_gui.ui.hosts_tab import HostsTab
    services = create_services()
    service = services.ensure_queue()
    tab = HostsTab(services)
    tab.bind_local_queue(service)
    tab.deleteLater()  # gone without its shutdown, as a window torn down under a test
    qtbot.waitUntil(lambda: not shiboken6.isValid(tab), timeout=5000)
    try:
        service.state_changed.emit(service.state)  # pytest-qt fails the test on a slot's exception
        qtbot.wait(50)
    finally:
        service.shutdown()
        services.poller.stop()


def test_the_serve_panels_queue_button_queues_a_server(qtbot) -> None:
    from gaudi_gui.ui.main_window import MainWindow
    from tests.helpers import close_window
    ask("queue.pause")  # the real agent's queue; nothing it gets starts
    window = MainWindow(create_services())
    qtbot.addWidget(window, before_close_func=lambda w: close_window(qtbot, w))
    window.show()
    panel = window.show_serve()  # (its shortcut is tested in test_serve_panel.py)
    assert panel is not None
    qtbot.waitUntil(panel.queue_button.isVisible, timeout=5000)
    click(qtbot, panel.queue_button)
    qtbot.waitUntil(lambda: "queued: it starts by itself" in panel.status.text(), timeout=10000)
    view = window.show_queue()
    assert view is not None
    qtbot.waitUntil(view.isVisible, timeout=5000)
    qtbot.waitUntil(lambda: [r[2] for r in rows(view)] == ["serve"], timeout=60000)
    (entry,) = queue.read_state().pending()
    assert entry.kind == "serve" and entry.name == "serve-builtin:demo"
    assert "--model=builtin:demo" in entry.words() and not any(w.startswith("--cards") for w in entry.words())
    # Removed as a person does: selected, Remove clicked; the queue ends with nothing left.
    view.table.selectRow(0)
    click(qtbot, view.remove_button)
    qtbot.waitUntil(lambda: rows(view)[0][3] == "ended: removed", timeout=30000)
    click(qtbot, view.pause_button)  # Resume: nothing is left to start
    qtbot.waitUntil(lambda: view.pause_button.text() == "Pause", timeout=30000)


def test_each_request_gets_its_own_answer_when_answers_come_out_of_order(qtbot) -> None:
    """Two adds sent one after the other, answered in the other order (and a Remove of the Queue view
    answered between them): each sender gets its own answer, never another request's. This test plays
    the agent (its replies go to the window's client as they would come off the socket)."""
    from gaudi_gui.core.queue import CardRequest
    services = create_services()
    client = played(services)
    service = services.ensure_queue()
    seen: list[tuple[str, bool, str]] = []
    service.request_answered.connect(lambda *answer: seen.append(answer))
    first: list[tuple[bool, str]] = []
    second: list[tuple[bool, str]] = []
    try:
        a = service.add_kind("download", ["org/a"], CardRequest(), on_answer=lambda *x: first.append(x))
        b = service.add_kind("download", ["org/b"], CardRequest(), on_answer=lambda *x: second.append(x))
        remove = service.remove("q9")  # the Queue view's Remove at the same moment: no sender's answer
        assert a and b and remove and len({a, b, remove}) == 3
        wire = {(r["op"], (r.get("words") or [r.get("entry")])[0]): r for r in sent(client)}
        assert wire[("queue.add", "org/a")]["name"] == "download-a"
        assert wire[("queue.add", "org/b")]["name"] == "download-b"
        for key, request_id, reply in (
                (("queue.remove", "q9"), remove, {"ok": False, "error": "no queued job 'q9'"}),
                (("queue.add", "org/b"), b, {"ok": False, "error": "b refused"}),
                (("queue.add", "org/a"), a, {"ok": True, "message": "queued q1 at position 1"})):
            client._take({"v": 1, "re": wire[key]["id"], **reply})
            assert seen[-1][0] == request_id
        assert first == [(True, "queued q1 at position 1")]
        assert second == [(False, "b refused")]
        assert [s[0] for s in seen] == [remove, b, a]
        # Refused here (an unknown kind): answered at once, to this sender only.
        third: list[tuple[bool, str]] = []
        assert service.add_kind("nope", [], CardRequest(), on_answer=lambda *x: third.append(x)) == ""
        assert third and third[0][0] is False and "--kind nope" in third[0][1]
        assert first == [(True, "queued q1 at position 1")] and len(second) == 1
    finally:
        service.shutdown()


def test_the_training_tab_shows_its_own_answer_from_the_agent(qtbot, tmp_path, monkeypatch) -> None:
    """Queue clicked: "queued: …" at once; a Remove answered first says nothing there; the agent's
    refusal of this add, when it comes, replaces the line. The test plays the agent."""
    import gaudi_gui.app as app_module
    made = app_module.create_services

    def with_played_agent() -> AppServices:
        services = made()
        played(services)
        return services

    monkeypatch.setattr(app_module, "create_services", with_played_agent)
    services, tab = training_tab(qtbot, tmp_path)
    try:
        click(qtbot, tab.btn["Queue"])
        queued = "queued: it starts by itself (View → Queue)"
        qtbot.waitUntil(lambda: tab.status.text() == queued, timeout=10000)
        service = services.queue
        assert service is not None
        client = service.client
        (add,) = [r for r in sent(client) if r["op"] == "queue.add"]
        assert add["kind"] == "train" and add["config"]["model"]
        service.remove("q9")
        (remove,) = [r for r in sent(client) if r["op"] == "queue.remove"]
        client._take({"v": 1, "re": remove["id"], "ok": False, "error": "no queued job 'q9'"})
        assert tab.status.text() == queued  # the Remove's answer is not the tab's
        with qtbot.waitSignal(service.request_answered, timeout=5000):
            client._take({"v": 1, "re": add["id"], "ok": False, "error": "output folder /o is already taken"})
        assert tab.status.text() == "not queued: output folder /o is already taken"
    finally:
        close_training_tab(services, tab)
        if services.queue is not None:
            services.queue.shutdown()


def test_a_queued_jobs_name_comes_from_its_words_as_the_hosts_queue_add_names_it() -> None:
    from gaudi_gui.services.queue import job_name
    assert job_name("serve", ["--model=/m/tiny-llama/", "--port=8000"]) == "serve-tiny-llama"
    assert job_name("serve", ["--model=builtin:demo"]) == "serve-builtin:demo"
    assert job_name("eval", ["--run=/runs/r1", "--prompt=a=b"]) == "eval-r1"
    assert job_name("eval", ["--model=", "--adapter=/x/lora"]) == "eval-lora"
    assert job_name("download", ["org/name", "--stall-s", "60"]) == "download-name"
