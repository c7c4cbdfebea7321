"""``gaudi-gui ls [PATH] [--json] [--hf-cache]``: a folder's entries, as the host sees them.

The Model runner's folder picker for a host runs this there (over ssh, argv quoted word by word) so
that model paths are the host's. ``PATH`` has ``~`` expanded on the host and defaults to the host
user's home. With ``--json`` the answer is one JSON object on one line::

    {"path": "/abs/folder", "parent": "/abs", "model": false, "truncated": false, "skipped": 0,
     "entries": [{"name": "llama", "is_dir": true, "size": 0, "model": true}, ...]}

Entries are sorted folders first, then by name. ``model`` says that a folder looks like a Hugging
Face model folder (it holds ``config.json``, or ``adapter_config.json`` for a PEFT adapter).
``--hf-cache`` lists the host's Hub cache instead (``models--ORG--NAME`` folders become Hub ids)::

    {"cache": "/home/u/.cache/huggingface/hub", "models": [{"id": "org/name", "path": "...",
     "size": 123}]}

A failure (no such folder, not a folder, permission denied) is one line on stderr and exit 1.
Qt-free and torch-free: it must answer fast on a host whose heavy libraries are not even installed.
"""

from __future__ import annotations

import argparse
import json
import sys

from gaudi_gui.core.listing import (
    MAX_ENTRIES,
    MODEL_MARKERS,
    ListError,
    hub_cache_dir,
    list_folder,
    list_hf_cache,
    looks_like_model,
)
from gaudi_gui.core.metrics import format_size

__all__ = ["MAX_ENTRIES", "MODEL_MARKERS", "ListError", "add_parser", "hub_cache_dir", "list_folder",
           "list_hf_cache", "looks_like_model", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="(for hosts) list a folder's entries, model folders marked")
    p.add_argument("path", nargs="?", default="~", metavar="PATH",
                   help="the folder (~ is expanded here; default: the home folder)")
    p.add_argument("--json", action="store_true", help="one JSON object (for the app's folder picker)")
    p.add_argument("--hf-cache", dest="hf_cache", action="store_true",
                   help="list the Hugging Face Hub cache's models (as Hub ids) instead of a folder")


def run(args: argparse.Namespace) -> int:
    if args.hf_cache:
        answer = list_hf_cache()
        if args.json:
            print(json.dumps(answer), flush=True)
        else:
            for model in answer["models"]:
                print(f"{model['id']}\t{format_size(model['size'])}")
        return 0
    try:
        answer = list_folder(args.path)
    except ListError as exc:
        print(f"gaudi-gui ls: {exc}", file=sys.stderr, flush=True)
        return 1
    if args.json:
        print(json.dumps(answer), flush=True)
        return 0
    for entry in answer["entries"]:
        mark = "/" if entry["is_dir"] else ""
        size = "" if entry["is_dir"] else f"  {format_size(entry['size'])}"
        note = "  (model)" if entry["model"] else size
        print(f"{entry['name']}{mark}{note}")
    return 0
