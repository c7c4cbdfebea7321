"""Ending an asyncio task for sure.

Python 3.11's ``asyncio.wait_for`` returns the awaited result and drops a cancellation that arrives
as that result does (fixed in 3.12, where it is built on ``asyncio.timeout``). A device loop reading
one hl-smi line a second was cancelled in the same instant its line arrived: it read on, the
``await task`` that ended it waited for ever, and its hl-smi outlived every listener (a full CI run,
on a host's agent). ``end`` cancels again until the task is done.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def end(task: asyncio.Task[Any] | None, *, every_s: float = 0.5) -> None:
    """Cancel ``task`` and wait until it is done, cancelling again every ``every_s`` while it runs on;
    its outcome (a result, CancelledError, an exception) is taken and dropped."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()
