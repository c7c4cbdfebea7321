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
import os
import stat
import sys
from typing import Any

from gaudi_gui.core.metrics import format_size

#: Files whose presence makes a folder a Hugging Face model (or adapter) folder.
MODEL_MARKERS = ("config.json", "adapter_config.json")
#: At most this many entries are listed (a folder of a million files must not flood the pipe).
MAX_ENTRIES = 5000


class ListError(Exception):
    """A folder that cannot be listed; the message is the one line for stderr."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="(for hosts) list a folder's entries, model folders marked")
    p.add_argument("path", nargs="?", default="~", metavar="PATH",
                   help="the folder (~ is expanded here; default: the home folder)")
    p.add_argument("--json", action="store_true", help="one JSON object (for the app's folder picker)")
    p.add_argument("--hf-cache", dest="hf_cache", action="store_true",
                   help="list the Hugging Face Hub cache's models (as Hub ids) instead of a folder")


def looks_like_model(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, name)) for name in MODEL_MARKERS)


def _encodable(name: str) -> bool:
    # A name that is not valid UTF-8 (surrogate-escaped) cannot travel back as a path argument.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def list_folder(path: str, limit: int = MAX_ENTRIES) -> dict[str, Any]:
    """The folder's listing (see the module docstring); ListError when it cannot be read."""
    folder = os.path.abspath(os.path.expanduser(path or "~"))
    try:
        info = os.stat(folder)
    except FileNotFoundError:
        raise ListError(f"no such folder: {folder}") from None
    except PermissionError:
        raise ListError(f"permission denied: {folder}") from None
    except OSError as exc:
        raise ListError(f"cannot read {folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ListError(f"not a folder: {folder}")
    entries: list[dict[str, Any]] = []
    skipped = 0
    truncated = False
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if not _encodable(entry.name):
                    skipped += 1
                    continue
                if len(entries) >= limit:
                    truncated = True
                    break
                try:
                    is_dir = entry.is_dir()  # follows symlinks: a linked model folder is a folder
                    size = 0 if is_dir else entry.stat().st_size
                except OSError:
                    is_dir, size = False, 0  # a dangling link
                entries.append({"name": entry.name, "is_dir": is_dir, "size": size,
                                "model": is_dir and looks_like_model(entry.path)})
    except PermissionError:
        raise ListError(f"permission denied: {folder}") from None
    except OSError as exc:
        raise ListError(f"cannot read {folder}: {exc.strerror or exc}") from None
    entries.sort(key=lambda e: (not e["is_dir"], e["name"].lower(), e["name"]))
    return {"path": folder, "parent": os.path.dirname(folder), "model": looks_like_model(folder),
            "entries": entries, "truncated": truncated, "skipped": skipped}


def hub_cache_dir() -> str:
    """Where huggingface_hub keeps its cache on this machine, as huggingface_hub itself resolves it
    (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)."""
    from huggingface_hub import constants
    return str(constants.HF_HUB_CACHE)


def list_hf_cache(cache: str | None = None) -> dict[str, Any]:
    """The cached models as Hub ids, sorted, read by ``huggingface_hub.scan_cache_dir`` (the size is
    the blobs' bytes on disk); an absent cache is an empty list, not an error, and a damaged entry is
    named under ``problems`` instead of hiding the others."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound
    folder = cache or hub_cache_dir()
    try:
        info = scan_cache_dir(folder)
    except CacheNotFound:
        return {"cache": folder, "models": []}
    except OSError as exc:
        raise ListError(f"cannot read the Hugging Face cache {folder}: {exc.strerror or exc}") from None
    models = [{"id": repo.repo_id, "path": str(repo.repo_path), "size": int(repo.size_on_disk)}
              for repo in info.repos if repo.repo_type == "model" and _encodable(str(repo.repo_path))]
    models.sort(key=lambda m: str(m["id"]).lower())
    out: dict[str, Any] = {"cache": folder, "models": models}
    if info.warnings:
        out["problems"] = [str(w) for w in info.warnings]
    return out


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
