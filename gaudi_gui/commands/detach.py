"""``--detach`` for every kind of job (``train``, ``serve``, ``eval``): start the same command again in
a session of its own as the job's supervisor (it outlives this shell, the app and an SSH connection),
wait until it has created the run folder, and return what it announced. The background command
records itself in the folder (``announce``: what ``runs stop`` signals) and writes the announce file
this side waits for. Qt-free, torch-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic
from gaudi_gui.core.runstore import Run, RunStore

#: How long ``--detach`` waits for the background supervisor to create the run folder.
DETACH_WAIT_S = 120.0


def detach(what: str, runs_dir: str, child_argv: Callable[[str, str], list[str]],
           payload: Any = None) -> dict[str, Any] | int:
    """Start ``child_argv(payload_path, announce_path)`` in a session of its own and wait for its
    announce; the announce ({pid, create_time, folder, name, ...}), or an exit code once the reason
    was printed. ``payload``: JSON handed to the child in a private file (``payload_path``)."""
    incoming = RunStore(runs_dir or None).root / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, payload_path = tempfile.mkstemp(prefix=f"{what}-", suffix=".json", dir=incoming)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
    announce = Path(payload_path).with_suffix(".run")
    prelog = Path(payload_path).with_suffix(".log")
    with open(prelog, "wb") as out:
        proc = subprocess.Popen(child_argv(payload_path, str(announce)), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + DETACH_WAIT_S
    info: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(announce.read_text(encoding="utf-8"))
            break
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    text = ""
    if info is None and prelog.exists():
        text = prelog.read_text(encoding="utf-8", errors="replace").strip()
    for path in (Path(payload_path), announce, *([prelog] if info is None else [])):
        with contextlib.suppress(OSError):
            path.unlink()
    if info is not None:
        return info
    code = proc.poll()
    if code is None:
        print(f"gaudi-gui {what}: the background job did not start within {DETACH_WAIT_S:g} s "
              f"(pid {proc.pid}, still running)", file=sys.stderr)
        return 1
    print(text or f"gaudi-gui {what}: the background job exited with code {code}", file=sys.stderr)
    return code or 1


def announce(run_: Run, announce_path: str, **extra: Any) -> None:
    """In the background supervisor: record itself in the run folder (what ``runs stop`` signals),
    send its own output to the folder's supervisor.log, and tell the waiting ``--detach`` where the
    job is (``extra`` goes into both records)."""
    me = run_.write_supervisor(folder=str(run_.folder), name=run_.name, **extra)
    info = {"pid": os.getpid(), "create_time": me.create_time if me else 0.0, "folder": str(run_.folder),
            "name": run_.name, **extra}
    fd = os.open(run_.folder / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    # The job's console is in log.txt already: only the supervisor's own notes are kept here.
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    if announce_path.endswith(".run"):
        with contextlib.suppress(OSError):
            os.unlink(announce_path[: -len(".run")] + ".log")
    atomic.write_json(announce_path, info, fsync=False)


def print_started(info: dict[str, Any], what: str, *, as_json: bool) -> None:
    """The answer of ``--detach``: the announce as JSON, or one line for a person."""
    if as_json:
        print(json.dumps(info), flush=True)
    else:
        print(f"{what} folder: {info['folder']} (detached, supervisor pid {info['pid']}); follow: gaudi-gui "
              f"runs follow {info['name']}; stop: gaudi-gui runs stop {info['name']}", flush=True)


def detach_command(what: str, kind: str, words: list[str], *, name: str, runs_dir: str = "",
                   grace_s: float = 30.0, as_json: bool = False) -> int:
    """``gaudi-gui serve|eval … --detach``: the command ``gaudi-gui WHAT WORDS --events`` under a
    supervisor of its own (``core.supervisor``, a ``core.jobkind`` run folder of ``kind``), started in
    the background; prints where it is and returns."""
    payload = {"argv": [sys.executable, "-m", "gaudi_gui", what, *words, "--events"], "name": name}
    info = detach(what, runs_dir, lambda path, announce_path: [
        sys.executable, "-m", "gaudi_gui.commands.detach", kind, path, announce_path, repr(grace_s),
        runs_dir], payload)
    if isinstance(info, int):
        return info
    print_started(info, kind, as_json=as_json)
    return 0


def detach_on_host(host: Any, words: list[str], *,
                   env: dict[str, str] | None = None) -> tuple[dict[str, Any] | None, str, int]:
    """``gaudi-gui WORDS --detach --json`` run on ``host`` (a ``core.remote.Host``) over ssh: the job's
    supervisor and run folder are the host's, so it outlives this command and the connection
    (``runs --host DEST follow|stop`` reach it later). (its announce, "", 0), or (None, why, exit code).
    ``env``: variables for the job there (a Serve API key), handed over as the guard's checked
    ``--env`` arguments; the guard's stdin is held open until the announce came back."""
    from gaudi_gui.core.placement import Placement

    argv = Placement.on_host(host).start_argv(host, [*words, "--detach", "--json"], guard=bool(env), env=env)
    read_end, write_end = os.pipe() if env else (subprocess.DEVNULL, -1)
    try:
        done = subprocess.run(argv, stdin=read_end, capture_output=True, text=True, errors="replace")
    finally:
        for fd in (read_end, write_end) if env else ():
            os.close(fd)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1]), "", 0
    except (ValueError, IndexError):
        said = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return None, f"on {host.name}: {said[-1]}", done.returncode or 1


def _supervise(kind: str, payload_path: str, announce_path: str, grace_s: float, runs_dir: str) -> int:
    """The background supervisor of a Serve or Evaluate command (what ``detach_command`` starts)."""
    import signal

    from gaudi_gui.commands.terminal import StopSignals, say
    from gaudi_gui.core import jobkind
    from gaudi_gui.core.stopper import KILL_NOW_SIGNAL
    from gaudi_gui.core.supervisor import supervise

    payload = json.loads(Path(payload_path).read_text(encoding="utf-8"))
    job = jobkind.create(kind, str(payload["name"]), [str(a) for a in payload["argv"]], runs_dir=runs_dir)
    announce(job.run, announce_path, kind=kind)
    signals = StopSignals()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, KILL_NOW_SIGNAL):
        signal.signal(sig, signals.handler)
    result = supervise(job, grace_s=grace_s, signals=signals, say=say, echo=lambda _line: None)
    say(f"{result.state}: {result.summary}")
    return 0 if result.ok else 1


__all__ = ["DETACH_WAIT_S", "announce", "detach", "detach_command", "print_started"]


if __name__ == "__main__":
    sys.exit(_supervise(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]))
