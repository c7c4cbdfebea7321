"""``gaudi-gui eval``: base vs tuned on the user's prompts, references scored, perplexity and lm-eval
tasks; the results kept with the run (``<run>/eval/<stamp>.json`` and ``<stamp>-answers.jsonl``).

The model work runs in ``gaudi_gui.workers.evaluate`` (a child); this command checks the input first
(``core.evaluation.validate``: exit 2 with the field and a sentence), hands the worker the rows, relays
its events (``--events``: protocol lines, what the app's Evaluate view follows), and writes the results.
Exit 0; 2 bad input (also an unknown lm-eval task, or one that needs the network: refused before a
model loads); 1 a model failed to load or run.

``--host DEST``: the host's own ``eval --detach`` (its supervisor and run folder are the host's: a dropped
connection or a killed client leaves it going), followed here with the one relay of placed output
(``remote_run.relay``) unless ``--detach``; the run, the files and the results are the host's, and the
results stay in the host's run folder (its path is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from gaudi_gui.commands.flags import add_detach_arguments
from gaudi_gui.core import evaluation as ev
from gaudi_gui.core import protocol, textclean
from gaudi_gui.core.child import Child
from gaudi_gui.core.events import EventType
from gaudi_gui.core.visibility import child_env

#: Options of the form fields (core.evaluation's field names) as the command line spells them.
OPTION_OF = {"run": "--run", "model": "--model", "adapter": "--adapter", "base": "--base",
             "prompts": "--prompt", "prompts_file": "--prompts", "data": "--data",
             "prompt_column": "--prompt-column", "reference_column": "--reference-column",
             "metrics": "--metrics", "tasks": "--tasks", "include_path": "--include-path",
             "max_rows": "--max-rows", "max_new_tokens": "--max-new-tokens", "chat": "--chat",
             "output": "--output", "fp8": "--fp8"}


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
    p.add_argument("--fp8", default="", metavar="RUN",
                   help="a calibrate run: compare --model quantized to FP8 with its measurements (INC) "
                        "with --model itself; refused when the run was calibrated for another machine, "
                        "INC or model")
    p.add_argument("--fp8-max-rise", dest="fp8_max_rise", type=_percent, default=ev.FP8_MAX_RISE_PCT,
                   metavar="PCT", help="with --fp8: warn when FP8 raises perplexity by more than PCT %% "
                                       f"(default {ev.FP8_MAX_RISE_PCT:g})")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--events", action="store_true",
                   help="print progress and results as protocol lines (what the app follows)")
    add_detach_arguments(p, "evaluate")
    from gaudi_gui.commands import client
    client.add_argument(p)

    def one_line_error(message: str) -> NoReturn:
        print(f"gaudi-gui eval: error: {message}", file=sys.stderr)
        sys.exit(ev.EXIT_BAD_INPUT)

    p.error = one_line_error


FP8_CPU_NOTE = ("gaudi-gui eval: note: FP8 on the CPU (INC's Q/DQ) checks the flow and the answers, not "
                "speed: it runs slower than bf16")


def spec_of(args: argparse.Namespace) -> ev.EvalSpec:
    return ev.EvalSpec(run=args.run, model=args.model, adapter=args.adapter, base=args.base,
                       prompts=list(args.prompt), prompts_file=args.prompts, data=args.data,
                       prompt_column=args.prompt_column, reference_column=args.reference_column,
                       metrics=[m.strip() for m in args.metrics.split(",") if m.strip()],
                       tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
                       include_path=args.include_path, max_rows=args.max_rows,
                       max_new_tokens=args.max_new_tokens, seed=args.seed, output=args.output,
                       chat=args.chat, fp8=args.fp8, fp8_max_rise=args.fp8_max_rise)


def _absolute(spec: ev.EvalSpec) -> ev.EvalSpec:
    """``spec`` with its local files and folders as absolute paths (a detached job may run elsewhere)."""
    import dataclasses
    fixed = {name: os.path.abspath(value) for name in ("prompts_file", "data", "include_path", "output")
             if (value := getattr(spec, name)) and os.path.exists(value)}
    if spec.run and os.path.isdir(spec.run):
        fixed["run"] = os.path.abspath(spec.run)
    if spec.fp8 and os.path.isdir(spec.fp8):
        fixed["fp8"] = os.path.abspath(spec.fp8)
    return dataclasses.replace(spec, **fixed)


def _inputs(spec: ev.EvalSpec) -> tuple[ev.Target, list[str], list[dict[str, str]]]:
    """The models the spec names, its prompts and its references (EvalInputError: the first thing
    wrong)."""
    target = ev.resolve(spec)
    prompts = list(spec.prompts)
    if spec.prompts_file:
        prompts += ev.read_prompts(spec.prompts_file, spec.prompt_column, spec.max_rows)
    references = ev.read_references(spec.data, spec.prompt_column, spec.reference_column,
                                    spec.max_rows) if spec.data else []
    return target, prompts[:spec.max_rows] if spec.max_rows else prompts, references


def _shown(args: argparse.Namespace) -> Callable[[dict[str, Any]], None]:
    """How a person sees the events of an evaluation the agent runs: its rows done (on a terminal) and,
    at the end, the answers and the score table this command prints in-process."""
    def show(event: dict[str, Any]) -> None:
        if event.get("type") == EventType.PROGRESS:
            _show_progress(event, args)
        elif event.get("type") == EventType.RESULT and event.get("path"):
            rows: list[dict[str, Any]] = []
            with contextlib.suppress(OSError, ValueError), \
                    open(str(event.get("answers") or ""), encoding="utf-8") as fh:
                rows = [json.loads(line) for line in fh if line.strip()]
            _print_summary(event, sorted(rows, key=lambda r: (r.get("source") != "prompts", r.get("i", 0))))
            sys.stdout.flush()
    return show


def _emit(events: bool, event_type: str, /, **fields: Any) -> None:
    if events:
        protocol.write_line(sys.stdout, protocol.encode({"type": event_type, **fields}))


def _refuse(args: argparse.Namespace, field: str, message: str) -> int:
    option = OPTION_OF.get(field, f"--{field.replace('_', '-')}")
    print(f"gaudi-gui eval: {option}: {message}", file=sys.stderr)
    _emit(args.events, EventType.ERROR, kind="bad_input", field=field, message=message)
    return ev.EXIT_BAD_INPUT


def run(args: argparse.Namespace) -> int:
    spec = spec_of(args)
    host = (getattr(args, "host", "") or "").strip()
    remote = bool(host and host != "local")
    problems = [] if remote else ev.validate(spec)
    if spec.fp8 and not remote and not problems:
        # Before anything starts: a calibration of another machine, INC or model is refused here.
        from gaudi_gui.core import fp8
        try:
            folder = fp8.find_run(spec.fp8)
            manifest, found = fp8.check(folder, model=spec.model)
        except fp8.Fp8Error as exc:
            return _refuse(args, "fp8", str(exc))
        if found:
            return _refuse(args, "fp8", fp8.check_line(spec.fp8, found).removeprefix(f"--fp8 {spec.fp8}: "))
        # One process (world size 1) reads only files without a rank suffix: N ranks wrote none.
        ranks = fp8.eval_ranks_refusal(spec.fp8, manifest)
        if ranks:
            return _refuse(args, "fp8", ranks.removeprefix(f"--fp8 {spec.fp8}: "))
        import dataclasses
        spec = dataclasses.replace(spec, fp8=str(folder.resolve()))
        if manifest.get("device") == "cpu":
            print(FP8_CPU_NOTE, file=sys.stderr)
    if problems:
        for field, message in problems[1:]:
            print(f"gaudi-gui eval: {OPTION_OF.get(field, field)}: {message}", file=sys.stderr)
        return _refuse(args, *problems[0])
    if args.detach and remote:
        started = _detach_on_host(args, spec)
        if isinstance(started, int):
            return started
        from gaudi_gui.commands.detach import print_started
        print_started(started[1], "eval", as_json=args.json)
        return ev.EXIT_OK
    if not remote:
        # What the files say is checked here, before a background job or the agent is asked.
        try:
            target, prompts, references = _inputs(spec)
        except ev.EvalInputError as exc:
            return _refuse(args, exc.field, str(exc))
    if args.detach:
        from gaudi_gui.commands.detach import detach_command
        words = _absolute(spec).cli_args()
        subject = os.path.basename(spec.run.rstrip("/")) or os.path.basename(spec.model.rstrip("/"))
        return detach_command("eval", "eval", words, name=f"eval-{subject or 'model'}",
                              runs_dir=args.runs_dir, as_json=args.json)
    if remote:
        return _on_host(args, spec)
    from gaudi_gui.commands import client
    if client.wanted(args):
        return client.run_job("eval", _absolute(spec).cli_args(), runs_dir=args.runs_dir, shown=_shown(args),
                              said=[FP8_CPU_NOTE])
    job = {"target": target.to_dict(), "prompts": prompts, "references": references,
           "metrics": spec.metrics, "tasks": spec.tasks, "include_path": spec.include_path,
           "max_rows": spec.max_rows, "max_new_tokens": spec.max_new_tokens, "seed": spec.seed,
           "chat": spec.chat, "fp8": spec.fp8}
    _emit(args.events, EventType.EVAL_STARTED, label=target.label, base=target.base_model,
          tuned=target.tuned_model, adapter=target.adapter, prompts=len(prompts),
          references=len(references), tasks=spec.tasks)
    return _evaluate(args, spec, target, job)


def _evaluate(args: argparse.Namespace, spec: ev.EvalSpec, target: ev.Target, job: dict[str, Any]) -> int:
    started = time.time()
    child = Child([sys.executable, "-m", "gaudi_gui.workers.evaluate"], decode=protocol.decode,
                  env=child_env(), tail_lines=30)
    child.send(json.dumps(job))
    child.close_stdin()
    answers: dict[tuple[str, int], dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    error: dict[str, Any] | None = None
    done = False
    try:
        while (message := child.next_message(None)) is not None:
            kind = message.get("type")
            if kind == EventType.ANSWER:
                row = answers.setdefault((message["source"], message["i"]), {
                    "source": message["source"], "i": message["i"], "prompt": message["prompt"]})
                if "reference" in message:
                    row["reference"] = message["reference"]
                name = message["model"]
                row[name] = message["text"]
                for key in ("ttft_s", "tokens_per_s", "new_tokens", "scores"):
                    if key in message:
                        row[f"{name}_{key}"] = message[key]
            elif kind == EventType.MODEL_RESULT:
                results[message["model"]] = {k: v for k, v in message.items() if k not in ("type", "model")}
            elif kind == EventType.ERROR:
                error = message
            elif kind == EventType.DONE:
                done = True
                continue  # the command says when it is done: after the results are written
            if args.events and kind != EventType.ERROR:
                protocol.write_line(sys.stdout, protocol.encode(message))
            elif kind == EventType.PROGRESS:
                _show_progress(message, args)
    except KeyboardInterrupt:
        child.end(5)
        print("interrupted", file=sys.stderr)
        return 130
    code = child.end(0)
    tail = [textclean.clean(line) for line in child.tail]
    if error is not None or not done or code != 0:
        text = str((error or {}).get("message") or
                   f"the evaluation worker ended ({code}) without results: " + " | ".join(tail[-3:]))
        kind = (error or {}).get("kind", "model_failed")
        print(f"gaudi-gui eval: {text}", file=sys.stderr)
        _emit(args.events, EventType.ERROR, kind=kind, message=text, exit_code=code, last_lines=tail[-10:])
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
        _emit(args.events, EventType.ERROR, kind="model_failed", message=f"cannot write the results: {exc}")
        return ev.EXIT_MODEL_FAILED
    record["path"] = str(path)
    record["answers"] = str(path.with_name(path.stem + "-answers.jsonl"))
    cost = ev.fp8_cost(record, args.fp8_max_rise)
    if cost:
        record["fp8_cost"] = cost
    _emit(args.events, EventType.RESULT, **record)
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


def _show_progress(message: dict[str, Any], args: argparse.Namespace) -> None:
    """Rows done, on a terminal's stderr (never into --json's output)."""
    if sys.stderr.isatty() and not args.json:
        print(f"\r{message.get('done')}/{message.get('total')}", end="", file=sys.stderr, flush=True)


def _print_summary(record: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    if sys.stderr.isatty():
        print(file=sys.stderr)
    for row in rows:
        print(f"[{row['source']} {row['i']}] {textclean.clean(row['prompt'])}")
        for name in ("base", "tuned"):
            print(f"  {name:5}: {textclean.clean(str(row.get(name, '')))!r}")
    _print_scores(record)
    if record.get("fp8_cost"):
        print(record["fp8_cost"])
    print(f"results: {record['path']}")


def _print_scores(record: dict[str, Any]) -> None:
    """The score table, or why there is none (a header over no rows said nothing)."""
    why = ev.no_scores_reason(record)
    if why:
        print(why)
        return
    print(f"{'score':24} {'base':>10} {'tuned':>10}")
    for name, tuned, base in ev.score_items(record):
        print(f"{name[:24]:24} {_cell(base):>10} {_cell(tuned):>10}")


def _percent(text: str) -> float:
    """``--fp8-max-rise``: a percentage, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a percentage, not {text!r}") from None
    if not (value >= 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"a percentage of 0 or more, not {text!r}")
    return value


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _detach_on_host(args: argparse.Namespace, spec: ev.EvalSpec) -> tuple[Any, dict[str, Any]] | int:
    """The host's own ``eval --detach`` (its supervisor, run folder and results are the host's: the
    evaluation outlives this command and the connection): (the host, its announce), or the exit code
    once the reason was said (bad input is refused there before anything starts, exit 2)."""
    from gaudi_gui.commands.detach import detach_on_host
    from gaudi_gui.core.placement import Placement
    from gaudi_gui.core.remote import HostError
    try:
        host = Placement.from_cli(host=args.host, remote_command=args.remote_command).host
    except HostError as exc:
        return _refuse(args, "host", str(exc))
    info, why, code = detach_on_host(host, ["eval", *spec.cli_args()])
    if info is None:
        print(f"gaudi-gui eval: {why}", file=sys.stderr)
        return ev.EXIT_BAD_INPUT if code == ev.EXIT_BAD_INPUT else ev.EXIT_MODEL_FAILED
    return host, {**info, "host": host.name}


def _on_host(args: argparse.Namespace, spec: ev.EvalSpec) -> int:
    """``eval --host DEST`` without ``--detach``: started there as ``--detach`` starts it, then followed
    here with the one relay of placed output (``remote_run.relay``: the host's ``runs follow``,
    reconnecting after a dropped connection while the evaluation goes on there). Ctrl-C stops it
    there (``runs stop``, exit 130); the results stay in the host's run folder (exit 0). A follow
    that gives up leaves it going there (exit 3: ``gaudi-gui runs --host DEST follow RUN``)."""
    from gaudi_gui.commands import remote_run

    try:
        started = _detach_on_host(args, spec)
    except KeyboardInterrupt:
        print(f"interrupted while starting on {args.host}: if it started there, `gaudi-gui runs --host "
              f"{args.host} list` shows it (runs stop ends it)", file=sys.stderr)
        return 130
    if isinstance(started, int):
        return started
    host, folder = started[0], str(started[1]["folder"])
    if not args.events and not args.json:
        print(f"evaluation folder on {host.name}: {folder} (it goes on if this command or the connection "
              f"ends)", file=sys.stderr, flush=True)
    run = remote_run.HostRun(host, 0, folder)
    said: dict[str, dict[str, Any]] = {}
    stop_sent: list[int] = []

    def take(_run: Any, msg: dict[str, Any]) -> None:
        if msg.get("t") == "reconnecting":
            print(f"gaudi-gui eval: {host.name}: {msg.get('why')}; reconnecting in {msg.get('in'):g} s (the "
                  f"evaluation goes on there)", file=sys.stderr, flush=True)
        if msg.get("t") != "event":
            return
        event = {k: v for k, v in (msg.get("event") or {}).items() if k not in ("v", "rank", "time")}
        kind = event.get("type")
        if kind in (EventType.RESULT, EventType.ERROR):
            said[str(kind)] = event
        if args.events:
            protocol.write_line(sys.stdout, protocol.encode({**event, "host": host.name}))
        elif kind == EventType.PROGRESS:
            _show_progress(event, args)

    def on_signal(count: int, name: str) -> None:
        stop_sent.append(count)
        print(f"\n{name}: stopping the evaluation on {host.name}" + (" now" if count > 1 else ""),
              file=sys.stderr, flush=True)
        threading.Thread(target=remote_run.stop_runs, args=([run], count > 1), daemon=True).start()

    remote_run.relay([run], take, reconnect_s=RECONNECT_S, on_signal=on_signal)
    record = {k: v for k, v in said.get(EventType.RESULT.value, {}).items() if k != "type"} or None
    if stop_sent and record is None:
        print("interrupted", file=sys.stderr)
        return 130
    if run.final is None:
        print(f"gaudi-gui eval: {run.lost}. The evaluation goes on on {host.name}: gaudi-gui runs --host "
              f"{host.name} follow {folder}", file=sys.stderr)
        return remote_run.EXIT_HOST
    if record is None:
        error = said.get(EventType.ERROR.value, {})
        text = str(error.get("message") or run.final.get("summary") or f"eval on {host.name} failed")
        field = str(error.get("field") or "")
        if not args.events:
            print(f"gaudi-gui eval: {OPTION_OF[field] + ': ' if field in OPTION_OF else ''}{text}",
                  file=sys.stderr)
        return ev.EXIT_BAD_INPUT if run.final.get("exit_code") == ev.EXIT_BAD_INPUT else ev.EXIT_MODEL_FAILED
    if args.json:
        print(json.dumps({**record, "host": host.name}, indent=2, ensure_ascii=False))
    elif not args.events:
        _print_scores(record)
        print(f"results kept on {host.name}: {record.get('path')}")
    return ev.EXIT_OK


#: How long the follow of an evaluation on a host tries to reach it again after the connection dropped.
RECONNECT_S = 600.0
