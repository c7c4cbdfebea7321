"""``gaudi-gui env [--json]``: the environment probe, printed (the same child the GUI runs)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from gaudi_gui.core import environment
from gaudi_gui.core.visibility import child_env


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="show versions and the device a job will use",
                       description="Probe the Python environment (torch, habana_frameworks, "
                                   "transformers, accelerate, peft, bitsandbytes) in a child process.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    proc = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.probe", "--json"],
                          capture_output=True, text=True, errors="replace", env=child_env())
    if proc.returncode != 0:
        print(f"gaudi-gui: error: the environment probe failed (exit {proc.returncode})\n"
              f"{proc.stderr[-2000:]}", file=sys.stderr)
        return 1
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        print(f"gaudi-gui: error: the probe printed no JSON:\n{proc.stdout[-2000:]}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2) if args.json else environment.as_text(info))
    return 0
