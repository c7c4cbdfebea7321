"""Qt test hygiene: after every test no child process, runner or worker thread may be left running."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gaudi_gui.core.training_args import Schema
from tests.slurm_cluster import SlurmCluster


@pytest.fixture(scope="session")
def real_schema(schema_json: Path) -> Schema:
    """The installed transformers' schema, from the real child once per run (never imported here)."""
    schema = Schema.from_dict(json.loads(schema_json.read_text()))
    assert len(schema.fields) > 100
    return schema


@pytest.fixture(autouse=True)
def no_leftovers(qapp, qtbot) -> Iterator[None]:
    threads_before = {t.ident for t in threading.enumerate()}
    yield
    # The daemons of the session's Slurm cluster (started by a test before this one, kept for the
    # session) are this process's children by design; the jobs they started are not.
    daemons = {pid for cluster in SlurmCluster.started for pid in cluster.daemon_pids()}
    from PySide6.QtCore import QThreadPool
    from pytestqt.exceptions import TimeoutError as pytestqt_timeout

    # Widgets are closed by qtbot; give their children a moment to be reaped (signal-driven).
    def settled() -> bool:
        return not [c for c in psutil.Process().children(recursive=True)
                    if c.pid not in daemons and c.status() != psutil.STATUS_ZOMBIE]

    try:
        qtbot.waitUntil(settled, timeout=30000)
    except (AssertionError, TimeoutError, pytestqt_timeout):
        kids = [(c.pid, c.cmdline()) for c in psutil.Process().children(recursive=True)
                if c.pid not in daemons]
        pytest.fail(f"test left processes running: children={kids}")
    assert QThreadPool.globalInstance().activeThreadCount() == 0, "a QThreadPool task is still running"
    leaked = [t for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()
              and not t.daemon]
    assert not leaked, f"test left threads running: {leaked}"
