"""A folder's entries and the Hugging Face cache's models, as this machine sees them: what ``gaudi-gui
ls`` prints and what the agent's ``files.list`` answers (so a host's Browse is answered by the host's
own agent, over its one ssh session).

Qt-free and torch-free: it must answer fast on a host whose heavy libraries are not even installed.
"""

from __future__ import annotations

import os
import stat
from typing import Any

#: Files whose presence makes a folder a Hugging Face model (or adapter) folder.
MODEL_MARKERS = ("config.json", "adapter_config.json")
#: At most this many entries are listed (a folder of a million files must not flood the pipe).
MAX_ENTRIES = 5000


class ListError(Exception):
    """A folder that cannot be listed; the message is the one line for stderr."""


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
