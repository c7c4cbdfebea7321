"""The foreground ``train``/``serve``/``eval``/``download`` as clients of this machine's agent.

The command checks the job as it always did, then asks the agent (started on demand) to start it
(``job.start``: the kind's own ``--detach``, so the job has a run folder that ``runs list`` and the
window see, and it outlives this terminal), and follows its log and record to the end, printing the
console lines as they come. Ctrl-C (or SIGTERM, SIGHUP) asks the agent to stop it (a training run saves
a checkpoint first); a second one kills it. The exit status is the job's outcome.

``--no-agent`` (and ``GAUDI_GUI_NO_AGENT=1``, which it sets for its children) keeps the job in this
process as before: for debugging, and for Slurm batch steps (a step inside a Slurm job runs so by
itself). A command run by a supervisor (``--events``, ``--announce``) is the job itself and never asks.

For now the agent is asked only where ``GAUDI_GUI_CLI_AGENT=1`` says so: the command-line tests that
assert the in-process output (18 of test_download_cli, test_serve_cli, test_train_cli, test_eval_cli)
move to the new shape before it becomes the default.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from typing import Any

from gaudi_gui.commands.terminal import printable, say
from gaudi_gui.core.agentwire import AgentError, Connection
from gaudi_gui.core.runstore import FINAL_STATES

NO_AGENT_ENV = "GAUDI_GUI_NO_AGENT"
#: Foreground commands ask the agent only where this is "1" (until their tests moved; see above).
CLI_AGENT_ENV = "GAUDI_GUI_CLI_AGENT"
NO_AGENT_HELP = ("run the job in this process, not through this machine's agent (no run folder unless "
                 "--detach; for debugging and Slurm batch steps, which run so by themselves)")


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-agent", dest="no_agent", action="store_true", help=NO_AGENT_HELP)


def wanted(args: argparse.Namespace) -> bool:
    """Whether this foreground command goes through the agent; when not, its children are told so."""
    in_process = (getattr(args, "no_agent", False) or os.environ.get(NO_AGENT_ENV) == "1"
                  or os.environ.get("SLURM_JOB_ID") or getattr(args, "events", False)
                  or getattr(args, "announce", "") or getattr(args, "json", False)
                  or getattr(args, "detach", False) or getattr(args, "stop_orphan", False)
                  or (getattr(args, "host", "") or "").strip() not in ("", "local"))
    if getattr(args, "no_agent", False):
        os.environ[NO_AGENT_ENV] = "1"  # its children (the meter) keep to themselves too
    return os.environ.get(CLI_AGENT_ENV) == "1" and not in_process


def run_job(kind: str, words: list[str], *, config: dict[str, Any] | None = None, runs_dir: str = "") -> int:
    """Start the job through the agent and follow it to its end; its outcome as the exit status."""
    job: dict[str, Any] = {"args": words, **({"config": config} if config is not None else {})}
    try:
        conn = Connection.open(client="cli")
    except AgentError as exc:
        print(f"gaudi-gui {kind}: {exc} (or run it with --no-agent)", file=sys.stderr)
        return 1
    stops = [0]
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, _frame: object) -> None:
        stops[0] += 1

    with conn:
        try:
            reply = conn.request("job.start", timeout=300, kind=kind, job=job, runs_dir=runs_dir,
                                 cwd=os.getcwd(), env=dict(os.environ))
        except AgentError as exc:
            print(f"gaudi-gui {kind}: {exc}", file=sys.stderr)
            return 2
        for note in reply.get("notes") or []:
            print(note, file=sys.stderr, flush=True)
        record = reply["job"]
        job_id = record["job_id"]
        print(f"run folder: {record['folder']} (through the agent; `gaudi-gui runs stop {job_id}` stops it)",
              flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, on_signal)
        try:
            conn.request("subscribe", events=["log", "job"], key=job_id)
            asked = 0
            while True:
                if stops[0] > asked:
                    now = stops[0] > 1
                    asked = stops[0]
                    with contextlib.suppress(AgentError):
                        said = str(conn.request("job.stop", job_id=job_id, now=now)["words"])
                        say(f"{said} (Ctrl-C again: kill now)" if not now else said)
                for message in conn.stream(timeout=0.5):
                    if message.get("job_id") != job_id:
                        continue
                    if message.get("ev") == "log":
                        with contextlib.suppress(BrokenPipeError):
                            print("\n".join(printable(line) for line in message["lines"]), flush=True)
                    elif message.get("ev") == "job":
                        record = message["job"]
                        if record["state"] in FINAL_STATES and not record.get("alive"):
                            return _ended(kind, record)
                    if stops[0] > asked:
                        break
        except AgentError as exc:
            print(f"gaudi-gui {kind}: {exc}; the job goes on: gaudi-gui runs follow {job_id}",
                  file=sys.stderr)
            return 1
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def _ended(kind: str, record: dict[str, Any]) -> int:
    ok = record["state"] == "finished" or (kind == "serve" and record["state"] == "stopped")
    if ok:
        say(f"{record.get('summary') or record['state']}\nrun folder: {record['folder']}")
        return 0
    say(f"gaudi-gui {kind}: {record.get('summary') or record['state']}\nlog: {record['folder']}/log.txt")
    return 1


__all__ = ["NO_AGENT_ENV", "add_argument", "run_job", "wanted"]
