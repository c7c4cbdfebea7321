"""Job kinds other than training: Serve and Evaluate run under the same supervisor as a training run.

A job is kind × placement. Training is prepared by ``core.prepare`` (a launcher and its ranks); the
other kinds are one command of ours (``gaudi-gui serve … --events``, ``gaudi-gui eval … --events``)
that ``core.supervisor.supervise`` starts in a session of its own and follows. Their run folder (in the
same runs store) holds spec.json (the kind and the command), status.json (the supervisor is its only
writer; its ``kind`` field names the kind), log.txt (the command's text lines) and events.jsonl (its
protocol lines), and what the kind keeps: Serve's endpoint.json (url, port, engine pid, model) and
requests.jsonl; Evaluate's result.json (the result record, whose "path" names the full results).

The command is stopped by SIGTERM to its process group (serve ends its engine's tree and frees the
port; eval's worker ends with it) and is sent SIGTERM by the kernel if its supervisor dies
(``die_with_parent``): Serve's engine, which gets the same from the serve command, never outlives the
supervisor unseen. Qt-free, torch-free.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gaudi_gui.core import atomic, hlsmi
from gaudi_gui.core import kinds as kinds_mod
from gaudi_gui.core.events import EventType
from gaudi_gui.core.runstore import FILE_MODE, Run, RunStatus, RunStore, new_folder

#: Every kind (core.kinds is where each is declared).
KINDS = kinds_mod.NAMES
#: What a stop does to a job of each kind (core.kinds): a server saves no checkpoint, a training run does.
STOP_WORDS = {k.name: k.stop_words for k in kinds_mod.KINDS.values()}


def stop_words(kind: str) -> str:
    """What stopping a job of ``kind`` does, for the line that says a stop was asked for."""
    return kinds_mod.stop_words(kind)


#: What a kind's run folder records about the command (the kind, its argv, the working folder).
SPEC_NAME = "spec.json"
ENDPOINT_NAME = "endpoint.json"
REQUESTS_NAME = "requests.jsonl"
RESULT_NAME = "result.json"
#: linux/prctl.h
PR_SET_PDEATHSIG = 1


@dataclass
class ChildJob:
    """A prepared job of a kind other than training: what ``supervise`` starts and follows."""

    kind: str
    run: Run
    argv: list[str]
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: str = field(default_factory=os.getcwd)
    device: str = "cpu"


def create(kind: str, name: str, argv: list[str], *, runs_dir: str = "", origin: str = "cli") -> ChildJob:
    """A new run folder of ``kind`` (spec.json, a queued status, an empty private log) and the job
    that runs ``argv`` in it. OSError when the disk refuses (nothing is left behind then)."""
    kind = kinds_mod.canonical(kind)
    if kind not in KINDS[1:]:
        raise ValueError(f"unknown job kind {kind!r}")
    run = Run(new_folder(RunStore(runs_dir or None).root, name))
    try:
        from gaudi_gui.core.secrets import redact
        atomic.write_json(run.folder / SPEC_NAME, {"kind": kind, "argv": [redact(a) for a in argv],
                                                   "cwd": os.getcwd()}, mode=FILE_MODE, fsync=False)
        run.write_status(RunStatus(state="queued", kind=kind, origin=origin))
        os.close(os.open(run.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE))
    except OSError:
        shutil.rmtree(run.folder, ignore_errors=True)
        raise
    job = ChildJob(kind=kind, run=run, argv=list(argv))
    # The command learns its own run folder (a calibration writes INC's measurement files there).
    job.env["GAUDI_GUI_RUN_FOLDER"] = str(run.folder)
    return job


def _flag(argv: list[str], flag: str) -> str:
    """The value of ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``), '' when absent."""
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return ""


def meter_target(job: ChildJob) -> tuple[str, dict[str, str]]:
    """The device and environment the run meter of a Serve or Evaluate job reads: its command's
    ``--device`` (``auto`` or none: hl-smi found -> hpu, else nvidia-smi -> cuda, else cpu: the tools
    themselves, not the probe child, which imports torch for seconds) and its ``--cards`` as the
    command sets them for its engine (HABANA_VISIBLE_MODULES / CUDA_VISIBLE_DEVICES); without
    ``--cards``, the cards of the job's own environment (every card when it names none)."""
    from gaudi_gui.core import visibility

    env = dict(job.env)
    device = _flag(job.argv, "--device")
    if device not in ("hpu", "cuda", "cpu"):
        path = env.get("PATH")
        # A named hl-smi counts even where it cannot run: the meter then says so, not "cpu".
        device = "hpu" if hlsmi.hl_smi_program(env=env)[1] or hlsmi.find_hl_smi(env=env) \
            else "cuda" if shutil.which("nvidia-smi", path=path) else "cpu"
    words = [w.strip() for w in _flag(job.argv, "--cards").split(",") if w.strip()]
    if words and all(w.isascii() and w.isdigit() for w in words):
        env.update(visibility.device_env(device, sorted({int(w) for w in words})))
    return device, env


#: The kinds whose runs are metered (a download holds no card).
METERED_KINDS = tuple(k.name for k in kinds_mod.KINDS.values() if k.metered)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to send the child SIGTERM when this process dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``; kept across the exec). The signal comes when the *thread* that forked
    the child ends, so it is set only from the main thread, and only while no other thread runs (a
    ``preexec_fn`` after a fork in a threaded process may deadlock); None elsewhere and off Linux."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread() \
            or threading.active_count() != 1:
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    owner = os.getpid()
    sig = int(signal.SIGTERM)

    def preexec() -> None:  # runs in the child between fork and exec: nothing that may lock
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != owner:
            os._exit(1)  # the owner died before the request took effect

    return preexec


def take(run: Run, event: Mapping[str, Any]) -> dict[str, Any]:
    """Keep what ``event`` of a Serve or Evaluate command says in its run folder (the supervisor
    calls this: it is the one writer of these files); the status fields it changes."""
    kind = event.get("type")
    if kind == EventType.SERVE_URL:
        url = str(event.get("url") or "")
        port = int(url.rsplit(":", 1)[-1].split("/", 1)[0]) if url.count(":") >= 2 else 0
        endpoint = {"url": url, "port": port, "model": event.get("model", ""), "name": event.get("name", ""),
                    "host": event.get("host", ""), "pid": _engine_pid(run)}
        atomic.write_json(run.folder / ENDPOINT_NAME, endpoint, mode=FILE_MODE, fsync=False)
        # Named as the user chose it (builtin:demo), not by the cache folder it resolved to.
        return {"summary": f"Serving {endpoint['name'] or endpoint['model'] or 'a model'} at {url}"}
    if kind == EventType.SERVE_REQUEST:
        line = json.dumps({k: v for k, v in event.items() if k not in ("type", "v", "rank")}) + "\n"
        fd = os.open(run.folder / REQUESTS_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
    elif kind == EventType.PROGRESS and isinstance(event.get("bytes_done"), int):
        # A download (commands/download.py): bytes, rate, ETA and files, said in the status.
        from gaudi_gui.core.hub import progress_text
        return {"summary": f"Downloading: {progress_text(dict(event))}"}
    elif kind == EventType.PROGRESS and isinstance(event.get("done"), int) \
            and isinstance(event.get("total"), int):
        return {"step": event["done"], "max_steps": event["total"]}
    elif kind == EventType.RESULT:
        record = {k: v for k, v in event.items() if k not in ("type", "v")}
        atomic.write_json(run.folder / RESULT_NAME, record, mode=FILE_MODE, fsync=False)
    return {}


def _engine_pid(run: Run) -> int:
    """The engine's pid as the serve command's "loading" state said it."""
    for event in reversed(run.events()):
        if event.get("type") == EventType.SERVE_STATE and isinstance(event.get("pid"), int):
            return int(event["pid"])
    return 0


def endpoint(run: Run) -> dict[str, Any]:
    """A Serve run's endpoint (url, port, pid, model), or {} before it answered."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((run.folder / ENDPOINT_NAME).read_text(encoding="utf-8"))
        if isinstance(data, dict):
            return data
    return {}


def outcome(kind: str, events: Iterable[Mapping[str, Any]], *, exit_code: int | None,
            stop_requested: bool, killed: bool) -> dict[str, Any]:
    """How a Serve or Evaluate command ended: state (finished / stopped / failed / killed), summary and
    error, from its events and exit code."""
    if kind == "download":
        return _download_outcome(events, exit_code=exit_code, stop_requested=stop_requested, killed=killed)
    failure: Mapping[str, Any] | None = None
    last_state = ""
    result = False
    said_result: Mapping[str, Any] = {}
    for event in events:
        kind_of = event.get("type")
        if kind_of == EventType.ERROR or (kind_of, event.get("state")) == (EventType.SERVE_STATE, "failed"):
            failure = event
        elif kind_of == EventType.SERVE_STATE:
            last_state = str(event.get("message") or event.get("state") or "")
        elif kind_of == EventType.RESULT:
            result, said_result = True, event
    if killed:
        return {"state": "killed", "summary": "Killed (it did not end within the grace period)"}
    if result and kind == "benchmark":
        from gaudi_gui.core.benchmark import summary_words
        return {"state": "finished", "summary": f"Finished: {summary_words(said_result)}"}
    if result and kind == "calibrate":
        from gaudi_gui.core.fp8 import summary_words as fp8_words
        return {"state": "finished", "summary": f"Finished: {fp8_words(dict(said_result))}"}
    if result:
        return {"state": "finished", "summary": "Finished: results written"}
    said = f": {last_state}" if kind == "serve" and last_state else ""
    if stop_requested:
        return {"state": "stopped", "summary": f"Stopped{said}"}
    if failure is not None or exit_code not in (0, None):
        message = str((failure or {}).get("message") or f"the {kind} command ended with code {exit_code}")
        return {"state": "failed", "summary": f"Failed: {message}", "error": message,
                "error_kind": str((failure or {}).get("kind") or "")}
    if kind == "serve":
        return {"state": "stopped", "summary": f"Stopped{said}"}
    return {"state": "failed", "summary": f"Failed: the {kinds_mod.text(kind)} ended without results"}


def _download_outcome(events: Iterable[Mapping[str, Any]], *, exit_code: int | None, stop_requested: bool,
                      killed: bool) -> dict[str, Any]:
    """How a download ended: finished with its snapshot folder, stopped, killed, or failed saying why."""
    done: Mapping[str, Any] | None = None
    failure: Mapping[str, Any] | None = None
    for event in events:
        if event.get("type") == EventType.DONE:
            done = event
        elif event.get("type") == EventType.ERROR:
            failure = event
    if done is not None and exit_code == 0:
        return {"state": "finished", "summary": f"Downloaded: {done.get('path')}"}
    if killed:
        return {"state": "killed", "summary": "Killed (it did not end within the grace period)"}
    if stop_requested:
        return {"state": "stopped", "summary": "Stopped: finished files stay in the cache; the same download "
                                               "again continues with the rest"}
    message = str((failure or {}).get("message") or f"the download ended with code {exit_code}")
    return {"state": "failed", "summary": f"Failed: {message}", "error": message,
            "error_kind": str((failure or {}).get("kind") or "")}


def spec(run: Run) -> dict[str, Any]:
    """The kind's spec.json ({} for a training run)."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((run.folder / SPEC_NAME).read_text(encoding="utf-8"))
        if isinstance(data, dict):
            return data
    return {}


__all__ = ["KINDS", "METERED_KINDS", "STOP_WORDS", "ChildJob", "create", "die_with_parent", "endpoint",
           "meter_target", "outcome", "spec", "stop_words", "take"]
