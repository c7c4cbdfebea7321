"""``gaudi-gui runs open RUN --tensorboard|--trackio --no-browser`` (issue 27, "Open in a tracker"): the
run exported where the dashboard reads it, a real TensorBoard / trackio child on a free port of
127.0.0.1, its page fetched over HTTP at the printed URL, a second run opened in the same dashboard
through stdin, and the dashboard gone when the command ends. A missing tensorboard and a port taken are
said clearly (exit 2 / 1), never a traceback."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
from pathlib import Path

import psutil

from gaudi_gui.core import dashboard
from gaudi_gui.core.runstore import Run
from tests.helpers import children_get_sigint, lines_of


def _run(root: Path, name: str) -> Run:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    t0 = 1_700_000_000.0
    events = [{"type": "training_started", "rank": 0, "time": t0, "max_steps": 3}]
    events += [{"type": "metrics", "rank": 0, "time": t0 + s, "step": s, "max_steps": 3, "loss": 3.0 - s / 4}
               for s in range(1, 4)]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "status.json").write_text(json.dumps({"state": "finished", "started_at": t0}))
    return Run(folder)


def _open(root: Path, name: str, *extra: str) -> tuple[subprocess.Popen[str], queue.Queue[str | None]]:
    with children_get_sigint():  # its Ctrl-C (SIGINT) ends the dashboard
        proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(root), "open",
                                 name, *extra, "--no-browser"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    lines = lines_of(proc.stdout)
    return proc, lines


def _next(lines: queue.Queue[str | None], proc: subprocess.Popen[str], start: str) -> str:
    while True:
        line = lines.get(timeout=120)
        if line is None:
            raise AssertionError(f"ended without {start!r}: {proc.stderr.read() if proc.stderr else ''}")
        if line.startswith(start):
            return line


def _children(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def test_open_in_tensorboard_prints_the_url_serves_the_run_and_reuses_the_dashboard(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    first, second = _run(root, "run-a"), _run(root, "run-b")
    proc, lines = _open(root, "run-a", "--tensorboard")
    try:
        url = _next(lines, proc, "TensorBoard: ").split(": ", 1)[1]
        assert url.startswith("http://127.0.0.1:") and "runFilter=run-a" in url
        assert url.endswith("#timeseries")
        assert "until this command ends" in _next(lines, proc, "  serving on 127.0.0.1:")
        status, page = dashboard.fetch(url)
        assert status == 200 and b"<html" in page.lower()
        base = url.split("?", 1)[0]
        assert dashboard.lists_run("tensorboard", base, "run-a")
        # The run's own folder holds its event file; TensorBoard serves the runs folder.
        assert list(first.folder.glob("events.out.tfevents.*.gaudi-gui"))
        boards = [p for p in _children(proc) if "tensorboard.main" in " ".join(p.cmdline())]
        assert len(boards) == 1
        # A second run on stdin: the same dashboard (same port), the run listed once it answers.
        assert proc.stdin is not None
        proc.stdin.write(f"{second.folder}\n")
        proc.stdin.flush()
        again = _next(lines, proc, "TensorBoard: ").split(": ", 1)[1]
        assert again.split("?", 1)[0] == base and "runFilter=run-b" in again
        assert "the same dashboard" in _next(lines, proc, "  the same dashboard")
        assert dashboard.lists_run("tensorboard", base, "run-b")
        # stdin closed (the app's window closing, ssh going): the command ends and its dashboard too.
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert not any(b.is_running() and b.status() != psutil.STATUS_ZOMBIE for b in boards)
        assert dashboard.fetch(base, timeout=1)[0] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_open_in_trackio_serves_the_project_with_the_run(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _run(root, "run-t")
    proc, lines = _open(root, "run-t", "--trackio", "--json")
    try:
        message = json.loads(_next(lines, proc, "{"))
        assert message["t"] == "opened", message
        assert message["url"] == f"http://127.0.0.1:{message['port']}/?project=gaudi-gui&runs=run-t"
        assert dashboard.fetch(message["url"])[0] == 200
        assert (root / ".trackio" / "gaudi-gui.db").is_file()
        # trackio's own reader sees the run that was exported into its store.
        check = subprocess.run([sys.executable, "-c", "import trackio.sqlite_storage as s; "
                                "print(s.SQLiteStorage.get_runs('gaudi-gui'))"], capture_output=True,
                               text=True, env={**os.environ, "TRACKIO_DIR": str(root / ".trackio")},
                               timeout=120)
        assert "run-t" in check.stdout, check.stderr[-2000:]
        proc.send_signal(2)  # Ctrl-C: the dashboard ends with the command
        assert proc.wait(timeout=30) == 0
        assert dashboard.fetch(message["url"], timeout=1)[0] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_missing_tensorboard_a_dashboard_that_ends_a_taken_port_said_clearly(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _run(root, "run-m")
    # A Python without tensorboard: this one without its site-packages.
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    base = [sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(root), "open", "run-m",
            "--tensorboard", "--no-browser"]
    missing = subprocess.run([*base, "--python", str(bare)], capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
    assert missing.returncode == 2
    assert "TensorBoard is not installed in" in missing.stderr
    assert f"{bare} -m pip install tensorboard" in missing.stderr and "Traceback" not in missing.stderr
    # A dashboard that ends before its page answers: its exit status and last lines.
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\ncase \"$1\" in -c) exit 0;; esac\n"
                      "echo 'E1205 tensorboard: cannot load the plugin'\necho 'bye' >&2\nexit 3\n")
    broken.chmod(0o755)
    ended = subprocess.run([*base, "--python", str(broken)], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert ended.returncode == 1, ended.stderr
    assert "TensorBoard ended with exit status 3 before its page answered" in ended.stderr
    assert "cannot load the plugin" in ended.stderr and "bye" in ended.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = subprocess.run([*base, "--port", str(port)], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    assert busy.returncode == 1 and f"port {port} is already taken" in busy.stderr, busy.stderr
    assert "Traceback" not in busy.stderr


def test_open_without_a_browser_says_none_opened_and_where_the_dashboard_is(tmp_path: Path) -> None:
    """Issue 37 item 7: with no browser to be had here (no display, a $BROWSER that fails, no console
    browser on PATH) the command says so under the URL, never that one opened."""
    root = tmp_path / "runs"
    _run(root, "run-nb")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(BROWSER=str(Path("/bin/false")), PATH=f"{Path(sys.executable).parent}{os.pathsep}{bin_dir}")
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(root), "open",
                             "run-nb", "--tensorboard"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines = lines_of(proc.stdout)
    try:
        url = _next(lines, proc, "TensorBoard: ").split(": ", 1)[1]
        assert dashboard.fetch(url)[0] == 200
        said = _next(lines, proc, "  no browser could be opened here")
        assert "open the address above" in said
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
