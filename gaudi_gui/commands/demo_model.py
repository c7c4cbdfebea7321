"""``gaudi-gui demo-model DIR``: write the offline demo model (built in a child process)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from gaudi_gui.core import paths, protocol
from gaudi_gui.core.visibility import child_env


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo-model", help="build the offline demo model into a folder",
                       description="Build the tiny offline demo model (tokenizer + 2-layer Llama) "
                                   "into DIR (default: the user cache).")
    p.add_argument("dir", nargs="?", help=f"target folder (default: {paths.demo_model_dir()})")
    p.add_argument("--steps", type=int, default=300, help="pre-training steps on the demo corpus")
    p.add_argument("--force", action="store_true", help="rebuild even if DIR already holds a model")


def run(args: argparse.Namespace) -> int:
    if args.steps < 0:
        print("gaudi-gui: error: --steps must be >= 0", file=sys.stderr)
        return 2
    argv = [sys.executable, "-m", "gaudi_gui.workers.demo", "--steps", str(args.steps)]
    if args.dir:
        argv.insert(3, args.dir)
    if args.force:
        argv.append("--force")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=child_env(),
                            errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        message = protocol.decode(line) if protocol.PREFIX in line else None
        if message is None:
            continue
        if message["type"] == "demo_progress":
            print(f"pre-training step {message['step']}/{message['steps']}  loss {message['loss']:.3f}",
                  file=sys.stderr)
        elif message["type"] == "demo_done":
            print(message["path"])
    code = proc.wait()
    if code != 0:
        print(f"gaudi-gui: error: building the demo model failed (exit {code})", file=sys.stderr)
    return code
