"""``gaudi-gui eval``: base vs tuned on the user's prompts, references scored, perplexity and lm-eval
tasks; the results kept with the run (``<run>/eval/<stamp>.json`` and ``<stamp>-answers.jsonl``).

The model work runs in ``gaudi_gui.workers.evaluate`` (a child); this command checks the input first
(``core.evaluation.validate``: exit 2 with the field and a sentence), hands the worker the rows, relays
its events (``--events``: protocol lines, what the app's Evaluate view follows), and writes the results.
Exit 0; 2 bad input (also an unknown lm-eval task, or one that needs the network: refused before a
model loads); 1 a model failed to load or run.

``--host DEST``: the same command runs on the host through ``core.placement`` (ssh, under the guard, so
a dropped connection or a killed app leaves nothing running there); the run, the files and the results
are the host's, and the results stay in the host's run folder (its path is printed).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import IO, Any, NoReturn

from gaudi_gui.commands.flags import add_detach_arguments
from gaudi_gui.core import evaluation as ev
from gaudi_gui.core import protocol, textclean
from gaudi_gui.core.visibility import child_env

#: Options of the form fields (core.evaluation's field names) as the command line spells them.
OPTION_OF = {"run": "--run", "model": "--model", "adapter": "--adapter", "base": "--base",
             "prompts": "--prompt", "prompts_file": "--prompts", "data": "--data",
             "prompt_column": "--prompt-column", "reference_column": "--reference-column",
             "metrics": "--metrics", "tasks": "--tasks", "include_path": "--include-path",
             "max_rows": "--max-rows", "max_new_tokens": "--max-new-tokens", "chat": "--chat",
             "output": "--output"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a tuned model against its base (prompts, references, "
                                    "perplexity, lm-eval tasks)",
                       description="Compare a run's tuned model (its LoRA adapter over its base, "
                                   "unmerged, or its final model) with the base model on the same "
                                   "prompts; score answers against references (exact match, ROUGE-L, "
                                   "BLEU), perplexity, and lm-evaluation-harness tasks that exist "
                                   "offline. Results go to the run folder's eval/.")
    # Not a required group: "give a run or a model" is said by core.evaluation.validate, at the field.
    which = p.add_mutually_exclusive_group()
    which.add_argument("--run", default="", help="a run folder, or a run's name under the runs folder")
    which.add_argument("--model", default="", help="a model folder, Hub id or adapter folder (no run)")
    p.add_argument("--adapter", default="", help="a LoRA adapter applied over the --model (unmerged)")
    p.add_argument("--base", default="", help="the base model compared with (default: the run's or the "
                                              "adapter's base)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", default="", metavar="FILE",
                   help="prompts: JSONL (strings or objects with --prompt-column) or one per line")
    p.add_argument("--data", default="", metavar="FILE", help="references JSONL (prompt and reference "
                                                              "columns)")
    p.add_argument("--prompt-column", default="prompt")
    p.add_argument("--reference-column", default="reference")
    p.add_argument("--metrics", default="exact_match,rouge,bleu",
                   help=f"comma-separated: {', '.join(ev.METRICS)} (perplexity on --data's text)")
    p.add_argument("--tasks", default="", help="lm-eval tasks, comma-separated (offline only)")
    p.add_argument("--include-path", default="", metavar="DIR", help="a folder of local lm-eval task YAMLs")
    p.add_argument("--max-rows", type=int, default=0, help="rows read per file and per task (0: all)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat", choices=ev.CHAT_MODES, default="auto",
                   help="format prompts with the chat template: auto (as the run trained: prompt/completion "
                        "or chat rows), on, off")
    p.add_argument("--output", default="", metavar="DIR",
                   help="where a --model evaluation's results go (default: the data folder's evals/; a "
                        "run's go to its folder)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--events", action="store_true",
                   help="print progress and results as protocol lines (what the app follows)")
    add_detach_arguments(p, "evaluate")

    def one_line_error(message: str) -> NoReturn:
        print(f"gaudi-gui eval: error: {message}", file=sys.stderr)
        sys.exit(ev.EXIT_BAD_INPUT)

    p.error = one_line_error


def spec_of(args: argparse.Namespace) -> ev.EvalSpec:
    return ev.EvalSpec(run=args.run, model=args.model, adapter=args.adapter, base=args.base,
                       prompts=list(args.prompt), prompts_file=args.prompts, data=args.data,
                       prompt_column=args.prompt_column, reference_column=args.reference_column,
                       metrics=[m.strip() for m in args.metrics.split(",") if m.strip()],
                       tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
                       include_path=args.include_path, max_rows=args.max_rows,
                       max_new_tokens=args.max_new_tokens, seed=args.seed, output=args.output,
                       chat=args.chat)


def _absolute(spec: ev.EvalSpec) -> ev.EvalSpec:
    """``spec`` with its local files and folders as absolute paths (a detached job may run elsewhere)."""
    import dataclasses
    fixed = {name: os.path.abspath(value) for name in ("prompts_file", "data", "include_path", "output")
             if (value := getattr(spec, name)) and os.path.exists(value)}
    if spec.run and os.path.isdir(spec.run):
        fixed["run"] = os.path.abspath(spec.run)
    return dataclasses.replace(spec, **fixed)


def _emit(events: bool, event_type: str, /, **fields: Any) -> None:
    if events:
        protocol.write_line(sys.stdout, protocol.encode({"type": event_type, **fields}))


def _refuse(args: argparse.Namespace, field: str, message: str) -> int:
    option = OPTION_OF.get(field, f"--{field.replace('_', '-')}")
    print(f"gaudi-gui eval: {option}: {message}", file=sys.stderr)
    _emit(args.events, "error", kind="bad_input", field=field, message=message)
    return ev.EXIT_BAD_INPUT


def run(args: argparse.Namespace) -> int:
    spec = spec_of(args)
    host = (getattr(args, "host", "") or "").strip()
    remote = bool(host and host != "local")
    problems = [] if remote else ev.validate(spec)
    if problems:
        for field, message in problems[1:]:
            print(f"gaudi-gui eval: {OPTION_OF.get(field, field)}: {message}", file=sys.stderr)
        return _refuse(args, *problems[0])
    if args.detach and remote:
        return _detach_on_host(args, spec)
    if args.detach:
        from gaudi_gui.commands.detach import detach_command
        words = _absolute(spec).cli_args()
        subject = os.path.basename(spec.run.rstrip("/")) or os.path.basename(spec.model.rstrip("/"))
        return detach_command("eval", "evaluate", words, name=f"eval-{subject or 'model'}",
                              runs_dir=args.runs_dir, as_json=args.json)
    if remote:
        return _on_host(args, spec)
    try:
        target = ev.resolve(spec)
        prompts = list(spec.prompts)
        if spec.prompts_file:
            prompts += ev.read_prompts(spec.prompts_file, spec.prompt_column, spec.max_rows)
        references = ev.read_references(spec.data, spec.prompt_column, spec.reference_column,
                                        spec.max_rows) if spec.data else []
    except ev.EvalInputError as exc:
        return _refuse(args, exc.field, str(exc))
    if spec.max_rows:
        prompts = prompts[:spec.max_rows]
    job = {"target": target.to_dict(), "prompts": prompts, "references": references,
           "metrics": spec.metrics, "tasks": spec.tasks, "include_path": spec.include_path,
           "max_rows": spec.max_rows, "max_new_tokens": spec.max_new_tokens, "seed": spec.seed,
           "chat": spec.chat}
    _emit(args.events, "eval_started", label=target.label, base=target.base_model,
          tuned=target.tuned_model, adapter=target.adapter, prompts=len(prompts),
          references=len(references), tasks=spec.tasks)
    return _evaluate(args, spec, target, job)


def _evaluate(args: argparse.Namespace, spec: ev.EvalSpec, target: ev.Target, job: dict[str, Any]) -> int:
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui.workers.evaluate"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
    tail: collections.deque[str] = collections.deque(maxlen=30)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    reader = threading.Thread(target=_read_tail, args=(proc.stderr, tail), daemon=True)
    reader.start()
    with contextlib.suppress(OSError):
        proc.stdin.write(json.dumps(job).encode("utf-8"))
        proc.stdin.close()
    answers: dict[tuple[str, int], dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    error: dict[str, Any] | None = None
    done = False
    try:
        for raw in proc.stdout:
            try:
                message = protocol.decode(raw.decode("utf-8", errors="replace"))
            except protocol.ProtocolError:
                continue
            if message is None:
                continue
            kind = message.get("type")
            if kind == "answer":
                row = answers.setdefault((message["source"], message["i"]), {
                    "source": message["source"], "i": message["i"], "prompt": message["prompt"]})
                if "reference" in message:
                    row["reference"] = message["reference"]
                name = message["model"]
                row[name] = message["text"]
                for key in ("ttft_s", "tokens_per_s", "new_tokens", "scores"):
                    if key in message:
                        row[f"{name}_{key}"] = message[key]
            elif kind == "model_result":
                results[message["model"]] = {k: v for k, v in message.items() if k not in ("type", "model")}
            elif kind == "error":
                error = message
            elif kind == "done":
                done = True
                continue  # the command says when it is done: after the results are written
            if args.events and kind != "error":
                protocol.write_line(sys.stdout, protocol.encode(message))
            elif kind == "progress" and sys.stderr.isatty() and not args.json:
                print(f"\r{message['done']}/{message['total']}", end="", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        print("interrupted", file=sys.stderr)
        return 130
    code = proc.wait()
    reader.join(timeout=2)
    if error is not None or not done or code != 0:
        text = str((error or {}).get("message") or
                   f"the evaluation worker ended ({code}) without results: " + " | ".join(list(tail)[-3:]))
        kind = (error or {}).get("kind", "model_failed")
        print(f"gaudi-gui eval: {text}", file=sys.stderr)
        _emit(args.events, "error", kind=kind, message=text, exit_code=code, last_lines=list(tail)[-10:])
        return ev.EXIT_BAD_INPUT if kind == "bad_input" else ev.EXIT_MODEL_FAILED
    record = {"version": ev.RESULT_VERSION, "created": started, "duration_s": round(time.time() - started, 3),
              "label": target.label, "target": target.to_dict(), "spec": spec.to_dict(),
              "rows": {"prompts": len(job["prompts"]), "references": len(job["references"])},
              "base": results.get("base", {}), "tuned": results.get("tuned", {})}
    rows = sorted(answers.values(), key=lambda r: (r["source"] != "prompts", r["i"]))
    try:
        path = ev.write_results(target.results_dir, record, rows)
    except OSError as exc:
        print(f"gaudi-gui eval: cannot write the results in {target.results_dir}: {exc}", file=sys.stderr)
        _emit(args.events, "error", kind="model_failed", message=f"cannot write the results: {exc}")
        return ev.EXIT_MODEL_FAILED
    record["path"] = str(path)
    record["answers"] = str(path.with_name(path.stem + "-answers.jsonl"))
    _emit(args.events, "result", **record)
    try:
        if args.json:
            print(json.dumps(record, indent=2, ensure_ascii=False), flush=True)
        elif not args.events:
            _print_summary(record, rows)
            sys.stdout.flush()
    except BrokenPipeError:
        # A reader that stopped early (``| head``): the results are written; no traceback.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return ev.EXIT_OK


def _read_tail(stream: IO[bytes], tail: collections.deque[str]) -> None:
    for raw in stream:
        line = raw.decode("utf-8", errors="replace").rstrip("\n").rsplit("\r", 1)[-1]
        if line.strip():
            tail.append(textclean.clean(line))


def _print_summary(record: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    if sys.stderr.isatty():
        print(file=sys.stderr)
    for row in rows:
        print(f"[{row['source']} {row['i']}] {textclean.clean(row['prompt'])}")
        for name in ("base", "tuned"):
            print(f"  {name:5}: {textclean.clean(str(row.get(name, '')))!r}")
    print(f"{'score':24} {'base':>10} {'tuned':>10}")
    for name, tuned, base in ev.score_items(record):
        print(f"{name[:24]:24} {_cell(base):>10} {_cell(tuned):>10}")
    print(f"results: {record['path']}")


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _detach_on_host(args: argparse.Namespace, spec: ev.EvalSpec) -> int:
    """``eval --host DEST --detach``: the host's own ``eval --detach`` (its supervisor, run folder and
    results are the host's: the evaluation outlives this command and the connection)."""
    from gaudi_gui.commands.detach import detach_on_host, print_started
    from gaudi_gui.core.placement import Placement
    from gaudi_gui.core.remote import HostError
    try:
        host = Placement.from_cli(host=args.host, remote_command=args.remote_command).host
    except HostError as exc:
        return _refuse(args, "host", str(exc))
    info, why, code = detach_on_host(host, ["eval", *spec.cli_args()])
    if info is None:
        print(f"gaudi-gui eval: {why}", file=sys.stderr)
        return code
    print_started({**info, "host": host.name}, "evaluate", as_json=args.json)
    return ev.EXIT_OK


def _on_host(args: argparse.Namespace, spec: ev.EvalSpec) -> int:
    """The same command on a host (core.placement: ssh under the guard); its events are read here."""
    from gaudi_gui.core.placement import Placement
    from gaudi_gui.core.remote import HostError
    try:
        placement = Placement.from_cli(host=args.host, remote_command=args.remote_command)
    except HostError as exc:
        print(f"gaudi-gui eval: --host: {exc}", file=sys.stderr)
        return ev.EXIT_BAD_INPUT
    argv = placement.start_argv(placement.host, ["eval", *spec.cli_args(), "--events"], guard=True)
    # stdin stays open (a pipe never written): the guard ends the command there when it closes.
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tail: collections.deque[str] = collections.deque(maxlen=30)
    assert proc.stdout is not None and proc.stderr is not None
    reader = threading.Thread(target=_read_tail, args=(proc.stderr, tail), daemon=True)
    reader.start()
    record: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    try:
        for raw in proc.stdout:
            try:
                message = protocol.decode(raw.decode("utf-8", errors="replace"))
            except protocol.ProtocolError:
                continue
            if message is None:
                continue
            if message.get("type") == "result":
                record = {k: v for k, v in message.items() if k != "type"}
            elif message.get("type") == "error":
                error = message
            if args.events:
                protocol.write_line(sys.stdout, protocol.encode({**message, "host": placement.host.name}))
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]  # the guard ends the command there
        proc.terminate()
        proc.wait()
        print("interrupted", file=sys.stderr)
        return 130
    with contextlib.suppress(OSError):
        proc.stdin.close()  # type: ignore[union-attr]
    code = proc.wait()
    reader.join(timeout=2)
    if record is None:
        last = " | ".join(list(tail)[-3:])
        text = str((error or {}).get("message") or f"eval on {placement.host.name} ended ({code})" +
                   (f": {last}" if last else ""))
        field = str((error or {}).get("field") or "")
        if not args.events:
            print(f"gaudi-gui eval: {OPTION_OF[field] + ': ' if field in OPTION_OF else ''}{text}",
                  file=sys.stderr)
        return code if code in (ev.EXIT_BAD_INPUT, ev.EXIT_MODEL_FAILED) else ev.EXIT_MODEL_FAILED
    if args.json:
        print(json.dumps({**record, "host": placement.host.name}, indent=2, ensure_ascii=False))
    elif not args.events:
        for name, tuned, base in ev.score_items(record):
            print(f"{name[:24]:24} {_cell(base):>10} {_cell(tuned):>10}")
        print(f"results kept on {placement.host.name}: {record.get('path')}")
    return ev.EXIT_OK
