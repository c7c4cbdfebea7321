"""A run opened in a tracker's own dashboard: TensorBoard or trackio, served on a free loopback port of
the machine that holds the run (``gaudi-gui runs open``, the Runs list's "Open in TensorBoard" /
"Open in trackio").

Opening a run:

1. starts the dashboard (below) when none runs for that folder, and meanwhile exports the run
   (``core.export``) where the dashboard reads it. TensorBoard: the run's event file is
   written into **the run's own folder** (``export_tensorboard(run, <runs folder>)`` writes
   ``<runs folder>/<run name>/events.out.tfevents.*.gaudi-gui``), and the dashboard's logdir is the
   runs folder, so one TensorBoard serves every run opened so far, each under its own name, beside any
   event files a Trainer wrote there itself. trackio: its local store ``<runs folder>/.trackio``
   (``TRACKIO_DIR``; a dot folder is never taken for a run), project ``gaudi-gui``, one trackio run
   per run. An export newer than the run's events and meter is not written again.
2. the dashboard is a child (its own session; ended with everything it started) on a free
   port of 127.0.0.1 — ``python -m tensorboard.main --logdir DIR --host 127.0.0.1 --port N
   --load_fast auto --reload_interval 2`` (TensorBoard's Rust data server where it is installed, as
   it is with tensorboard's wheel: measured here on a run of 2,000 steps and an hour's meter, its page
   and the run listed in 1.6 s against 2.4-2.8 s with the pure-Python loader on a busy 2-core machine;
   the Python loader where it is not), or ``python -m
   gaudi_gui.workers.trackio_dashboard`` (``trackio.show(..., open_browser=False, share=False)``: no
   browser of its own, nothing off this machine);
3. waits until the page answers HTTP 200 (and, for TensorBoard, until it lists the run), and gives
   the URL at the run: TensorBoard's time series filtered to the run (``?runFilter=``), trackio's
   project with the run selected (``?project=…&runs=…``).

One dashboard per kind is kept by its owner (the command, the app's service) and reused for the next
run; it is not a job: it ends with its owner (the window, the command). A missing tensorboard or trackio
is said with the pip command; a dashboard that ends before its page answers is said with its exit
status and its last lines. Qt-free, torch-free (trackio is imported only in its own child and by the
export, which the app runs in the command's process, never in the window's).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gaudi_gui.core import export, jobkind, meter_files
from gaudi_gui.core.child import Child
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.serve import LOOPBACK, pick_free_port, port_free
from gaudi_gui.core.tb_events import EventFileWriter

Kind = Literal["tensorboard", "trackio"]
KINDS: tuple[Kind, ...] = ("tensorboard", "trackio")
LABELS: dict[str, str] = {"tensorboard": "TensorBoard", "trackio": "trackio"}
#: The module each dashboard needs in the Python that serves it, and how to get it.
MODULES: dict[str, str] = {"tensorboard": "tensorboard", "trackio": "trackio"}
PIP: dict[str, str] = {"tensorboard": "tensorboard", "trackio": "'trackio>=0.40'"}
#: trackio's project for the runs gaudi-gui exports (the export's default).
PROJECT = "gaudi-gui"
#: The folder of the runs folder that holds trackio's store (TRACKIO_DIR).
TRACKIO_FOLDER = ".trackio"
#: How long a dashboard may take to answer its first page (a cold start on a busy 2-core machine
#: with the imports not cached yet: ~5 s; measured warm: ~1 s for both).
READY_TIMEOUT_S = 90.0
#: How long an export into trackio may take (a 10-hour, 8-card meter: tens of seconds on a busy box).
EXPORT_TIMEOUT_S = 600.0
#: TensorBoard's reload interval: how soon a run exported into a running dashboard appears.
TB_RELOAD_S = 1


class DashboardError(Exception):
    """The dashboard cannot be opened: not installed, the export failed, the child ended, no answer."""


def missing(kind: str, python: str = sys.executable) -> str:
    """'' when ``kind``'s dashboard can run with ``python``, else why not with the pip command."""
    module = MODULES[kind]
    if python == sys.executable:
        found = importlib.util.find_spec(module) is not None
    else:
        import subprocess
        try:
            found = subprocess.run([python, "-c", f"import importlib.util as u, sys; "
                                    f"sys.exit(u.find_spec({module!r}) is None)"],
                                   capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            found = False
    if found:
        return ""
    # Named by the machine's own name: over ssh this sentence comes from the host that holds the run.
    return (f"{LABELS[kind]} is not installed in {python} on {platform.node() or 'this machine'}: "
            f"install it there with `{python} -m pip install {PIP[kind]}` and open the run again")


def data_folder(kind: str, run: Run) -> Path:
    """Where ``kind``'s dashboard reads the run: the runs folder (TensorBoard's logdir), or trackio's
    store inside it."""
    root = run.folder.resolve().parent
    return root if kind == "tensorboard" else root / TRACKIO_FOLDER


def _newest_source(run: Run) -> float:
    """The change time of what an export reads (events, metrics, meter), 0 when none."""
    newest = 0.0
    for path in (run.events_path, run.metrics_path, run.folder / meter_files.METER_NAME,
                 run.folder / meter_files.SUMMARY_NAME, run.status_path):
        with contextlib.suppress(OSError):
            newest = max(newest, path.stat().st_mtime)
    return newest


def export_run(kind: str, run: Run, board: Dashboard | None = None) -> str:
    """Export ``run`` for ``kind``'s dashboard (not again when the last export is newer than what it
    reads); what was done, in words. DashboardError says why it could not be. trackio: through the
    dashboard ``board`` itself where one runs (it has imported trackio already), else in a child."""
    folder = data_folder(kind, run)
    try:
        if kind == "tensorboard":
            done = sorted(run.folder.glob(f"events.out.tfevents.*.{EventFileWriter.SUFFIX}"))
            if done and done[-1].stat().st_mtime >= _newest_source(run):
                return f"{run.name}: the export in {run.folder} is up to date"
            return export.describe(export.export_tensorboard(run, folder))
        stamp = run.folder / ".trackio-exported"
        if stamp.is_file() and stamp.stat().st_mtime >= _newest_source(run) \
                and (folder / f"{PROJECT}.db").exists():
            return f"{run.name}: the trackio export is up to date"
        if board is not None and board.alive():
            answer = board.export(run)
            scalars, tags = int(answer.get("scalars") or 0), len(answer.get("tags") or [])
        else:
            result = export.export_trackio(run, folder, project=PROJECT)
            scalars, tags = result.scalars, len(result.tags)
        stamp.write_text(json.dumps({"project": PROJECT, "dir": str(folder), "at": time.time()}))
        return f"exported {scalars} values of {tags} series to trackio ({folder})"
    except export.ExportError as exc:
        raise DashboardError(str(exc)) from exc
    except OSError as exc:
        raise DashboardError(f"cannot export {run.name}: {exc.strerror or exc}") from exc


def argv(kind: str, folder: Path, port: int, python: str = sys.executable) -> list[str]:
    """The dashboard's command line (every word data: no shell)."""
    if kind == "tensorboard":
        return [python, "-m", "tensorboard.main", "--logdir", str(folder), "--host", LOOPBACK,
                "--port", str(port), "--load_fast", "auto", "--reload_interval", str(TB_RELOAD_S)]
    return [python, "-m", "gaudi_gui.workers.trackio_dashboard", "--dir", str(folder), "--port", str(port),
            "--project", PROJECT, "--exports"]


def environment(kind: str, folder: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The dashboard's environment: offline (no Hub, no analytics), trackio's store."""
    env = dict(os.environ if base is None else base)
    env.update({"HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2"})
    if kind == "trackio":
        env["TRACKIO_DIR"] = str(folder)
    # gaudi-gui itself must be importable by the trackio child (a source checkout, or a venv).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def base_url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}/"


def run_url(kind: str, base: str, run_name: str) -> str:
    """The dashboard's page at one run."""
    if kind == "tensorboard":
        # runFilter is a regular expression: the run's name taken literally.
        pattern = re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", run_name)
        return f"{base}?{urllib.parse.urlencode({'runFilter': pattern})}#timeseries"
    return f"{base}?{urllib.parse.urlencode({'project': PROJECT, 'runs': run_name})}"


#: urllib without any proxy: the page is on this machine's loopback, never through a proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(HTTP status, body); (0, b"") when nothing answers."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (OSError, ValueError):
        return 0, b""


def lists_run(kind: str, base: str, run_name: str) -> bool:
    """Whether the dashboard knows the run yet (TensorBoard finds new runs at its reload; trackio reads
    its store on each request)."""
    if kind != "tensorboard":
        return True
    status, body = fetch(base + "data/runs")
    try:
        return status == 200 and run_name in json.loads(body or b"[]")
    except ValueError:
        return False


@dataclass
class Opened:
    """An opened run: the page at the run, the dashboard's port, what the export did."""

    kind: str
    url: str
    port: int
    run: str
    exported: str
    #: Seconds from the Open to the page answering.
    seconds: float
    reused: bool

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "url": self.url, "port": self.port, "run": self.run,
                "exported": self.exported, "seconds": round(self.seconds, 3), "reused": self.reused}


def _answer(line: str) -> dict[str, Any] | None:
    """An export's answer line from the trackio dashboard (``{"ok": ...}``); None for its log lines."""
    line = line.strip()
    if not line.startswith('{"ok"'):
        return None
    value = json.loads(line)
    return value if isinstance(value, dict) else None


class Dashboard:
    """One dashboard child of ``kind`` over ``folder`` on 127.0.0.1 (started by :meth:`start`)."""

    def __init__(self, kind: str, folder: Path, *, python: str = sys.executable, port: int = 0) -> None:
        if kind not in KINDS:
            raise DashboardError(f"no dashboard {kind!r}: one of {', '.join(KINDS)}")
        self.kind, self.folder, self.python = kind, folder, python
        self.port = port
        self.child: Child | None = None

    @property
    def base(self) -> str:
        return base_url(self.port)

    def alive(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def start(self) -> None:
        why = missing(self.kind, self.python)
        if why:
            raise DashboardError(why)
        if self.port and not port_free(self.port):
            raise DashboardError(f"port {self.port} is already taken on 127.0.0.1: choose another "
                                 f"(or leave it out for a free one)")
        self.port = self.port or pick_free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            # die_with_parent: a command killed outright (SIGKILL) takes its dashboard with it.
            self.child = Child(argv(self.kind, self.folder, self.port, self.python),
                               stdin=self.kind == "trackio", decode=_answer, merge_stderr=True,
                               env=environment(self.kind, self.folder), tail_lines=40,
                               preexec=jobkind.die_with_parent())
        except OSError as exc:
            raise DashboardError(f"cannot start {LABELS[self.kind]}: {exc.strerror or exc}") from exc

    def export(self, run: Run, timeout: float = EXPORT_TIMEOUT_S) -> dict[str, Any]:
        """trackio: the run exported by the dashboard's own process (its answer); DashboardError with
        its message when it could not."""
        assert self.child is not None
        if not self.child.send(str(run.folder)):
            raise DashboardError(self.failure(self.child.poll()))
        deadline = time.monotonic() + timeout
        while True:
            answer = self.child.next_message(0.5)
            if answer is None:
                raise DashboardError(self.failure(self.child.wait(5)))
            if answer:
                if not answer.get("ok"):
                    raise DashboardError(f"trackio export failed: {answer.get('message', 'no reason given')}")
                return answer
            if time.monotonic() > deadline:
                raise DashboardError(f"the trackio export of {run.name} did not end within {timeout:.0f} s")

    def failure(self, code: int | None) -> str:
        """Why the child ended, with its last lines."""
        assert self.child is not None
        self.child.join(1.0)
        tail = self.child.tail_text(8)
        return (f"{LABELS[self.kind]} ended with exit status {code} before its page answered"
                + (f"; its last lines:\n{tail}" if tail else " (it wrote nothing)"))

    def wait_ready(self, run_name: str = "", timeout: float = READY_TIMEOUT_S,
                   stop: Callable[[], bool] | None = None) -> None:
        """Until the page answers 200 (and lists ``run_name``); DashboardError when the child ends or
        the time is up."""
        assert self.child is not None
        deadline = time.monotonic() + timeout
        answered = False
        while True:
            code = self.child.poll()
            if code is not None:
                raise DashboardError(self.failure(code))
            if not answered:
                answered = fetch(self.base, timeout=2.0)[0] == 200
            if answered and (not run_name or lists_run(self.kind, self.base, run_name)):
                return
            if time.monotonic() > deadline or (stop is not None and stop()):
                what = "lists the run" if answered else "answers"
                raise DashboardError(f"{LABELS[self.kind]} on port {self.port} started but nothing "
                                     f"{what} after {timeout:.0f} s; its last lines:\n"
                                     f"{self.child.tail_text(8)}")
            time.sleep(0.05)

    def stop(self) -> int | None:
        """End the dashboard and everything it started; its exit code (None: none was running)."""
        child, self.child = self.child, None
        return child.end(5.0) if child is not None else None


class Dashboards:
    """The dashboards of one owner (the command, the app's service): one per kind, reused for the next
    run while it reads the same folder; a run of another runs folder restarts it over that one."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self.running: dict[str, Dashboard] = {}

    def open(self, kind: str, run: Run, *, port: int = 0, stop: Callable[[], bool] | None = None) -> Opened:
        """Export ``run`` and show it in ``kind``'s dashboard (started when none runs for its folder)."""
        if kind not in KINDS:
            raise DashboardError(f"no dashboard {kind!r}: one of {', '.join(KINDS)}")
        started = time.monotonic()
        why = missing(kind, self.python)
        if why:
            raise DashboardError(why)
        folder = data_folder(kind, run)
        board = self.running.get(kind)
        reused = board is not None and board.alive() and board.folder == folder \
            and (not port or board.port == port)
        if not reused:
            if board is not None:
                board.stop()
            board = Dashboard(kind, folder, python=self.python, port=port)
            self.running[kind] = board
            # Started before the export: its start (a second of imports) and the export overlap. A
            # TensorBoard that scanned the folder before the file was there finds it at its next
            # reload (TB_RELOAD_S); trackio reads its store on each request.
            board.start()
        assert board is not None
        try:
            exported = export_run(kind, run, board)
            board.wait_ready(run.name, stop=stop)
        except DashboardError:
            board.stop()
            self.running.pop(kind, None)
            raise
        return Opened(kind, run_url(kind, board.base, run.name), board.port, run.name, exported,
                      time.monotonic() - started, reused)

    def stop(self) -> None:
        for kind in list(self.running):
            self.running.pop(kind).stop()


__all__ = ["KINDS", "LABELS", "PROJECT", "TRACKIO_FOLDER", "Dashboard", "DashboardError", "Dashboards",
           "Opened", "argv", "base_url", "data_folder", "environment", "export_run", "fetch", "lists_run",
           "missing", "run_url"]
