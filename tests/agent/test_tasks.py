"""``agent.tasks.end``: a task that lets one cancellation go (as Python 3.11's ``wait_for`` does when
its result arrives in the same instant) is still ended, and its hl-smi with it."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from gaudi_gui.agent import tasks


def test_a_task_that_drops_a_cancellation_is_ended_anyway() -> None:
    seen: list[str] = []

    async def reader() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)  # the first cancel is dropped, as wait_for dropped it
        seen.append("read on")
        while True:
            await asyncio.sleep(0.01)

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(reader())
        await asyncio.sleep(0.05)
        await asyncio.wait_for(tasks.end(task, every_s=0.1), 5)
        assert task.done() and task.cancelled()

    asyncio.run(main())
    assert seen == ["read on"]


def test_a_wait_for_reader_cancelled_as_its_line_arrives_ends_with_its_child() -> None:
    """The real shape: a child printing a line every 10 ms, read with ``wait_for``; cancelled many times
    at random instants, every reader ends and no child is left."""

    async def read(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while await asyncio.wait_for(proc.stdout.readline(), 5):
                pass
        finally:
            proc.kill()
            await proc.wait()

    async def main() -> None:
        code = "import sys, time\nwhile True:\n    print('x', flush=True)\n    time.sleep(0.01)"
        for i in range(5):
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code,
                                                        stdout=asyncio.subprocess.PIPE)
            task = asyncio.get_running_loop().create_task(read(proc))
            await asyncio.sleep(0.2 + i * 0.003)
            await asyncio.wait_for(tasks.end(task, every_s=0.1), 10)
            assert proc.returncode is not None

    asyncio.run(main())
