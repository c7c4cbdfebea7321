"""The Slurm tests use the session's one test cluster (``slurm`` / ``slurm_cluster`` in tests/conftest.py,
shared with the Slurm scenarios of tests/scenarios) and, for the --login tests, the SSH server."""

from __future__ import annotations

from tests.remote.conftest import ssh_host  # noqa: F401 (the --login tests' SSH server)
