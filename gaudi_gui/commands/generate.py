"""``gaudi-gui generate``: the model runner's worker from the command line (tokens to stdout, stats to
stderr). It speaks the same protocol to the same ``gaudi_gui.workers.generate`` child the tab uses.

Robustness, each covered by tests/faults/test_generate_faults.py:
- the worker's stdout and stderr are read by two threads at once, so a chatty worker (TORCH_LOGS with
  --compile writes megabytes to stderr) can never fill a pipe and deadlock both processes;
- the worker ends when this process dies, however (stdin EOF, PR_SET_PDEATHSIG);
- Ctrl+C cancels the answer, ends the worker and exits 130, quietly; a second Ctrl+C kills the worker;
- a closed stdout (``| head``) ends the worker and this process without a traceback;
- model text reaches the terminal with control characters (escape sequences) replaced.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any, NoReturn

from gaudi_gui.core import generation, paths, protocol, textclean
from gaudi_gui.core.child import Child
from gaudi_gui.core.generation import DEVICES, DTYPES, QUANTIZATIONS, GenerationParams, LoadOptions
from gaudi_gui.core.visibility import child_env

#: How long the worker gets to exit after shutdown (and after a Ctrl+C) before it is killed.
WORKER_EXIT_GRACE_S = 10.0
#: Exit code of a run whose stdout was closed by the reader (as a process killed by SIGPIPE).
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
EXIT_INTERRUPTED = 128 + signal.SIGINT


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="load a model in the worker and stream one answer",
                       description="Load a model in a worker process and stream the answer to stdout; "
                                   "timings go to stderr.")
    p.add_argument("--model", default=paths.DEMO_MODEL_ID,
                   help="Hub id, local folder, or builtin:demo (default)")
    p.add_argument("--prompt", required=True, help="the prompt (or the user message with --chat)")
    p.add_argument("--chat", action="store_true", help="use the tokenizer's chat template")
    p.add_argument("--system", default="", help="system prompt (with --chat)")
    p.add_argument("--max-new-tokens", type=int, default=128,
                   help=f"1 to {generation.MAX_NEW_TOKENS}")
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="{} to {} (with --do-sample)".format(*generation.TEMPERATURE_RANGE))
    p.add_argument("--top-p", type=float, default=0.95,
                   help="{} to {}".format(*generation.TOP_P_RANGE))
    p.add_argument("--top-k", type=int, default=50, help=f"0 (off) to {generation.MAX_TOP_K}")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="{} to {} (1.0 is off)".format(*generation.REPETITION_PENALTY_RANGE))
    p.add_argument("--num-beams", type=int, default=1, help=f"1 to {generation.MAX_BEAMS}")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string, taken literally (repeatable)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="none")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object (text + stats) at the end")
    p.add_argument("--verbose", action="store_true", help="pass the worker's log (stderr) through")

    def one_line_error(message: str) -> NoReturn:
        # argparse prints the usage block, then the error; a script reading stderr wants one line.
        print(f"gaudi-gui generate: error: {message}", file=sys.stderr)
        sys.exit(2)

    p.error = one_line_error


def _start_worker(verbose: bool) -> Child:
    """The worker child: protocol events (stdout) in its queue, its log (stderr) in a bounded tail
    (and through to our stderr with --verbose)."""
    def echo(line: str) -> None:
        sys.stderr.write(textclean.clean(line) + "\n")

    return Child([sys.executable, "-m", "gaudi_gui.workers.generate"], decode=protocol.decode,
                 env=child_env(), echo=echo if verbose else None)


def _close(worker: Child, grace_s: float = WORKER_EXIT_GRACE_S) -> int:
    """Shutdown, close its stdin, wait up to ``grace_s``, then end it; returns its exit code."""
    worker.send(generation.shutdown_command())
    worker.close_stdin()
    if worker.wait(grace_s) is None:
        return worker.end(0.0, first=signal.SIGKILL)
    worker.join()
    return int(worker.proc.returncode)


def _problems(args: argparse.Namespace, options: LoadOptions, params: GenerationParams) -> list[str]:
    problems = options.validate() + params.validate()
    if generation.prompt_problem(args.prompt):
        problems.insert(0, f"--prompt is empty: {generation.EMPTY_PROMPT}")
    return problems


def run(args: argparse.Namespace) -> int:
    options = LoadOptions(model=args.model, device=args.device, dtype=args.dtype,
                          quantization=args.quantization, compile=args.compile,
                          trust_remote_code=args.trust_remote_code)
    params = GenerationParams(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                              temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              repetition_penalty=args.repetition_penalty, num_beams=args.num_beams,
                              seed=args.seed, stop=list(args.stop))
    problems = _problems(args, options, params)
    if problems:
        print(f"gaudi-gui: error: {'; '.join(problems)}", file=sys.stderr)
        return 2

    interrupts = [0]

    def on_sigint(signum: int, frame: Any) -> None:
        interrupts[0] += 1  # handled by the event loop below; nothing else is safe in a handler

    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    worker = _start_worker(args.verbose)
    try:
        return _converse(worker, args, options, params, interrupts)
    finally:
        signal.signal(signal.SIGINT, previous_handler)


def _converse(worker: Child, args: argparse.Namespace, options: LoadOptions,
              params: GenerationParams, interrupts: list[int]) -> int:
    worker.send(generation.load_command(options))
    text: list[str] = []
    stats: dict[str, Any] = {}
    code: int | None = None
    request_id = 1
    cancelled_at: float | None = None
    broken_pipe = False
    while code is None:
        if interrupts[0] and cancelled_at is None:
            # Ctrl+C: cancel the answer and ask the worker to go; the loop waits for it to end.
            cancelled_at = time.monotonic()
            worker.send(generation.cancel_command(request_id))
            worker.send(generation.shutdown_command())
        if cancelled_at is not None and (interrupts[0] > 1
                                         or time.monotonic() - cancelled_at > WORKER_EXIT_GRACE_S):
            worker.end(0.0, first=signal.SIGKILL)
        message = worker.next_message(timeout=0.1)
        if message == {}:
            continue
        if message is None:  # the worker ended
            code = EXIT_INTERRUPTED if cancelled_at is not None else 1
            break
        kind = message.get("type")
        if kind == "loaded" and cancelled_at is None:
            print(f"loaded {message.get('model')} on {message.get('device')} in "
                  f"{float(message.get('load_s') or 0):.2f} s", file=sys.stderr)
            messages = None
            if args.chat:
                messages = [{"role": "system", "content": args.system}] if args.system else []
                messages.append({"role": "user", "content": args.prompt})
            worker.send(generation.generate_command(
                params, prompt=None if args.chat else args.prompt, messages=messages,
                request_id=request_id))
        elif kind == "token" and message.get("id") == request_id:
            piece = str(message.get("text", ""))
            text.append(piece)
            if not args.json:
                try:
                    sys.stdout.write(textclean.clean(piece))
                    sys.stdout.flush()
                except BrokenPipeError:
                    broken_pipe = True
                    code = EXIT_BROKEN_PIPE
        elif kind == "finished" and message.get("id") == request_id:
            stats = dict(message.get("stats") or {})
            code = EXIT_INTERRUPTED if cancelled_at is not None else 0
        elif kind == "error" and message.get("command") in ("load", "generate", None):
            if cancelled_at is None:
                print(f"gaudi-gui: error ({message.get('kind', 'error')}): "
                      f"{textclean.clean(str(message.get('message')))}", file=sys.stderr)
            code = EXIT_INTERRUPTED if cancelled_at is not None else 1
    if broken_pipe:
        # The reader is gone: stop the answer, and point stdout at /dev/null so the interpreter's
        # final flush does not print "Exception ignored ... BrokenPipeError".
        worker.send(generation.cancel_command(request_id))
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
    returncode = _close(worker, grace_s=2.0 if cancelled_at is not None or broken_pipe
                              else WORKER_EXIT_GRACE_S)
    if code == 1 and not stats and returncode not in (0, None):
        tail = "\n".join(worker.tail)[-1500:]
        print(f"gaudi-gui: error: the worker exited with {returncode}\n"
              f"{textclean.clean(tail)}", file=sys.stderr)
    if broken_pipe:
        return EXIT_BROKEN_PIPE
    if code == EXIT_INTERRUPTED:
        print("gaudi-gui: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        if args.json:
            print(json.dumps({"text": "".join(text), "stats": stats}))
        elif code == 0:
            print()
            print(generation.format_stats(stats), file=sys.stderr)
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code if code is not None else 1
