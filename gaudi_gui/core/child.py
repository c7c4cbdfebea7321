"""One way the command line runs a child that streams: its own session, its stdout decoded into a
queue of messages, its stderr kept as a bounded (redacted) tail, ended with every process it started.

Qt-free and torch-free. The agent's children run through ``agent/children.py``; the command
line's streaming children (the runner's worker, the evaluator, a download, the serve engine, a command
forwarded to a host) run through :class:`Child`, so "Popen + a reader thread per stream + a tail + a
tree kill" is written once.

- The child is started in a session of its own (``start_new_session``): ending it signals its process
  group and every descendant recorded (``core.proctree.ProcessTree``), so a helper it left behind does
  not outlive it, and a Ctrl+C in the terminal reaches only us (we decide how the child ends).
- stdout: each line goes through ``decode`` (a protocol's decoder: ``None`` for a line that is not a
  message); messages go into :attr:`messages`; ``None`` is put there once at EOF. A line ``decode``
  cannot read is skipped, never the end of the reading.
- stderr: lines (``\\r`` progress reduced to its last part) in :attr:`tail` after redaction of
  credentials; ``echo`` gets every line as it comes, as written (``--verbose`` passes the log
  through; a command forwarded to a host relays the host's stderr).
- ``merge_stderr``: one stream for a child whose two streams are one log (the serve engine): stderr
  joins stdout in the order written, and each line is decoded, echoed and kept in the tail.
- ``preexec``: run in the child before its program (``core.jobkind.die_with_parent``: the kernel
  ends it when this process dies, even by SIGKILL).
- ``keep_stdout``: stdout kept whole as well (:meth:`Child.output`): a child that prints one report
  (the doctor's ``--json``). :func:`run` runs such a child to its end on the
  calling thread, with a deadline and a stop flag: the app's doctors run it on a thread of their own.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from gaudi_gui.core.proctree import ProcessTree
from gaudi_gui.core.secrets import redact

Decoder = Callable[[str], "dict[str, Any] | None"]


class Child:
    """A started child (``OSError`` from the constructor when it cannot start)."""

    def __init__(self, argv: Sequence[str], *, decode: Decoder | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | None = None, stdin: bool = True,
                 stdout: bool = True, tail_lines: int = 40,
                 echo: Callable[[str], None] | None = None, merge_stderr: bool = False,
                 preexec: Callable[[], None] | None = None, keep_stdout: bool = False) -> None:
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self._decode = decode
        self._echo = echo
        self._merged = merge_stderr
        self._out: list[str] | None = [] if keep_stdout else None
        self.proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout or merge_stderr or keep_stdout else None,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
            preexec_fn=preexec)  # noqa: PLW1509 - the caller's (die_with_parent checks the threads)
        self.tree = ProcessTree(self.proc.pid)  # start_new_session: its group id is its pid
        self._readers = [] if merge_stderr else [
            threading.Thread(target=self._read_log, args=(self.proc.stderr,), name="child-stderr",
                             daemon=True)]
        if self.proc.stdout is not None:
            self._readers.append(threading.Thread(target=self._read_messages, args=(self.proc.stdout,),
                                                  name="child-stdout", daemon=True))
        for reader in self._readers:
            reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_messages(self, stream: IO[bytes]) -> None:
        try:
            for raw in stream:
                text = raw.decode("utf-8", errors="replace")
                if self._merged:
                    self._keep(text.rstrip("\n"))
                if self._out is not None:
                    self._out.append(text)
                if self._decode is None:
                    continue
                try:
                    message = self._decode(text)
                except Exception:  # a corrupt line is skipped, never the end of the reading
                    continue
                if message is not None:
                    self.messages.put(message)
        except (OSError, ValueError):  # the stream was closed under us (end with helpers holding it)
            pass
        finally:
            self.messages.put(None)

    def _read_log(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in stream:
                self._keep(raw.decode("utf-8", errors="replace").rstrip("\n"))

    def _keep(self, text: str) -> None:
        """A log line: to ``echo`` as written, to the tail redacted (its last ``\\r`` part)."""
        if self._echo is not None:
            with contextlib.suppress(OSError, ValueError):
                self._echo(text)
        line = redact(text.rsplit("\r", 1)[-1])
        if line.strip():
            self.tail.append(line)

    def next_message(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message; ``{}`` when none came within ``timeout``; ``None`` at EOF (and after)."""
        try:
            message = self.messages.get(timeout=timeout)
        except queue.Empty:
            return {}
        if message is None:
            self.messages.put(None)  # every later call sees EOF too
        return message

    def output(self) -> str:
        """What the child wrote on stdout so far (``keep_stdout``), as decoded."""
        return "".join(self._out or [])

    def ended(self, timeout: float) -> bool:
        """True once the child has exited and both its streams are read to the end (waits up to
        ``timeout`` s for that)."""
        deadline = time.monotonic() + timeout
        if self.wait(timeout) is None:
            return False
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        return not any(reader.is_alive() for reader in self._readers)

    def send(self, line: str) -> bool:
        """One line to the child's stdin; False once it is closed or the child is gone."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((line.rstrip("\n") + "\n").encode("utf-8"))
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError, AssertionError):
            return False

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.proc.stdin.close()  # type: ignore[union-attr]

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None when it is still running after ``timeout``."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def end(self, grace_s: float, *, first: int | None = None) -> int:
        """End the child and everything it started: ``first`` (SIGTERM by default) to its group and
        recorded descendants, SIGKILL to what is left after ``grace_s``; its exit code."""
        if self.proc.poll() is None:
            self.tree.record()
            sig = signal.SIGTERM if first is None else first
            self.tree.signal(sig)
            self.tree.signal_recorded(sig)
            if self.wait(grace_s) is None:
                self.tree.kill()
        else:
            self.tree.kill()  # helpers of a child that has ended
        code = self.proc.wait()
        self.join()
        return code

    def join(self, timeout: float = 2.0) -> None:
        """Let the readers finish what the child wrote (bounded: a helper may hold a pipe)."""
        for reader in self._readers:
            reader.join(timeout=timeout)

    def tail_text(self, lines: int = 20) -> str:
        return "\n".join(list(self.tail)[-lines:])


#: How often :func:`run` looks at its deadline and its stop flag while the child runs.
_POLL_S = 0.2


@dataclass(frozen=True)
class Outcome:
    """A child run to its end by :func:`run`."""

    #: Its stdout, whole.
    stdout: str = ""
    #: Its exit code (negative: the signal that ended it); None: it did not start (``tail`` says why).
    code: int | None = None
    #: The last lines of both streams (credentials redacted).
    tail: tuple[str, ...] = ()
    #: It was killed at its deadline (not when ``stop`` was set).
    timed_out: bool = False


def run(argv: Sequence[str], timeout_s: float, *, stop: threading.Event | None = None, tail_lines: int = 40,
        started: Callable[[Child], object] | None = None) -> Outcome:
    """Run ``argv`` (stdin closed) to its end on the calling thread: its stdout kept whole, the last
    ``tail_lines`` of both streams (stdout's, then stderr's: a crash's traceback comes last); killed with
    every process it started at ``timeout_s``, as soon as ``stop`` is set, or when it ended by a signal
    (its helpers with it). ``started`` gets the running child (another thread may then signal its group
    at once rather than wait for ``stop`` to be seen).

    Never raises for the child: one that cannot start is an ``Outcome`` with ``code`` None."""
    program = shutil.which(argv[0])
    try:
        if program is None:
            raise FileNotFoundError(f"'{argv[0]}' was not found; is it installed?")
        child = Child([program, *argv[1:]], stdin=False, keep_stdout=True, tail_lines=tail_lines)
    except OSError as exc:
        return Outcome(tail=(f"could not start {argv[0]}: {exc.strerror or exc}",))
    except Exception as exc:  # a NUL in an argument (ValueError), ...: still an Outcome, never a raise
        return Outcome(tail=(f"could not start {argv[0]}: {type(exc).__name__}: {exc}",))
    if started is not None:
        started(child)
    deadline = time.monotonic() + timeout_s
    stopped = timed_out = False
    while not child.ended(min(_POLL_S, max(0.0, deadline - time.monotonic()))):
        stopped = stop is not None and stop.is_set()
        timed_out = not stopped and time.monotonic() >= deadline
        if stopped or timed_out:
            break
    code = child.poll()
    if stopped or timed_out or code is None or code < 0:
        # Past its time, asked to stop, or killed (its helpers, some perhaps in sessions of their own
        # or holding its pipes, go too).
        code = child.end(0, first=signal.SIGKILL)
    out = child.output()
    said = [redact(line.rsplit("\r", 1)[-1]) for line in out.splitlines()[-tail_lines:]]
    return Outcome(out, code, tuple([line for line in said if line.strip()] + list(child.tail))[-tail_lines:],
                   timed_out)
