"""What many tests share, written once: clicking a widget or a modal dialog's button as a person does,
waiting on a condition where no Qt event loop runs, what a run folder's events say, the job files and
Training tab the training tests start from, and the processes a test finds by its marker.

Test modules import from here (or use conftest fixtures), never from one another: a test file is a
list of scenarios, and one that imports another drags that file's tests and fixtures along."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import psutil
from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QComboBox,
    QDialog,
    QMessageBox,
    QTableWidget,
    QWidget,
)

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.launch import free_port
from gaudi_gui.core.runstore import Run

if TYPE_CHECKING:
    from pytestqt.qtbot import QtBot

    from gaudi_gui.services.context import AppServices
    from gaudi_gui.ui.runner_tab import RunnerTab
    from gaudi_gui.ui.training_tab import TrainingTab

T = TypeVar("T")

SLOW_DISK = Path(__file__).resolve().parent / "slowdisk"

# -- clicking ----------------------------------------------------------------------------------------


def _label(widget: QWidget) -> str:
    text = widget.text() if isinstance(widget, QAbstractButton) else ""
    return repr(text) if text else f"{type(widget).__name__} {widget.objectName()!r}"


def click(qtbot: QtBot, widget: QWidget, pos: QPoint | None = None) -> None:
    """A left click on ``widget`` (at ``pos``, else its centre), refused with its name when a person
    could not click it: disabled, or hidden in its window (the window itself need not be shown)."""
    assert widget.isEnabled(), f"{_label(widget)} is disabled"
    assert widget.isVisibleTo(widget.window()), f"{_label(widget)} is hidden"
    # A button squeezed to nothing (its window was never shown, so never laid out) takes no click.
    assert not widget.rect().isEmpty(), f"{_label(widget)} has no size: show its window first"
    if pos is None:
        qtbot.mouseClick(widget, Qt.MouseButton.LeftButton)
    else:
        qtbot.mouseClick(widget, Qt.MouseButton.LeftButton, pos=pos)


def close_window(qtbot: QtBot, window: Any, timeout_ms: int = 90_000) -> None:
    """Close the main window as a person does: with jobs running (a server, an evaluation, a run),
    the close dialog lists them and "Stop and quit" is clicked, then the window is waited for until
    it has stopped them and closed; with none, it just closes. A fixture that closed a window with a
    job running left the dialog open in the teardown, and the suite waited for it forever."""
    import shiboken6

    if not shiboken6.isValid(window) or not window.isVisible():
        return  # closed (and deleted) by the test itself
    if not window.active_jobs():
        window.close()
        return
    answer = answer_dialog(qtbot, "Stop and quit")
    with qtbot.waitSignal(window.closed, timeout=timeout_ms):
        window.close()
    assert answer.clicked, "the close dialog was not shown"


class DialogAnswer:
    """What ``answer_dialog`` saw: the dialog's text and whether the button was clicked."""

    def __init__(self) -> None:
        self.text = ""
        self.clicked = False
        #: The labels of the dialog's visible buttons.
        self.buttons: list[str] = []


def answer_dialog(qtbot: QtBot, button_text: str, timeout_ms: int = 10_000) -> DialogAnswer:
    """Click the button labelled ``button_text`` of the next modal dialog, once it is on screen.

    Call it just before the action that opens the dialog: ``exec()`` runs its own event loop, so the
    click comes from a timer that looks for the active modal widget on every turn of that loop. The
    timer ends once it clicked, or after ``timeout_ms`` (then ``clicked`` stays False)."""
    answer = DialogAnswer()
    timer = QTimer()
    timer.setInterval(20)
    deadline = time.monotonic() + timeout_ms / 1000

    def look() -> None:
        dialog = QApplication.activeModalWidget()
        if isinstance(dialog, QDialog) and dialog.isVisible():
            buttons = [b for b in dialog.findChildren(QAbstractButton)
                       if b.text().replace("&", "") == button_text and b.isVisible()]
            if buttons:
                timer.stop()
                answer.buttons = [b.text().replace("&", "") for b in dialog.findChildren(QAbstractButton)
                                  if b.isVisible()]
                if isinstance(dialog, QMessageBox):
                    answer.text = f"{dialog.text()}\n{dialog.informativeText()}"
                answer.clicked = True
                qtbot.mouseClick(buttons[0], Qt.MouseButton.LeftButton)
                return
        if time.monotonic() > deadline:
            timer.stop()

    timer.timeout.connect(look)
    timer.start()
    answer.timer = timer  # type: ignore[attr-defined]  # kept alive as long as the answer is
    return answer


def choose(qtbot: QtBot, combo: QComboBox, data: object) -> None:
    """Open ``combo``'s list with a click, walk to the entry whose item data is ``data`` with the arrow
    keys, press Return."""
    click(qtbot, combo)
    view = combo.view()
    qtbot.waitUntil(view.isVisible, timeout=5000)
    target = combo.findData(data)
    assert target >= 0, f"{data} is not offered: {[combo.itemData(i) for i in range(combo.count())]}"
    for _ in range(combo.count() + 1):
        row = view.currentIndex().row()
        if row == target:
            break
        qtbot.keyClick(view, Qt.Key.Key_Down if row < target else Qt.Key.Key_Up)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.isVisible() and combo.currentData() == data, timeout=5000)


def type_over(qtbot: QtBot, widget: QWidget, text: str) -> None:
    """Click a field, select what it holds and type ``text`` over it (nothing: clear it)."""
    qtbot.mouseClick(widget, Qt.MouseButton.LeftButton)
    assert widget.hasFocus(), f"{_label(widget)} took no focus"
    qtbot.keyClick(widget, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    if text:
        qtbot.keyClicks(widget, text)
    else:
        qtbot.keyClick(widget, Qt.Key.Key_Delete)


def choose_runner_host(qtbot: QtBot, tab: RunnerTab, name: str) -> None:
    """Pick ``name`` in the Model runner's Host list (``choose``), then wait for the runner to use it."""
    choose(qtbot, tab.host_combo, name)
    qtbot.waitUntil(lambda: tab.client.host.name == name, timeout=5000)


# -- reading what a view shows ----------------------------------------------------------------------


def card_rows(table: QTableWidget) -> dict[int, int]:
    """Card id -> row of a Devices table, read from its Card column ("■ module 3" on Gaudi, "■ GPU 1"
    on CUDA: the number the selection uses)."""
    from gaudi_gui.ui.device_table import COLUMNS

    rows: dict[int, int] = {}
    for row in range(table.rowCount()):
        card = table.item(row, COLUMNS.index("Card"))
        words = card.text().split() if card is not None else []
        if len(words) == 3 and words[1] in ("module", "GPU", "index") and words[2].isdigit():
            rows[int(words[2])] = row
    return rows


def is_checked(table: QTableWidget, row: int) -> bool:
    """The row's Use box is checked."""
    item = table.item(row, 0)
    return item is not None and item.checkState() == Qt.CheckState.Checked


def x_range(plot: Any) -> tuple[float, float]:
    """The x range a pyqtgraph PlotWidget shows now."""
    low, high = plot.getPlotItem().viewRange()[0]
    return float(low), float(high)


def y_range(plot: Any) -> tuple[float, float]:
    """The y range a pyqtgraph PlotWidget shows now."""
    low, high = plot.getPlotItem().viewRange()[1]
    return float(low), float(high)


def curve_count(plots: Any) -> int:
    """How many curves the plots (a mapping of PlotWidgets) draw."""
    return sum(len(p.getPlotItem().listDataItems()) for p in plots.values())


def tabbed_plots(area: Any) -> list[Any]:
    """The plots on a PlotArea's tabs (empty when every shown plot has a cell of its own)."""
    tabs = area.tabs
    return [tabs.widget(i) for i in range(tabs.count())] if tabs.isVisibleTo(area) else []


# -- waiting outside an event loop -------------------------------------------------------------------


def wait_until(condition: Callable[[], T], timeout: float = 60.0) -> T:
    """The first truthy value of ``condition()``, polled every 0.05 s, or its last (falsy) value after
    ``timeout`` seconds: for tests that drive subprocesses, not a Qt event loop (those use
    ``qtbot.waitUntil``). Use as ``assert wait_until(...), what_went_wrong``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # polling a condition with a deadline, not a fixed delay
    return condition()


# -- Ctrl-C to a child -------------------------------------------------------------------------------


@contextlib.contextmanager
def children_get_sigint(disposition: str = "default") -> Iterator[None]:
    """Children started inside this block get SIGINT as a terminal's shell gives it: "default" (Ctrl-C
    interrupts them), whatever this process inherited; "ignored" as a script's background job (``cmd &``)
    or a CI runner's step gets it. exec keeps an ignored signal ignored and resets a caught one to its
    default, so this process holds the disposition wanted (a Python handler for "default") while the
    children are forked. A test that sends SIGINT to a child starts it here: under a parent that ignores
    SIGINT (``make test &``, nohup from a script, several CI runners) the child would inherit SIG_IGN,
    Python would then install no KeyboardInterrupt handler, and the signal would test nothing."""
    if disposition not in ("default", "ignored"):
        raise ValueError(f"disposition: 'default' or 'ignored', not {disposition!r}")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler if disposition == "default"
                             else signal.SIG_IGN)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler set outside Python, left as it was found
            signal.signal(signal.SIGINT, previous)


# -- run folders -------------------------------------------------------------------------------------


def events(run: Path | Run, kind: str | None = None) -> list[dict[str, Any]]:
    """The run's events (of type ``kind`` when given); none while events.jsonl does not exist yet."""
    folder = run.folder if isinstance(run, Run) else run
    try:
        lines = (folder / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    found = [json.loads(line) for line in lines if line.strip()]
    return [e for e in found if kind is None or e.get("type") == kind]


def steps(run: Path | Run) -> int:
    """The highest step the run's metrics events reached."""
    return max((int(e.get("step") or 0) for e in events(run, "metrics")), default=0)


#: Alpaca-style rows (instruction, input, output) for dataset tests.
ALPACA = [
    {"instruction": "Name a color.", "input": "", "output": "Blue."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "Five."},
    {"instruction": "Say hello.", "input": "", "output": "Hello there."},
    {"instruction": "Reverse the word.", "input": "cat", "output": "tac"},
    {"instruction": "Name a fruit.", "input": "", "output": "An apple."},
    {"instruction": "Count to three.", "input": "", "output": "One, two, three."},
    {"instruction": "Name an animal.", "input": "", "output": "A dog."},
    {"instruction": "Say bye.", "input": "", "output": "Goodbye."},
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


#: 48 question/answer rows: the dataset-row tests' file (rows are removed or spoiled from a copy).
QA = [{"question": f"Question {i}?", "answer": f"Answer {i}."} for i in range(48)]


def qa_job(source: Path) -> JobConfig:
    """A prompt/completion job on ``source``, its prompt fed by "question" and completion by "answer"."""
    job = JobConfig()
    job.dataset.source = str(source)
    job.dataset.kind = "prompt_completion"
    job.dataset.columns = {"prompt": "question", "completion": "answer"}
    return job


def job_file(folder: Path, output_dir: Path, resume: str = "", **args: object) -> Path:
    """A long demo-model job (one step logged per step, no periodic save) saved as a new
    ``job-N.json`` in ``folder``, on a free rendezvous port."""
    job = JobConfig(resume_from_checkpoint=resume,
                    training_args={"output_dir": str(output_dir), "max_steps": 100000,
                                   "logging_steps": 1, "per_device_train_batch_size": 2,
                                   "save_strategy": "no", **args})
    job.launch.main_process_port = free_port()
    path = folder / f"job-{len(list(folder.glob('job-*')))}.json"
    job.save(path)
    return path


def slow_disk_env(mbps: float) -> dict[str, str]:
    """Variables that give the training children the throttled checkpoint disk of tests/slowdisk."""
    path = os.environ.get("PYTHONPATH", "")
    return {"GAUDI_TEST_DISK_MBPS": str(mbps),
            "PYTHONPATH": f"{SLOW_DISK}{os.pathsep}{path}" if path else str(SLOW_DISK)}


# -- the Training tab --------------------------------------------------------------------------------


def form_ready(tab: TrainingTab) -> bool:
    """The Training form has its schema and will not be rebuilt: a form shown with the cached schema is
    built again when the schema child answers (a box taken before that is deleted, and a new one is
    shown only on the next turn of the event loop)."""
    form = tab.form
    if form.schema is None or tab.schema_loader.loading:
        return False
    # Rows added to a shown form are shown by a queued call (QLayout::addChildWidget): until that runs,
    # the new "overwrite" box is hidden, and a check between the rebuild and that call (CI, 1 of 1031)
    # clicked it hidden. Ready means a person could see the rows.
    box = form.overwrite_output
    return box is not None and box.isVisibleTo(form)


def training_tab(qtbot: QtBot, tmp_path: Path) -> tuple[AppServices, TrainingTab]:
    """Services and a shown Training tab whose runs go to ``tmp_path/runs``, once its form is built."""
    from gaudi_gui.app import create_services
    from gaudi_gui.core.runstore import RunStore
    from gaudi_gui.ui.training_tab import TrainingTab

    services = create_services()
    services.settings.set("training/runs_dir", str(tmp_path / "runs"))
    assert services.training is not None
    services.training.store = RunStore(tmp_path / "runs")
    tab = TrainingTab(services)
    qtbot.addWidget(tab)
    tab.resize(1400, 900)
    # Shown and active, as a person's window is before they click in it: with the schema cached the
    # form is ready at once, and a test that opened a popup before the window's activation was handled
    # left the (closed) popup active, so no later click gave a field focus.
    with qtbot.waitActive(tab, timeout=20000):
        tab.show()
    qtbot.waitUntil(lambda: form_ready(tab), timeout=120000)
    return services, tab


def set_arg(tab: TrainingTab, name: str, text: str) -> None:
    tab.form.editors[name].editor.setText(text)  # type: ignore[attr-defined]


def close_training_tab(services: AppServices, tab: TrainingTab) -> None:
    """Shut the tab and its services down as the window does when it closes."""
    tab.shutdown()
    assert services.training is not None
    services.training.shutdown()
    services.poller.stop()
    # The queues a Queue click subscribed to (this machine's, a host's through the agent): the window
    # ends its subscriptions as it closes.
    if services.queue is not None:
        services.queue.shutdown()
    services.stop_host_queues()


def end_training_tab(qtbot: QtBot, services: AppServices, tab: TrainingTab) -> None:
    """Kill whatever the tab still runs (a test that failed midway), wait for it, then close."""
    assert services.training is not None
    training = services.training
    for running in training.running():
        running.kill()
    qtbot.waitUntil(lambda: not training.running(), timeout=60000)
    close_training_tab(services, tab)


# -- processes ---------------------------------------------------------------------------------------


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` has ended: gone, or a zombie (ended; its parent, init for a daemon, has not
    reaped it yet). True when it ended in time. ``psutil.Process.wait`` on a process that is not our
    child waits for the reaping too: this machine's init reaps 1.5-1.8 s after an exit, and every test
    that ended its agent paid that in its teardown."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def processes_with_env(name: str, value: str) -> list[psutil.Process]:
    """Live processes (not zombies, not this test) whose environment has ``name=value``: the way a
    test finds what it started, children and re-parented runs in their own sessions alike."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(name) == value:
                found.append(proc)
        except psutil.Error:
            continue
    return found


# -- run folders as a long history leaves them -------------------------------------------------------

#: The damaged runs ``run_history`` makes, by name, and the one sentence each must show.
DAMAGED_RUNS = {
    "20250101-000003-latin1": "config.json is not UTF-8 (byte 0xe9 at 13)",
    "20250101-000002-cut": "status.json is truncated",
    "20250101-000001-noevents": "events.jsonl is missing",
}


def run_history(root: Path, count: int) -> list[str]:
    """``count`` finished runs under ``root`` written directly as files (thousands in a second), plus
    the damaged ones of DAMAGED_RUNS (named to sort among the newest, so a view that shows only the
    latest still shows them). The sound runs' names, newest first."""
    job = JobConfig(training_args={"output_dir": str(root / "out")}).to_dict()
    status = {"state": "finished", "step": 10, "max_steps": 10, "summary": "Finished at step 10",
              "started_at": 1.7e9, "ended_at": 1.7e9 + 5, "final_loss": 1.5}
    names = [f"2024{i:010d}-sound" for i in range(count)]
    for name in [*names, *DAMAGED_RUNS]:
        folder = root / name
        (folder / "ranks").mkdir(parents=True)
        for file in ("config.json", "job.json"):
            (folder / file).write_text(json.dumps(job))
        (folder / "status.json").write_text(json.dumps(status))
        (folder / "events.jsonl").write_text('{"type": "end", "state": "finished"}\n')
    latin1, cut, noevents = (root / n for n in DAMAGED_RUNS)
    (latin1 / "config.json").write_bytes(b'{"name": "caf\xe9", "model": "x"}')
    (latin1 / "job.json").unlink()
    (cut / "status.json").write_text('{"state": "finished", "st')
    (noevents / "events.jsonl").unlink()
    return sorted(names, reverse=True)


def sick_server_env(root: Path) -> dict[str, str]:
    """Build the doctor's fixture sysfs / proc / dev under ``root`` for the fake hl-smi's sick 8-card
    server (module 1 ports down, 2 double-bit ECC, 3 at 0 C, 5 power slowdown; module 6 held by pid
    4242, all habanalabs modules loaded) and return the env that points the doctor and hl-smi at it.
    Module ids are the recorded server's (index 1 is module 6: its accel1 node is the one held)."""
    from tests.fake_hl_smi import SICK_HELD, index_of
    sysfs, proc, dev = root / "sys", root / "proc", root / "dev"
    (dev / "accel").mkdir(parents=True)
    for i in range(8):
        (dev / "accel" / f"accel{i}").touch()
        status = sysfs / "class" / "accel" / f"accel{i}" / "device" / "status"
        status.parent.mkdir(parents=True)
        status.write_text("operational\n")
    (proc / "4242" / "fd").mkdir(parents=True)
    (proc / "4242" / "fd" / "7").symlink_to(dev / "accel" / f"accel{index_of(SICK_HELD)}")
    (proc / "modules").write_text("".join(f"{m} 1 0 - Live 0x0\n" for m in (
        "habanalabs", "habanalabs_cn", "habanalabs_en", "habanalabs_ib")))
    return {"FAKE_HLSMI_MODE": "sick", "GAUDI_GUI_DOCTOR_SYSFS": str(sysfs),
            "GAUDI_GUI_DOCTOR_PROC": str(proc), "GAUDI_GUI_DOCTOR_DEV": str(dev)}


# -- the Models tab and downloads ---------------------------------------------------------------------


def models_tab(qtbot: QtBot) -> Iterator[Any]:
    """A shown Models tab (a fixture's body: ``yield from models_tab(qtbot)``); at the end its listings
    and downloads are shut down and waited for."""
    from gaudi_gui.app import create_services
    from gaudi_gui.ui.models_tab import ModelsTab

    services = create_services()
    widget = ModelsTab(services)
    qtbot.addWidget(widget)
    widget.resize(1000, 700)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget
    widget.places.shutdown()
    widget.shutdown()
    # The queue the Download dialog's Queue subscribed to, as the window ends it.
    if services.queue is not None:
        services.queue.shutdown()
    services.stop_host_queues()
    qtbot.waitUntil(lambda: not widget.places.running() and not widget.is_listing(), timeout=20000)


def command_lines_while(qtbot: QtBot, needle: str, done: Callable[[], bool],
                        timeout_ms: int = 30000) -> list[str]:
    """The command lines of this machine's processes naming ``needle``, read until one is seen or
    ``done()`` (a download's child is looked at while it runs: a token must never be on its argv)."""
    argvs: list[str] = []

    def look() -> bool:
        argvs.extend(" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
                     if needle in " ".join(p.info["cmdline"] or []))
        return bool(argvs) or done()

    qtbot.waitUntil(look, timeout=timeout_ms)
    return argvs


def built_once(folder: Path, build: Callable[[], object]) -> Path:
    """``build()`` makes ``folder`` unless a worker of this run already made it (or is making it: the
    lock waits for it). A build that failed leaves no mark, so the next asker builds again."""
    import fcntl
    mark = folder.with_name(folder.name + ".built")
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not mark.exists():
            if folder.is_dir():
                shutil.rmtree(folder)  # a half-made build
            elif folder.exists():
                folder.unlink()
            build()
            mark.touch()
    return folder


def lines_of(stream: IO[str] | None, *, keep_ends: bool = False) -> queue.Queue[str | None]:
    """A child's pipe read on a thread, line by line into a queue (None once it ends), so a test waits
    with a timeout instead of blocking on a read."""
    import threading
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream or []:
            lines.put(line if keep_ends else line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def set_fake_hl_smi(program: Path, monkeypatch: Any = None, **values: str) -> None:
    """Change the fake hl-smi's FAKE_HLSMI_* knobs for its next starts, whoever starts it: the agent's
    environment was fixed when it started, so they go into ``fake.env`` beside the program, which
    the wrapper reads (and into this process's environment, where ``monkeypatch`` is given)."""
    import shlex
    env_file = program.parent / "fake.env"
    known: dict[str, str] = {}
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            known[name] = shlex.split(value)[0] if value else ""
    known.update(values)
    env_file.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in known.items()))
    if monkeypatch is not None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)


def model_folder(folder: Path, hidden: int = 64) -> Path:
    """A model folder as the forms see it before anything loads it: its config.json (its revision is
    that file's digest: core.fp8.model_identity)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": hidden}))
    return folder


def write_calibration(folder: Path, model: Path | str, ranks: int = 1, **manifest: Any) -> Path:
    """A finished calibrate run folder of ``model`` without running INC: the files the QUANTIZE step
    reads (each rank's, for ``ranks``), the QUANT_CONFIGs and a manifest measured on this CPU
    (``manifest`` overrides its keys: ``device``, ``generation``…)."""
    from gaudi_gui.core import fp8
    if ranks > 1:
        manifest = {"ranks": ranks, **manifest}
    for name in (*fp8.required_files(ranks=ranks), fp8.QUANT_CONFIG_NAME, fp8.QUANTIZE_CONFIG_NAME):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    record = fp8.make_manifest(model=fp8.model_identity(str(model)),
                               here={"device": "cpu", "generation": "cpu"}, rows=2,
                               prompts_sha256=fp8.prompts_digest(["a", "b"]), observer="maxabs",
                               scale_method="maxabs_pow2", blocklist=["lm_head"],
                               files=list(fp8.required_files()), started=time.time(), duration_s=1.0)
    record["inc_version"] = fp8.inc_version() or "3.10"
    (folder / fp8.MANIFEST_NAME).write_text(json.dumps({**record, **manifest}))
    return folder


def refuse_starting(monkeypatch: Any) -> None:
    """Bad input is refused before anything starts: from here on, starting a child process or opening a
    connection fails the test (``monkeypatch``: the test's ``pytest.MonkeyPatch``)."""
    import socket
    import subprocess

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"started something: {args!r}")
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
