"""Files and facts of this machine, asked by a workstation: ``files.list`` (a folder's entries, or the
Hugging Face cache's models, for Browse), ``host.info`` (gaudi-gui's version and protocol, python,
hl-smi, the libraries' versions: what the Hosts tab shows), and the Models tab's ``models.list`` (the
Hub cache's models, revisions, sizes, last use, free space) and ``models.delete`` (one revision).

Forwarded with ``"host": X`` they run on X's agent, over X's one ssh session, instead of one ssh
session and one Python start per listing. The answers are the ones ``gaudi-gui ls --json``, ``gaudi-gui
hello --json`` and ``gaudi-gui models --json`` / ``--delete … --yes --json`` print (core.listing,
core.remote.host_info, core.hub). A folder or the cache is read in a worker thread of the agent's loop:
a slow disk (NFS) never holds other requests back. The cache is the agent's (its HF_HOME /
HF_HUB_CACHE): the one its downloads write to.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gaudi_gui.agent.server import Agent, Handler, Refused, Session
from gaudi_gui.core import hub, listing, remote

#: The longest revision (a commit, its prefix or a ref) ``models.delete`` takes.
MAX_REVISION = 255


class FilesService:
    name = "files"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        #: One deletion at a time: each reads the cache, then deletes what it read.
        self._deleting = asyncio.Lock()

    def ops(self) -> dict[str, Handler]:
        return {"files.list": self._list, "host.info": self._info, "models.list": self._models,
                "models.delete": self._delete}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def holds(self) -> list[str]:
        return []

    def busy(self) -> list[str]:
        return []

    def status(self) -> dict[str, Any]:
        return {}

    def subscribed(self, session: Session, ev: str, key: str | None) -> None:
        return None

    def session_gone(self, session: Session) -> None:
        return None

    async def _list(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        """``path`` (``~`` is this machine's home; default it) or, with ``hf_cache``, the Hub cache's
        models; Refused with one sentence when the folder cannot be read."""
        path = message.get("path", "~")
        if not isinstance(path, str):
            raise Refused("files.list: 'path' is a folder's path (text)")
        try:
            if message.get("hf_cache"):
                return await asyncio.to_thread(listing.list_hf_cache)
            return await asyncio.to_thread(listing.list_folder, path or "~")
        except listing.ListError as exc:
            raise Refused(str(exc)) from None

    async def _info(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        return {"info": await asyncio.to_thread(remote.host_info)}

    async def _models(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        """What ``gaudi-gui models --json`` prints: ``cache_dir``, ``size_on_disk``, ``models`` (each with
        its ``revisions``), ``incomplete_bytes``, ``warnings``, ``free_bytes``."""
        return await asyncio.to_thread(lambda: hub.list_cache().to_dict())

    async def _delete(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        """Delete one cached revision: ``repo_id`` (a Hub model id) and ``revision`` (a commit, its
        prefix or a ref) — both required, checked here; Refused with one sentence (no such model or
        revision, a prefix that matches two, a file that could not be removed)."""
        repo_id, revision = message.get("repo_id"), message.get("revision")
        if not isinstance(repo_id, str) or not repo_id.strip():
            raise Refused("models.delete: 'repo_id' is a Hub model id (org/name)")
        if not isinstance(revision, str) or not revision.strip():
            raise Refused("models.delete: 'revision' names the revision to delete (a commit, its prefix "
                          "or a ref)")
        if len(revision) > MAX_REVISION or revision.startswith("-") or "@" in revision \
                or not all(c.isprintable() and not c.isspace() for c in revision):
            raise Refused(f"models.delete: {revision[:80]!r} is not a commit or a ref")
        async with self._deleting:
            return await asyncio.to_thread(_delete_revision, repo_id, revision)


def _delete_revision(repo_id: str, revision: str) -> dict[str, Any]:
    """``gaudi-gui models --delete REPO_ID@REV --yes --json``'s work and answer (in a worker thread)."""
    bad = hub.check_repo_id(repo_id)
    if bad:
        raise Refused(f"models.delete: {bad}")
    try:
        plan = hub.deletion(f"{repo_id}@{revision}")
        plan.execute()
    except hub.HubProblem as problem:
        raise Refused(str(problem)) from None
    except OSError as exc:
        raise Refused(f"{repo_id} @ {revision[:12]} was not deleted entirely: {exc}") from None
    return {"deleted": True, "repo_id": plan.repo_id, "revisions": plan.revisions,
            "freed_bytes": plan.freed_bytes}


def make(agent: Agent) -> FilesService:
    return FilesService(agent)
