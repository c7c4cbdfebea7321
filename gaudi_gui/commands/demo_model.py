"""``gaudi-gui demo-model DIR``: write the offline demo model (built in a child process).

``--force`` replaces DIR only when DIR holds a demo model this command wrote: after a build it writes a
marker file (``MARKER``) listing every entry of the folder, and a forced rebuild refuses a folder
without a valid marker, or one holding anything the marker does not list (a user's own files), so it
can never delete what it did not create. DIR is always a path: a name that begins with ``-`` is passed
after ``--`` (``gaudi-gui demo-model -- -dir``) and handed to the worker as an absolute path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gaudi_gui.core import paths, protocol
from gaudi_gui.core.child import Child
from gaudi_gui.core.visibility import child_env


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo-model", help="build the offline demo model into a folder",
                       description="Build the tiny offline demo model (tokenizer + 2-layer Llama) "
                                   "into DIR (default: the user cache).")
    p.add_argument("dir", nargs="?", help=f"target folder (default: {paths.demo_model_dir()})")
    p.add_argument("--steps", type=int, default=300, help="pre-training steps on the demo corpus")
    p.add_argument("--force", action="store_true", help="rebuild even if DIR already holds a model")


#: Written into a folder this command built; names the folder's entries at that time.
MARKER = ".gaudi-gui-demo-model"
#: What the demo build itself writes (its info file): a folder holding it and nothing beyond the
#: Hugging Face files below was written by ``gaudi_gui.workers.demo`` (the cache copy, say).
_BUILD_INFO = "gaudi_gui_demo.json"
_HF_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                       "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                       _BUILD_INFO})


def write_marker(folder: Path) -> None:
    entries = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    (folder / MARKER).write_text(json.dumps({"written_by": "gaudi-gui demo-model", "entries": entries},
                                            indent=2) + "\n")


def why_not_replaceable(folder: Path) -> str | None:
    """None when ``--force`` may delete ``folder``; otherwise the reason it may not."""
    if not folder.exists():
        return None
    if folder.is_symlink() or not folder.is_dir():
        return f"{folder} is not a folder"
    entries = {p.name for p in folder.iterdir()}
    try:
        marker = json.loads((folder / MARKER).read_text())
        allowed = set(marker["entries"]) | {MARKER}
        if marker.get("written_by") != "gaudi-gui demo-model" or not all(
                isinstance(e, str) for e in allowed):
            raise ValueError("not our marker")
    except FileNotFoundError:
        if _BUILD_INFO not in entries:
            return (f"{folder} does not hold a demo model written by gaudi-gui (no {MARKER} "
                    f"or {_BUILD_INFO})")
        allowed = set(_HF_FILES)
    except (OSError, ValueError, KeyError, TypeError):
        return f"{folder / MARKER} is not a valid gaudi-gui marker"
    extra = sorted(entries - allowed)
    if extra:
        shown = ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else "")
        return f"{folder} holds files gaudi-gui did not write ({shown})"
    return None


def run(args: argparse.Namespace) -> int:
    if args.steps < 0:
        print("gaudi-gui: error: --steps must be >= 0", file=sys.stderr)
        return 2
    # An absolute path cannot be mistaken for an option by the worker's own parser.
    target = Path(os.path.abspath(args.dir)) if args.dir else paths.demo_model_dir()
    if args.force:
        reason = why_not_replaceable(target)
        if reason is not None:
            print(f"gaudi-gui: error: --force refused: {reason}; nothing was deleted. Remove it "
                  "yourself or choose another folder.", file=sys.stderr)
            return 1
    argv = [sys.executable, "-m", "gaudi_gui.workers.demo", "--steps", str(args.steps)]
    if args.force:
        argv.append("--force")
    argv += ["--", str(target)]

    def echo(line: str) -> None:
        print(line, file=sys.stderr)

    child = Child(argv, decode=protocol.decode, env=child_env(), stdin=False, echo=echo)
    try:
        return _follow(child)
    except KeyboardInterrupt:  # the child has a session of its own: Ctrl+C reached only us
        child.end(5.0)
        print("gaudi-gui: interrupted", file=sys.stderr)
        return 130


def _follow(child: Child) -> int:
    while (message := child.next_message(timeout=None)) is not None:
        if message["type"] == "demo_progress":
            print(f"pre-training step {message['step']}/{message['steps']}  loss {message['loss']:.3f}",
                  file=sys.stderr)
        elif message["type"] == "demo_done":
            done = Path(str(message["path"]))
            if done.is_dir() and not (done / MARKER).exists() and why_not_replaceable(done) is None:
                # Built now (or earlier by the demo recipe alone): mark it as ours for --force.
                try:
                    write_marker(done)
                except OSError as exc:
                    print(f"gaudi-gui: warning: could not write {done / MARKER}: {exc}", file=sys.stderr)
            print(message["path"])
    code = child.end(30.0)
    if code != 0:
        print(f"gaudi-gui: error: building the demo model failed (exit {code})", file=sys.stderr)
    return code
