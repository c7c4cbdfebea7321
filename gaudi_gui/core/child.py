"""One way the command line runs a child that streams: its own session, its stdout decoded into a
queue of messages, its stderr kept as a bounded (redacted) tail, ended with every process it started.

Qt-free and torch-free. The app's children run through ``services.process`` (QProcess); the command
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
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
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
                 preexec: Callable[[], None] | None = None) -> None:
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self._decode = decode
        self._echo = echo
        self._merged = merge_stderr
        self.proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout or merge_stderr else None,
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
                if self._merged:
                    self._keep(raw.decode("utf-8", errors="replace").rstrip("\n"))
                if self._decode is None:
                    continue
                try:
                    message = self._decode(raw.decode("utf-8", errors="replace"))
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
        import signal

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
