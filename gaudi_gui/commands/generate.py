"""``gaudi-gui generate``: the model runner's worker from the command line (tokens to stdout, stats to
stderr). It speaks the same protocol to the same ``gaudi_gui.workers.generate`` child the tab uses."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import IO, Any

from gaudi_gui.core import generation, paths, protocol
from gaudi_gui.core.generation import DEVICES, DTYPES, QUANTIZATIONS, GenerationParams, LoadOptions
from gaudi_gui.core.visibility import child_env


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="load a model in the worker and stream one answer",
                       description="Load a model in a worker process and stream the answer to stdout; "
                                   "timings go to stderr.")
    p.add_argument("--model", default=paths.DEMO_MODEL_ID,
                   help="Hub id, local folder, or builtin:demo (default)")
    p.add_argument("--prompt", required=True, help="the prompt (or the user message with --chat)")
    p.add_argument("--chat", action="store_true", help="use the tokenizer's chat template")
    p.add_argument("--system", default="", help="system prompt (with --chat)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--num-beams", type=int, default=1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="none")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object (text + stats) at the end")


def _events(stream: IO[str]) -> Iterator[dict[str, Any]]:
    for line in stream:
        try:
            message = protocol.decode(line)
        except protocol.ProtocolError:
            continue
        if message is not None:
            yield message


def run(args: argparse.Namespace) -> int:
    options = LoadOptions(model=args.model, device=args.device, dtype=args.dtype,
                          quantization=args.quantization, compile=args.compile,
                          trust_remote_code=args.trust_remote_code)
    params = GenerationParams(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                              temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              repetition_penalty=args.repetition_penalty, num_beams=args.num_beams,
                              seed=args.seed, stop=list(args.stop))
    problems = options.validate() + params.validate()
    if problems:
        for problem in problems:
            print(f"gaudi-gui: error: {problem}", file=sys.stderr)
        return 2
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui.workers.generate"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            env=child_env(), bufsize=1)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(generation.load_command(options) + "\n")
    proc.stdin.flush()
    text: list[str] = []
    stats: dict = {}
    code = 1
    try:
        for message in _events(proc.stdout):
            kind = message.get("type")
            if kind == "loaded":
                print(f"loaded {message.get('model')} on {message.get('device')} in "
                      f"{message.get('load_s', 0):.2f} s", file=sys.stderr)
                messages = None
                if args.chat:
                    messages = ([{"role": "system", "content": args.system}] if args.system else [])
                    messages.append({"role": "user", "content": args.prompt})
                command = generation.generate_command(
                    params, prompt=None if args.chat else args.prompt, messages=messages, request_id=1)
                proc.stdin.write(command + "\n")
                proc.stdin.flush()
            elif kind == "token":
                piece = str(message.get("text", ""))
                text.append(piece)
                if not args.json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            elif kind == "finished":
                stats = dict(message.get("stats") or message)
                code = 0
                break
            elif kind == "error":
                print(f"gaudi-gui: error ({message.get('kind', 'error')}): {message.get('message')}",
                      file=sys.stderr)
                code = 1
                break
    except KeyboardInterrupt:
        proc.stdin.write(generation.cancel_command() + "\n")
        code = 130
    finally:
        try:
            proc.stdin.write(generation.shutdown_command() + "\n")
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if code == 1 and not stats and proc.returncode not in (0, None):
        tail = (proc.stderr.read() if proc.stderr else "")[-1500:]
        print(f"gaudi-gui: error: the worker exited with {proc.returncode}\n{tail}", file=sys.stderr)
    if args.json:
        print(json.dumps({"text": "".join(text), "stats": stats}))
    elif code == 0:
        print()
        print(generation.format_stats(stats), file=sys.stderr)
    return code
