"""The scenarios run at every placement, so every placement's fixtures are reachable here: the SSH
server of tests/remote (``ssh_host``; its second alias makes two hosts) and the session's Slurm test
cluster (``slurm``, defined once in tests/conftest.py). A scenario asks for a placement's fixture with
``request.getfixturevalue``, so each parameter starts only what it needs. After every scenario, the
Qt hygiene of tests/qt (no runner, child process or worker thread left)."""

from __future__ import annotations

from tests.qt.conftest import no_leftovers  # noqa: F401 (autouse: nothing left running)
from tests.remote.conftest import ssh_host  # noqa: F401 (a host, and two hosts, over SSH)
