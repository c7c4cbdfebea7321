"""``gaudi-gui queue``: jobs that start by themselves when their cards are free (issue 29).

- ``queue add --config JOB [--kind train] [--cards N | --cards IDS] [--priority P] [--device D]``:
  queue a training job on this machine; ``queue add --kind serve|eval|download [--cards …] -- WORDS``:
  a job of that kind, WORDS being what ``gaudi-gui serve|eval|download … --detach`` takes (checked
  here by that command's own parser and checks; started by its own detached supervisor). Serve and
  eval wait for ``--cards`` like training (none: on the CPU); a download uses no cards. Each job
  (``--host DEST``: on that host, whose own agent checks and starts it) gets its own run folder and,
  unless the job names one, its own output folder when it starts. A job whose output folder is
  another queued job's is refused, naming the folder.
- ``queue list [--json]``: position, state (queued / waiting for cards N,M / starting / started /
  ended), since when, why it waits, its run.
- ``queue remove ID``, ``queue move ID --before ID2``, ``queue pause``, ``queue resume``.
- ``queue stop ID``: a started job is stopped as ``runs stop`` stops any run (a checkpoint first).
- ``queue set --cpu-jobs N``: how many CPU jobs (training or evaluation on no cards) run at once
  (default 1; 0: no limit); the next ones wait their turn, saying for which job.
- ``queue check --kind K -- WORDS`` (hidden): a serve / eval / download job's words checked by that
  command's own parser and checks, as JSON (what the agent of a host runs for an add that came from
  a workstation: the words name the host's files).

The queue is this machine's agent's (``agent/queue.py``, issue 38): this command is its client
(``Connection.open``: the agent is started when none runs), each action one request (``queue.add``,
``queue.list``, …); ``--host DEST`` sends it over the agent's one link to DEST's agent. Bad input: one
line on stderr, exit 2 (also a refusal by the queue); no agent: exit 1; a host not reached: exit 3.
Qt-free, torch-free.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any

from gaudi_gui.commands.terminal import say as _say
from gaudi_gui.core import queue
from gaudi_gui.core.agentwire import AgentError, Connection
from gaudi_gui.core.queue import CardRequest, QueueError

#: How long a request waits for the agent's answer (an add's check reads the job's files; a host's
#: agent may have to start first).
ANSWER_S = 120.0
EXIT_HOST = 3


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
    check = actions.add_parser("check", help=argparse.SUPPRESS)
    check.add_argument("--kind", required=True)
    check.add_argument("words", nargs="*")


class _Refused(Exception):
    """The queue (or the agent) refused: its words, exit 2."""


class _NoAgent(Exception):
    """No agent to ask (exit 1), or the host not reached (exit 3)."""

    def __init__(self, words: str, code: int) -> None:
        super().__init__(words)
        self.code = code


def run(args: argparse.Namespace) -> int:
    action = args.queue_action
    if action == "check":
        return _check(args)
    target = (getattr(args, "host", "") or "").strip()
    host = target if target and target != "local" else ""
    if host and (getattr(args, "remote_command", "") or "").strip():
        _say(f"gaudi-gui queue {action}: --remote-command: the agent reaches {host} with its saved remote "
             f"command (save it: gaudi-gui hosts add {host} --remote-command CMD)")
        return 2
    try:
        if action == "add":
            values = _add_values(args, host)
            if isinstance(values, int):
                return values
            return _print_add(args, _ask("add", host, **values))
        if action == "list":
            return _print_list(args, _ask("list", host))
        if action == "set":
            try:
                limit = queue.cpu_jobs_value(args.cpu_jobs)
            except QueueError as exc:
                _say(f"gaudi-gui queue set: {exc}")
                return 2
            reply = _ask("set", host, cpu_jobs=limit)
        elif action in ("remove", "stop"):
            reply = _ask(action, host, entry=args.id)
        elif action == "move":
            reply = _ask("move", host, entry=args.id, before=args.before)
        else:
            reply = _ask(action, host)
    except _Refused as exc:
        _say(f"gaudi-gui queue {action}: {exc}")
        return 2
    except _NoAgent as exc:
        _say(f"gaudi-gui queue {action}: {exc}")
        return exc.code
    print(reply.get("message", "done"), flush=True)
    return 0


def _ask(action: str, host: str, **values: Any) -> dict[str, Any]:
    """One request to this machine's agent (started when none runs), or through it to ``host``'s."""
    try:
        conn = Connection.open(client="cli")
    except AgentError as exc:
        raise _NoAgent(str(exc), 1) from None
    with conn:
        if host:
            try:
                conn.request("hosts.connect", host=host, timeout=ANSWER_S)
            except AgentError as exc:
                raise _NoAgent(str(exc), EXIT_HOST) from None
        try:
            where = {"host": host} if host else {}
            return conn.request(f"queue.{action}", timeout=ANSWER_S, **values, **where)
        except AgentError as exc:
            words = str(exc)
            if host and words.startswith(f"{host}: "):
                words = words[len(host) + 2:]
            raise _Refused(words) from None


def _check(args: argparse.Namespace) -> int:
    """``queue check``: the words as the queue keeps them and the job's name, as JSON; exit 2 and one
    line when that command would refuse them."""
    try:
        kind = queue.kind_name(args.kind)
        if kind == "train":
            raise QueueError("--kind train: give the job with --config")
        words, name = kind_job(kind, list(args.words))
    except QueueError as exc:
        _say(f"gaudi-gui queue add: {exc}")
        return 2
    print(json.dumps({"words": words, "name": name}), flush=True)
    return 0


def kind_job(kind: str, words: list[str]) -> tuple[list[str], str]:
    """A serve / eval / calibrate / benchmark / download job's words as its ``--detach`` would pass them
    to its background command (parsed and checked by that command's own parser and checks, paths made
    absolute), and the run's name. QueueError, one line, for what that command would refuse."""
    what = queue.KIND_COMMAND[kind][0]
    parser = argparse.ArgumentParser(prog="gaudi-gui", add_help=False)
    sub = parser.add_subparsers(dest="command")
    if kind == "serve":
        from gaudi_gui.commands import serve as module
    elif kind == "eval":
        from gaudi_gui.commands import eval as module  # type: ignore[no-redef]
    elif kind == "calibrate":
        from gaudi_gui.commands import calibrate as module  # type: ignore[no-redef]
    elif kind == "benchmark":
        from gaudi_gui.commands import benchmark as module  # type: ignore[no-redef]
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
    if kind in ("calibrate", "benchmark") and args.cards:
        raise QueueError(f"{what} --cards: give the cards to queue add (--cards N|IDS): the queue "
                         f"starts it on them")
    if kind in ("calibrate", "benchmark"):
        from gaudi_gui.core import benchmark as bm
        from gaudi_gui.core import fp8
        if kind == "benchmark" and args.show:
            raise QueueError("benchmark --show: reads a finished run, nothing to queue")
        try:
            return module.queued(args)  # type: ignore[attr-defined]
        except (fp8.Fp8Error, bm.BenchmarkInputError) as exc:
            raise QueueError(f"{kind}: {exc}") from None
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


def _add_values(args: argparse.Namespace, host: str) -> dict[str, Any] | int:
    """The ``queue.add`` request's values, after the checks that need no machine's files (bad usage:
    one line, exit 2). A training job travels as its JSON (read here: the file is this machine's);
    a serve / eval / download job as its words: checked here by that command's own parser for this
    machine's queue, and by the host's agent (its files) for a host's."""
    try:
        kind = queue.kind_name(args.kind)
        cards = CardRequest.parse(args.cards)
    except (ValueError, QueueError) as exc:
        _say(f"gaudi-gui queue add: {exc}")
        return 2
    common = {"kind": kind, "cards": cards.to_text(), "priority": args.priority, "added_by": "cli",
              "client_id": args.client_id or uuid.uuid4().hex}
    if kind != "train":
        if args.config:
            _say(f"gaudi-gui queue add: --config: a job file is a training job; a {kind} job is given as "
                 f"its command's words after --")
            return 2
        if not cards.none and kind not in queue.CARD_KINDS:
            _say(f"gaudi-gui queue add: --cards: a {kind} uses no cards")
            return 2
        if host:
            return {**common, "words": list(args.words)}
        try:
            words, name = kind_job(kind, list(args.words))
        except QueueError as exc:
            _say(f"gaudi-gui queue add: {exc}")
            return 2
        return {**common, "words": words, "name": name, "checked": True}
    if not args.config or args.words:
        _say("gaudi-gui queue add: --config JOB: a training job is given as a job file"
             + (f" (not as words: {' '.join(args.words)})" if args.words else ""))
        return 2
    from gaudi_gui.core.jobconfig import JobConfigError, load_job
    try:
        job = load_job(args.config)
    except JobConfigError as exc:
        _say(f"gaudi-gui queue add: {exc}")
        return 2
    return {**common, "config": job.to_dict(), "device": args.device}


def _print_add(args: argparse.Namespace, reply: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps({k: v for k, v in reply.items() if k not in ("v", "re")}), flush=True)
    else:
        print(f"{reply.get('message')}; see: gaudi-gui queue list", flush=True)
    return 0


def _print_list(args: argparse.Namespace, reply: dict[str, Any]) -> int:
    state = queue.state_of(reply)
    if args.json:
        print(json.dumps({"paused": state.paused, "cpu_jobs": state.cpu_jobs, "agent_pid": state.pid,
                          "problem": state.problem, "entries": _ordered_entries(reply, state)}), flush=True)
        return 0
    if state.problem:
        _say(f"gaudi-gui queue list: {state.problem}")
    positions = state.positions()
    now = time.time()
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


def _ordered_entries(reply: dict[str, Any], state: queue.QueueState) -> list[dict[str, Any]]:
    """The reply's entries (as the wire has them: position, state_text, cards) in ``_shown``'s order."""
    by_id = {str(e.get("id")): e for e in reply.get("entries") or [] if isinstance(e, dict)}
    return [by_id[e.id] for e in _shown(state) if e.id in by_id]


def _shown(state: queue.QueueState) -> list[queue.Entry]:
    """Not started yet in their order first, then starting/started, then the ended (newest first)."""
    active = [e for e in state.entries if e.state in queue.ACTIVE]
    ended = sorted((e for e in state.entries if e.state == "ended"), key=lambda e: -e.ended_at)
    return [*state.pending(), *active, *ended]
