"""``transformers serve`` with exact token counts: ``python -m gaudi_gui.workers.transformers_serve serve …``.

Runs transformers' own serve CLI in this process (the arguments are those of the ``transformers``
command: ``serve`` and what follows) and counts every token its serving runner counts. ``transformers
serve`` prints no token counts (its uvicorn access log has none; its only token figure is a rate line
every 10 s of activity, from ``GenerateRunner.count_tokens``), so the run meter's Wh per 1,000 tokens
had nothing to divide by. Here ``GenerateRunner.count_tokens`` (``transformers.cli.serving.utils``;
continuous batching's runner inherits it) is wrapped to keep running totals of the prompt tokens
received and the tokens generated, which are printed as protocol lines (``core.protocol``) on the
engine's stdout, which ``gaudi-gui serve`` reads:

- ``serve_tokens`` with ``pid``, ``prompt_tokens``, ``completion_tokens``: the totals of the process
  that generates (the model's process), when it starts (0, 0: it counts), at most once a second while
  they change, and once more when it gets SIGTERM (then it dies of it as it would have), so the tokens
  of the last second before a stop are not lost. Each line is one ``os.write`` (whole, under
  PIPE_BUF): the server's own process writes to the same pipe.
- ``serve_tokens`` with ``counting: false`` and ``why``: this transformers has no such hook point
  (another version); the server runs as it is and the meter says "not measured" with that reason.

The model runs in a process transformers *spawns* (``multiprocessing``'s spawn: a fresh interpreter),
so a wrap made here at run time would not reach it. Spawn imports the parent's main module in the
child first (as ``__mp_main__``, for ``python -m`` its module name), before it unpickles what to run:
the wrap is made when this module is imported, so it is made in every process of the server.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
import threading
from typing import Any

from gaudi_gui.core import protocol
from gaudi_gui.core.events import EventType

#: At most one line a second while the totals change (the last totals are written at SIGTERM too).
REPORT_EVERY_S = 1.0


class Tally:
    """This process's running totals, and the thread that reports them when they change."""

    def __init__(self) -> None:
        # Reentrant: the SIGTERM handler runs on the main thread, which may be inside ``add``.
        self.lock = threading.RLock()
        self.prompt = self.generated = 0
        self.changed = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, prompt: int, generated: int) -> None:
        with self.lock:
            self.prompt += max(int(prompt), 0)
            self.generated += max(int(generated), 0)
            if self._thread is None:
                self._thread = threading.Thread(target=self._report_changes, name="token-tally",
                                                daemon=True)
                self._thread.start()
        self.changed.set()

    def report(self) -> None:
        """One line with the totals (one write, no lock of Python's I/O: a signal handler calls it)."""
        with self.lock:
            line = protocol.event(EventType.SERVE_TOKENS, pid=os.getpid(), prompt_tokens=self.prompt,
                                  completion_tokens=self.generated)
        with contextlib.suppress(OSError):
            os.write(1, (line + "\n").encode("utf-8"))

    def _report_changes(self) -> None:
        while True:
            self.changed.wait()
            self.changed.clear()
            self.report()
            threading.Event().wait(REPORT_EVERY_S)  # what changes meanwhile goes in the next line


TALLY = Tally()


def install() -> str:
    """Wrap the serving runner's ``count_tokens``; why it cannot be done ('' when done)."""
    try:
        import transformers
        from transformers.cli.serving import utils as serving
    except Exception as exc:  # any import failure is a reason, said: the server may still run
        return f"transformers' serving code cannot be imported here ({type(exc).__name__}: {exc})"
    version = getattr(transformers, "__version__", "?")
    runner = getattr(serving, "GenerateRunner", None)
    count = getattr(runner, "count_tokens", None) if isinstance(runner, type) else None
    if runner is None or not callable(count):
        return (f"transformers {version} has no GenerateRunner.count_tokens in "
                "transformers.cli.serving.utils (the hook point this counter wraps)")
    if getattr(count, "_gaudi_gui_counted", False):
        return ""  # this module imported twice (as __main__ and by name): wrapped once
    try:
        names = set(inspect.signature(count).parameters)
    except (TypeError, ValueError):
        names = set()
    if not {"prompt", "generated"} <= names:
        return (f"transformers {version}'s GenerateRunner.count_tokens takes no prompt/generated counts "
                "(the hook point changed)")
    overriding = [name for name, value in vars(serving).items()
                  if isinstance(value, type) and issubclass(value, runner) and value is not runner
                  and "count_tokens" in vars(value)]
    if overriding:
        return (f"transformers {version}'s {', '.join(overriding)} count tokens their own way "
                "(the hook point changed)")

    def count_tokens(self: Any, prompt: int = 0, generated: int = 0) -> None:
        count(self, prompt=prompt, generated=generated)
        TALLY.add(prompt, generated)

    count_tokens._gaudi_gui_counted = True  # type: ignore[attr-defined]
    count_tokens.__doc__ = count.__doc__
    runner.count_tokens = count_tokens
    return ""


#: What streaming clients are told when the model's process ended on a stop signal: transformers calls
#: any end it did not cause "The model's process crashed (exit code -15)". SIGTERM is how a stop reaches
#: it (``gaudi-gui serve``'s Ctrl-C / SIGTERM, ``runs stop``, the kernel when its owner died), SIGINT a
#: Ctrl-C in the terminal: neither is a crash.
STOPPED_REASON = ("The server was stopped (its model's process ended on {signal}): this answer ends here; "
                  "it is not a crash.")


def install_stop_words() -> str:
    """Have a model's process that ended on SIGTERM or SIGINT said as stopped, not crashed; why it
    cannot be done ('' when done)."""
    try:
        from transformers.cli.serving import model_manager
    except Exception as exc:  # said, and the server runs as it is
        return f"transformers' model manager cannot be imported ({type(exc).__name__}: {exc})"
    client = getattr(model_manager, "EngineClient", None)
    mark_dead = getattr(client, "_mark_dead", None) if isinstance(client, type) else None
    if not isinstance(client, type) or not callable(mark_dead):
        return "transformers' EngineClient has no _mark_dead (the hook point changed)"
    if getattr(mark_dead, "_gaudi_gui_stopped", False):
        return ""
    stops = {-int(signal.SIGTERM): "SIGTERM", -int(signal.SIGINT): "SIGINT"}

    def _mark_dead(self: Any, reason: str) -> None:
        process = getattr(self, "managed_process", None)
        code = getattr(process, "exitcode", None)
        if isinstance(code, int) and code in stops and "crashed" in reason:
            reason = STOPPED_REASON.format(signal=stops[code])
        mark_dead(self, reason)

    _mark_dead._gaudi_gui_stopped = True  # type: ignore[attr-defined]
    client._mark_dead = _mark_dead  # type: ignore[attr-defined]
    return ""


def install_request_checks() -> str:
    """A request of the wrong shape (``"messages": "hello"``) answered 400 with what is wrong, where
    transformers serve answered a bare 500 (its code indexes what it did not check); why it cannot be
    done ('' when done)."""
    from gaudi_gui.core.serve import chat_request_problem, completion_request_problem
    try:
        from fastapi import HTTPException
        from transformers.cli.serving import chat_completion, completion
    except Exception as exc:
        return f"transformers' request handlers cannot be imported ({type(exc).__name__}: {exc})"
    done = []
    for module, name, check in ((chat_completion, "ChatCompletionHandler", chat_request_problem),
                                (completion, "CompletionHandler", completion_request_problem)):
        handler = getattr(module, name, None)
        validate = getattr(handler, "_validate_request", None) if isinstance(handler, type) else None
        if not callable(validate) or getattr(validate, "_gaudi_gui_checked", False):
            continue

        def _validate_request(self: Any, body: dict, _validate: Any = validate, _check: Any = check) -> None:
            problem = _check(body)
            if problem:
                raise HTTPException(status_code=400, detail=problem)
            _validate(self, body)

        _validate_request._gaudi_gui_checked = True  # type: ignore[attr-defined]
        handler._validate_request = _validate_request  # type: ignore[union-attr]
        done.append(name)
    return "" if done else "transformers' request handlers have no _validate_request (the hook point changed)"


def _on_sigterm(signum: int, frame: object) -> None:
    """The last totals, then the death SIGTERM means (as without this handler)."""
    TALLY.report()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _in_spawned_child() -> None:
    """In a process the server spawned (the model's, or an API server's): say that it counts (0, 0)
    and write the last totals at SIGTERM. An API server counts nothing: its zeros add nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    TALLY.report()


WHY_NOT = install()
# The server's own words (a stop said as stopped, a malformed request as a 400): an engine of another
# transformers goes on without them.
WORDS_NOT = [why for why in (install_stop_words(), install_request_checks()) if why]
# Spawn imports the parent's main module under this name (its ``parent_process()`` is not set yet then).
if not WHY_NOT and __name__ == "__mp_main__":
    _in_spawned_child()


#: transformers 5.25's continuous batching runner adds its generated tokens to the stats outside
#: ``count_tokens`` (in ``_collect_output``): with it, the count would miss them. gaudi-gui serve never
#: asks for it; given by hand, the tokens are said to be uncounted rather than counted short.
CONTINUOUS_BATCHING_WHY = ("continuous batching (--continuous-batching) counts its generated tokens outside "
                           "GenerateRunner.count_tokens, the hook point this counter wraps")


def why_not_counted(argv: list[str]) -> str:
    """Why this server's tokens will not be counted ('' when they will)."""
    if WHY_NOT:
        return WHY_NOT
    options = argv[:argv.index("--")] if "--" in argv else argv
    return CONTINUOUS_BATCHING_WHY if "--continuous-batching" in options else ""


def main(argv: list[str]) -> int:
    why = why_not_counted(argv)
    if why:
        line = protocol.event(EventType.SERVE_TOKENS, counting=False, why=why)
        os.write(1, (line + "\n").encode("utf-8"))
    from transformers.cli.transformers import app

    # transformers' own CLI (its exit is click's), less its check for a newer release (no network here)
    app(args=argv, prog_name="transformers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
