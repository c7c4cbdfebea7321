"""A run's event file, ``<run>/events.jsonl``: what the training worker tells the app.

The worker appends one JSON object per line (phases, metrics, checkpoints, errors, the end), each
with ONE ``os.write`` on a file opened with ``O_APPEND``: Linux appends a regular-file write as a
whole, so ranks (or a rank and a crashing library) can never interleave inside a line, as they do on
a shared stdout pipe where a ``print()`` is two writes. The live view and a re-attached view read
the same file with ``EventFollower``, so a re-attached run looks exactly like a live one.

Qt-free and torch-free.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from gaudi_gui.core.protocol import json_safe as _clean

EVENTS_NAME = "events.jsonl"
#: A line longer than this is not an event (a corrupt or hostile file must not exhaust memory).
MAX_EVENT_BYTES = 1 << 20
#: The vocabulary's version, written into every event as ``"v"`` (a line without it is version 1: the
#: runs of earlier releases). A new type or field keeps the version; a changed meaning bumps it.
EVENTS_VERSION = 1


class EventType(str, Enum):
    """Every type of event a run's worker writes, with its fields. A ``str`` Enum: members equal the
    strings on disk, so ``event["type"] == EventType.METRICS`` reads an old run's file too. Readers
    ignore a type they do not know (a newer worker's)."""

    PHASE = "phase"  # phase (loading, resuming, evaluating, finishing), message
    DATASET_READY = "dataset_ready"  # kind, rows, dropped...
    TRAINING_STARTED = "training_started"  # max_steps, world_size, start_step (a resume's step)
    METRICS = "metrics"  # rank 0's logging step: core.metrics.metric_record is its record
    #: step, max_steps: the logging step as the first rank of each *other* machine of a multi-machine
    #: run sees it (machine i's own folder gets no METRICS): its run meter times its compile meter by it
    STEP = "step"
    CHECKPOINT_SAVING = "checkpoint_saving"  # step
    CHECKPOINT_SAVED = "checkpoint_saved"  # step, path, seconds
    STOP_REQUESTED = "stop_requested"  # signal, phase
    ERROR = "error"  # kind, message
    FINISHED = "finished"  # global_step, max_steps, final_loss, checkpoint, final_dir
    STOPPED = "stopped"  # the same, and before_training
    # Serve (commands/serve.py --events; a serve run's events.jsonl)
    SERVE_STATE = "serve_state"  # state (starting loading warming ready reconnecting stopping stopped
    #                              failed), message; loading: pid, engine, reason; failed: lines
    SERVE_PROGRESS = "serve_progress"  # phase, step, total, fraction, eta_s (vLLM's warm-up)
    SERVE_URL = "serve_url"  # url, model (the id requests name), name (the model as the user chose
    #                          it), context (the longest request, prompt and answer, in tokens, where
    #                          known), host on a host: the endpoint answers
    SERVE_REQUEST = "serve_request"  # time, method, path, status (core.serve.RequestRecord)
    #: the engine's own token counter (transformers serve: workers/transformers_serve): counting,
    #: prompt_tokens, completion_tokens (running totals since the start), source; counting false: why
    SERVE_TOKENS = "serve_tokens"
    # Evaluate (commands/eval.py --events, workers/evaluate.py; an evaluate run's events.jsonl);
    # PHASE (message) and ERROR (kind, message, field, exit_code, last_lines) are shared
    EVAL_STARTED = "eval_started"  # label, base, tuned, adapter, prompts, references, tasks
    PROGRESS = "progress"  # done, total (rows of both models); a download: bytes_done, bytes_total, rate...
    ANSWER = "answer"  # source, i, prompt, model, text, reference, ttft_s, tokens_per_s, new_tokens, scores
    MODEL_RESULT = "model_result"  # model, metrics, tasks, mean ttft and tokens/s
    RESULT = "result"  # the result record as written (core.evaluation), path, answers
    DONE = "done"  # the worker has said all (Evaluate writes the results after it; a download: path)
    # Download (workers/download.py, commands/download.py --json; a download run's events.jsonl);
    # PROGRESS, DONE and ERROR (kind, message) are shared
    STARTED = "started"  # pid, repo_id, xet
    PLAN = "plan"  # core.hub.Plan: files, total_bytes, remaining_bytes, free_bytes, cache_dir...
    ATTEMPT = "attempt"  # attempt, attempts, xet, files_left, bytes_left, partial_bytes
    STALLED = "stalled"  # seconds without a byte
    RETRY = "retry"  # attempt, reason, delay_s, xet_disabled
    RESUMED = "resumed"  # filename, bytes, size (a partial file continued)
    VERIFIED = "verified"  # files, bytes, seconds
    VERIFY_FAILED = "verify_failed"  # files (filename, result, message)
    # Benchmark (commands/benchmark.py --events, workers/benchmark.py; a benchmark run's events.jsonl);
    # PHASE, PROGRESS, RESULT (core.benchmark's result record) and ERROR are shared
    BENCH_PLAN = "bench_plan"  # rank, card, workloads, repeats
    BENCH_DEVICE = "bench_device"  # rank, card, device, name, torch, threads
    BENCH_SAMPLE = "bench_sample"  # workload, card, rank, repeat, value, unit
    # The run meter (core.meter) while a run trains: core.compile_rise's finding (kind, message, fix…)
    WARNING = "warning"

    def __str__(self) -> str:
        """The word on disk (as ``StrEnum`` says it, on Python 3.10 too): an f-string or ``str()`` of a
        member writes "done", never "EventType.DONE"."""
        return str(self.value)


def encode(event: Mapping[str, Any]) -> bytes:
    """One event line, newline included, as the bytes of one write."""
    if not isinstance(event.get("type"), str):
        raise ValueError("an event needs a string 'type'")
    text = json.dumps(_clean(event), separators=(",", ":"), ensure_ascii=False, default=str)
    return (text + "\n").encode("utf-8")


class EventWriter:
    """Appends events to a file, one atomic write each; private to the user (mode 0600)."""

    def __init__(self, path: str | Path, *, rank: int = 0) -> None:
        self.path = Path(path)
        self.rank = rank
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, event_type: str | EventType, **fields: Any) -> None:
        data = encode({"type": str(event_type), "v": EVENTS_VERSION,
                       "rank": self.rank, "time": round(time.time(), 3), **fields})
        view = memoryview(data)
        # A regular-file write is whole unless the disk is full or a signal interrupts it midway;
        # finish a short write rather than leave half a line.
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode(line: str | bytes) -> dict[str, Any] | None:
    """The event on one line, or None when it is not one (blank, cut, corrupt, hostile)."""
    if isinstance(line, bytes):
        if len(line) > MAX_EVENT_BYTES:
            return None
        line = line.decode("utf-8", errors="replace")
    text = line.strip()
    if not text.startswith("{") or len(text) > MAX_EVENT_BYTES:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return None
    return value


class EventFollower:
    """Reads the complete lines appended to an event file since the last call (a cut last line
    waits for its end), from the start or from a given offset."""

    def __init__(self, path: str | Path, offset: int = 0) -> None:
        self.path = Path(path)
        self.offset = offset
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_EVENT_BYTES:
            self._partial = b""
        return [e for e in (decode(line) for line in lines) if e is not None]


class LogFollower:
    """Reads the complete console lines appended to a log file since the last call (a cut last line
    waits for its end), each as a terminal shows it at its end: the last of its carriage-return
    rewrites (tqdm redraws its bar with them), not one line per redraw."""

    def __init__(self, path: str | Path, offset: int = 0) -> None:
        self.path = Path(path)
        #: How far the file has been read (a cut last line included).
        self.offset = offset
        self._partial = b""

    @property
    def end(self) -> int:
        """The offset just past the last complete line read (where a new follower would go on)."""
        return self.offset - len(self._partial)

    def read(self, limit: int | None = None) -> list[str]:
        """The new complete lines; ``limit``: read at most that many bytes this time."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read() if limit is None else fh.read(limit)
        except OSError:
            return []
        if not data:
            return []
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [line.rstrip(b"\r").rsplit(b"\r", 1)[-1].decode("utf-8", errors="replace") for line in lines]


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Every complete event in a file."""
    return EventFollower(path).read()


__all__ = ["EVENTS_NAME", "EVENTS_VERSION", "EventFollower", "EventType", "EventWriter",
           "LogFollower", "decode", "encode", "read_events"]
