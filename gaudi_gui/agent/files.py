"""Files and facts of this machine, asked by a workstation: ``files.list`` (a folder's entries, or the
Hugging Face cache's models, for Browse) and ``host.info`` (gaudi-gui's version and protocol, python,
hl-smi, the libraries' versions: what the Hosts tab shows).

Forwarded with ``"host": X`` they run on X's agent, over X's one ssh session, instead of one ssh
session and one Python start per listing. The answers are the ones ``gaudi-gui ls --json`` and
``gaudi-gui hello --json`` print (core.listing, core.remote.host_info). A folder is read in a worker
thread of the agent's loop: a slow disk (NFS) never holds other requests back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gaudi_gui.agent.server import Agent, Handler, Refused, Session
from gaudi_gui.core import listing, remote


class FilesService:
    name = "files"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def ops(self) -> dict[str, Handler]:
        return {"files.list": self._list, "host.info": self._info}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

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


def make(agent: Agent) -> FilesService:
    return FilesService(agent)
