"""``gaudi-gui queue``: jobs that start by themselves when their cards are free (issue 29).

- ``queue add --config JOB [--kind train] [--cards N | --cards IDS] [--priority P] [--device D]``:
  queue a training job on this machine; ``queue add --kind serve|eval|download [--cards …] -- WORDS``:
  a job of that kind, WORDS being what ``gaudi-gui serve|eval|download … --detach`` takes (checked
  here by that command's own parser and checks; started by its own detached supervisor). Serve and
  eval wait for ``--cards`` like training (none: on the CPU); a download uses no cards. Each job
  (``--host DEST``: on that host, whose own queue process starts it)
  gets its own run folder and, unless the job names one, its own output folder when it starts. A job
  whose output folder is another queued job's is refused here, naming the folder.
- ``queue list [--json]``: position, state (queued / waiting for cards N,M / starting / started /
  ended), since when, why it waits, its run.
- ``queue remove ID``, ``queue move ID --before ID2``, ``queue pause``, ``queue resume``.
- ``queue stop ID``: a started job is stopped as ``runs stop`` stops any run (a checkpoint first).
- ``queue set --cpu-jobs N``: how many CPU jobs (training or evaluation on no cards) run at once
  (default 1; 0: no limit); the next ones wait their turn, saying for which job.
- ``queue run`` (hidden): the queue process itself (``core.queue_runner``), started on demand.

Every change is a request file the queue process applies (core/queue.py says why); this command
waits for its answer. Bad input: one line on stderr, exit 2. Qt-free, torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from gaudi_gui.commands.terminal import say as _say
from gaudi_gui.core import queue
from gaudi_gui.core.queue import CardRequest, QueueError

#: How ``queue list`` names a job's kind.
#: How long a change waits for the queue process's answer (it starts on demand: a Python start).
ANSWER_S = 60.0
EXIT_HOST = 3
#: Attempts of a host call that is safe to repeat (add with its client id, list).
HOST_ATTEMPTS = 3


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("queue", help="a queue of jobs on this machine (or a host) that start by themselves "
                                     "when their cards are free")
    actions = p.add_subparsers(dest="queue_action", metavar="ACTION", required=True,
                               parser_class=type(p))
    add = actions.add_parser("add", help="queue a job")
    add.add_argument("--config", default="", help="a training job's config JSON ('-': read it from stdin)")
    add.add_argument("--kind", default="train",
                     help="train (a --config job file), or serve, eval, download: the job is then that "
                          "command's own words after --, as its --detach takes them, e.g. "
                          "`queue add --kind eval --cards 2 -- --run RUN --prompt Hi`")
    add.add_argument("--cards", default="", metavar="N|IDS",
                     help="N: any N free healthy cards (the doctor picks, one of Intel's groups for 2 or 4); "
                          "IDS: those module ids, e.g. 2,3 (one card by id: 3,); default: no cards (CPU)")
    add.add_argument("--priority", type=int, default=0, help="higher starts first (default 0); equal "
                                                             "priorities start in the order they were added")
    add.add_argument("--device", default="auto", choices=("auto", "hpu", "cuda", "cpu"),
                     help="accelerator to launch for (default auto)")
    add.add_argument("--json", action="store_true", help="print the answer as JSON")
    # The requester's id of this add (a retry over ssh sends the same one: queued once).
    add.add_argument("--client-id", dest="client_id", default="", help=argparse.SUPPRESS)
    add.add_argument("words", nargs="*", metavar="-- WORDS",
                     help="with --kind serve|eval|download: that command's options (after --)")
    lst = actions.add_parser("list", help="the queue: position, state, since when, why waiting")
    lst.add_argument("--json", action="store_true", help="print it as JSON")
    rm = actions.add_parser("remove", help="take a job that has not started out of the queue")
    rm.add_argument("id", metavar="ID")
    mv = actions.add_parser("move", help="put a job before another (it takes that job's priority)")
    mv.add_argument("id", metavar="ID")
    mv.add_argument("--before", required=True, metavar="ID2")
    stop = actions.add_parser("stop", help="stop a started job as `runs stop` does (a checkpoint first)")
    stop.add_argument("id", metavar="ID")
    limits = actions.add_parser("set", help="the queue's settings: how many CPU jobs run at once")
    limits.add_argument("--cpu-jobs", dest="cpu_jobs", required=True, metavar="N",
                        help="training or evaluation jobs on no cards that run at once (default 1; "
                             "0: no limit); the next ones wait their turn")
    actions.add_parser("pause", help="start no more jobs until resume (running ones go on)")
    actions.add_parser("resume", help="start jobs again")
    for action in (add, lst, rm, mv, stop, limits, *(actions.choices[a] for a in ("pause", "resume"))):
        # --host after the action too (`queue add --host DEST ...`); SUPPRESS: not given here leaves
        # the one given before the action (`queue --host DEST add ...`, added by cli.py) as it was.
        action.add_argument("--host", default=argparse.SUPPRESS, metavar="DEST",
                            help="the host whose queue this is (an ssh destination); default: this machine")
        action.add_argument("--remote-command", dest="remote_command", default=argparse.SUPPRESS,
                            metavar="CMD", help="the command that runs gaudi-gui on the host")
    run = actions.add_parser("run", help=argparse.SUPPRESS)
    run.add_argument("--queue-dir", default="", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    action = args.queue_action
    target = (getattr(args, "host", "") or "").strip()
    if target and target != "local" and action != "run":
        return _on_host(args, target)
    if action == "run":
        from gaudi_gui.core import queue_runner
        return queue_runner.main(Path(args.queue_dir) if args.queue_dir else None)
    if action == "add":
        return _add(args)
    if action == "list":
        return _list(args)
    try:
        if action in ("remove", "stop"):
            reply = queue.request(action, entry=args.id, timeout_s=ANSWER_S)
        elif action == "set":
            try:
                limit = queue.cpu_jobs_value(args.cpu_jobs)
            except QueueError as exc:
                _say(f"gaudi-gui queue set: {exc}")
                return 2
            reply = queue.request("set", cpu_jobs=limit, timeout_s=ANSWER_S)
        elif action == "move":
            reply = queue.request("move", entry=args.id, before=args.before, timeout_s=ANSWER_S)
        else:
            reply = queue.request(action, timeout_s=ANSWER_S)
    except QueueError as exc:
        _say(f"gaudi-gui queue {action}: {exc}")
        return 1
    if not reply.get("ok"):
        _say(f"gaudi-gui queue {action}: {reply.get('message')}")
        return 2
    print(reply.get("message", "done"), flush=True)
    return 0


def kind_job(kind: str, words: list[str]) -> tuple[list[str], str]:
    """A serve / eval / download job's words as its ``--detach`` would pass them to its background
    command (parsed and checked by that command's own parser and checks, paths made absolute), and the
    run's name. QueueError, one line, for what that command would refuse."""
    what = queue.KIND_COMMAND[kind][0]
    parser = argparse.ArgumentParser(prog="gaudi-gui", add_help=False)
    sub = parser.add_subparsers(dest="command")
    if kind == "serve":
        from gaudi_gui.commands import serve as module
    elif kind == "eval":
        from gaudi_gui.commands import eval as module  # type: ignore[no-redef]
    else:
        from gaudi_gui.commands import download as module  # type: ignore[no-redef]
    module.add_parser(sub)
    own = {"--detach", "--json", "--events", "--runs-dir", "--host", "--remote-command", "--stop-orphan"}
    given = sorted({w.split("=", 1)[0] for w in words} & own)
    if given:
        raise QueueError(f"{', '.join(given)}: not in a queued {kind} job's words (the queue starts it "
                         f"detached, on this machine or the queue's host)")
    import contextlib
    import io
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args([what, *words])
    except SystemExit:
        text = err.getvalue().strip().splitlines()
        raise QueueError(f"{what}: {text[-1] if text else 'bad options'}") from None
    if kind == "serve":
        from gaudi_gui.core import serve as sv
        if args.cards:
            raise QueueError("serve --cards: give the cards to queue add (--cards N|IDS): the queue "
                             "starts the server on them")
        spec = sv.ServeSpec(model=args.model, engine=args.engine, port=args.port, device=args.device,
                            dtype=args.dtype, quantization=args.quantization, adapter=args.adapter,
                            max_model_len=args.max_model_len, api_key_env=args.api_key_env,
                            listen_all=args.listen_all)
        problems = spec.problems()
        if problems:
            raise QueueError("; ".join(f"serve --{f.replace('_', '-')}: {m}" for f, m in problems))
        return spec.cli_args(), f"serve-{Path(spec.model).name or 'model'}"
    if kind == "eval":
        import os

        from gaudi_gui.commands import eval as eval_cmd
        from gaudi_gui.core import evaluation as ev
        spec_ = eval_cmd.spec_of(args)
        problems = ev.validate(spec_)
        if problems:
            raise QueueError("; ".join(f"eval {eval_cmd.OPTION_OF.get(f, f)}: {m}" for f, m in problems))
        subject = os.path.basename(spec_.run.rstrip("/")) or os.path.basename(spec_.model.rstrip("/"))
        return eval_cmd._absolute(spec_).cli_args(), f"eval-{subject or 'model'}"
    from gaudi_gui.commands import download as download_cmd
    from gaudi_gui.core import hub
    bad = hub.check_repo_id(args.repo_id)
    if bad:
        raise QueueError(f"download: {bad}")
    return download_cmd.detached_words(args), f"download-{args.repo_id.rsplit('/', 1)[-1]}"


def _add_kind(args: argparse.Namespace, kind: str) -> int:
    if args.config:
        _say(f"gaudi-gui queue add: --config: a job file is a training job; a {kind} job is given as its "
             f"command's words after --")
        return 2
    try:
        cards = CardRequest.parse(args.cards)
        words, name = kind_job(kind, list(args.words))
        if kind == "serve" and not cards.none and any(w == "--device=cpu" for w in words):
            raise QueueError("--cards: a serve on --device cpu uses no cards")
        values = queue.kind_add_values(kind, words, name=name, cards=cards, priority=args.priority,
                                       added_by="cli", client_id=args.client_id)
    except (ValueError, QueueError) as exc:
        _say(f"gaudi-gui queue add: {exc}")
        return 2
    return _send_add(args, values)


def _add(args: argparse.Namespace) -> int:
    from gaudi_gui.core.jobconfig import JobConfigError, load_job
    try:
        kind = queue.kind_name(args.kind)
    except QueueError as exc:
        _say(f"gaudi-gui queue add: {exc}")
        return 2
    if kind != "train":
        return _add_kind(args, kind)
    if not args.config or args.words:
        _say("gaudi-gui queue add: --config JOB: a training job is given as a job file"
             + (f" (not as words: {' '.join(args.words)})" if args.words else ""))
        return 2
    try:
        cards = CardRequest.parse(args.cards)
        job = load_job(args.config)
        values = queue.add_values(job, kind=args.kind, cards=cards, priority=args.priority,
                                  device=args.device, added_by="cli", client_id=args.client_id)
    except (ValueError, JobConfigError, QueueError) as exc:
        _say(f"gaudi-gui queue add: {exc}")
        return 2
    return _send_add(args, values)


def _send_add(args: argparse.Namespace, values: dict[str, Any]) -> int:
    try:
        reply = queue.request("add", timeout_s=ANSWER_S, **values)
    except QueueError as exc:
        _say(f"gaudi-gui queue add: {exc}")
        return 1
    if not reply.get("ok"):
        _say(f"gaudi-gui queue add: {reply.get('message')}")
        return 2
    if args.json:
        print(json.dumps(reply), flush=True)
    else:
        print(f"{reply.get('message')}; see: gaudi-gui queue list", flush=True)
    return 0


def entry_json(entry: queue.Entry, position: int) -> dict[str, Any]:
    data = entry.to_dict()
    data.pop("job", None)
    data["position"] = position
    data["state_text"] = entry.state_text()
    data["cards"] = entry.cards.to_text()
    return data


def _list(args: argparse.Namespace) -> int:
    state = queue.read_state()
    if state.live() and not queue.runner_pid():
        # Jobs not ended and no queue process (the machine restarted, or it was killed): start it,
        # it reconciles with the run folders and goes on.
        queue.ensure_running()
        _say("gaudi-gui queue list: the queue process was not running: started again")
    positions = state.positions()
    now = time.time()
    if args.json:
        print(json.dumps({"paused": state.paused, "cpu_jobs": state.cpu_jobs,
                          "runner_pid": queue.runner_pid(), "problem": state.problem,
                          "entries": [entry_json(e, positions.get(e.id, 0)) for e in _shown(state)]}),
              flush=True)
        return 0
    if state.problem:
        _say(f"gaudi-gui queue list: {state.problem}")
    entries = _shown(state)
    if not entries:
        print("the queue is empty", flush=True)
        return 0
    if state.paused:
        print("the queue is paused (gaudi-gui queue resume starts jobs again)", flush=True)
    print(f"{queue.cpu_jobs_text(state.cpu_jobs)} (gaudi-gui queue set --cpu-jobs N)", flush=True)
    for e in entries:
        pos = str(positions[e.id]) if e.id in positions else "–"
        line = (f"{pos:>3}  {e.id:<5} {queue.KIND_TEXT.get(e.kind, e.kind):<10} {e.name[:24]:<24} "
                f"{e.state_text():<32} {queue.since_text(e.since, now):>9}")
        if e.priority:
            line += f"  priority {e.priority}"
        if e.run_name:
            line += f"  run {e.run_name}"
        if e.why:
            line += f"  — {e.why}"
        elif e.summary and e.state == "ended":
            line += f"  — {e.summary}"
        print(line, flush=True)
    return 0


def _shown(state: queue.QueueState) -> list[queue.Entry]:
    """Not started yet in their order first, then starting/started, then the ended (newest first)."""
    active = [e for e in state.entries if e.state in queue.ACTIVE]
    ended = sorted((e for e in state.entries if e.state == "ended"), key=lambda e: -e.ended_at)
    return [*state.pending(), *active, *ended]


def _on_host(args: argparse.Namespace, target: str) -> int:
    """The host's own queue: its ``gaudi-gui queue …`` over the system ssh client (each argument
    quoted for the remote shell by core.remote; the job travels on stdin, never on the command line)."""
    from gaudi_gui.core import remote
    from gaudi_gui.core.jobconfig import JobConfigError, load_job
    action = args.queue_action
    try:
        host = remote.find_host(target, getattr(args, "remote_command", "") or "")
    except remote.HostError as exc:
        _say(f"gaudi-gui queue {action}: --host: {exc}")
        return 2
    stdin: str | None = None
    argv = ["queue", action]
    if action == "add":
        try:
            CardRequest.parse(args.cards)
            kind = queue.kind_name(args.kind)
            if kind == "train":
                stdin = json.dumps(load_job(args.config).to_dict())
        except (ValueError, JobConfigError, QueueError) as exc:
            _say(f"gaudi-gui queue add: {exc}")
            return 2
        argv += ["--kind", kind, "--priority", str(args.priority),
                 "--device", args.device, "--client-id", args.client_id or uuid.uuid4().hex]
        if kind == "train":
            argv += ["--config", "-"]
        if args.cards.strip():
            argv += ["--cards", args.cards.strip()]
        if args.json:
            argv.append("--json")
        if kind != "train":
            # The kind's words are checked by the host's own queue add (its files, its models).
            argv += ["--", *args.words]
    elif action == "list" and args.json:
        argv.append("--json")
    elif action == "set":
        argv += ["--cpu-jobs", str(args.cpu_jobs)]
    elif action in ("remove", "move", "stop"):
        argv.append(args.id)
        if action == "move":
            argv += ["--before", args.before]
    # A host that did not answer, or a connection that dropped, is retried (bounded, said) for what
    # is safe to send again: list, and add (its client id makes a second add find the first's entry).
    attempts = HOST_ATTEMPTS if action in ("add", "list") else 1
    delay = 2.0
    for attempt in range(1, attempts + 1):
        try:
            code, out, err = remote.call(host, host.gaudi_gui_argv(*argv), input_text=stdin,
                                         timeout=ANSWER_S + 30)
            break
        except remote.RemoteError as exc:
            if exc.kind not in ("unreachable", "dropped") or attempt == attempts:
                _say(f"gaudi-gui queue {action}: {exc}"
                     + (f" (after {attempt} attempts)" if attempt > 1 else ""))
                return EXIT_HOST
            _say(f"gaudi-gui queue {action}: {exc}: retrying in {delay:g} s (attempt {attempt + 1} of "
                 f"{attempts})")
            time.sleep(delay)
            delay *= 2
    if out:
        sys.stdout.write(out)
        sys.stdout.flush()
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()
    return code
